// The IR Node type of lazy_core/ir.py (which documents it), and the graph cut's walk (graph.py's
// cut_graph says what it returns).
#include "native.h"

#include <cstdio>
#include <unordered_map>
#include <vector>

namespace lazy_native {

// ----------------------------------------------------------------------------------------------
// Node.

PyObject* current_site = Py_None;  // the user site new nodes are attributed to (attribute_to)


PyTypeObject NodeType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// Whether no reference cycle can run through ``v``: objects the cycle collector does not track
// (numbers, strings, nodes), and tuples of such values, Operand markers (tuple subclasses without
// a __dict__) included. Each exact tuple found acyclic on the way is left out of the collector.
bool untrack_acyclic(PyObject* v, int depth = 0) {
    if (!PyObject_IS_GC(v)) return true;
    if (!PyTuple_Check(v) || depth > 16) return false;
    bool exact = PyTuple_CheckExact(v);
    if (!exact && Py_TYPE(v)->tp_dictoffset != 0) return false;
    bool acyclic = true;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++)
        acyclic = untrack_acyclic(PyTuple_GET_ITEM(v, i), depth + 1) && acyclic;
    if (acyclic && exact && PyObject_GC_IsTracked(v)) PyObject_GC_UnTrack(v);
    return acyclic;
}

// A node of argv's (op, src, arg, dtype, shape) and ``payload``; its digest absorbs ``arg``'s
// digest, given or computed here.
unsigned long long nodes_made = 0;

PyObject* make_node(PyTypeObject* type, PyObject* const* argv, PyObject* payload,
                    const Digest* arg_digest) {
    PyObject* src = argv[1];
    if (!PyTuple_Check(src)) {
        PyErr_SetString(PyExc_TypeError, "Node: src must be a tuple of Nodes");
        return nullptr;
    }
    Digest arg_d;
    if (arg_digest == nullptr) {
        if (!digest_of(argv[2], arg_d)) return nullptr;
        arg_digest = &arg_d;
    }
    Hasher h;
    h.add(TAG_NODE);
    if (!absorb(h, argv[0])) return nullptr;
    h.add(arg_digest->lo);
    h.add(arg_digest->hi);
    if (!absorb(h, argv[3]) || !absorb(h, argv[4])) return nullptr;
    h.add((uint64_t)PyTuple_GET_SIZE(src));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(src); i++) {
        PyObject* s = PyTuple_GET_ITEM(src, i);
        if (!PyObject_TypeCheck(s, &NodeType)) {
            PyErr_SetString(PyExc_TypeError, "Node: src must be a tuple of Nodes");
            return nullptr;
        }
        h.add(((NodeObject*)s)->digest.lo);
        h.add(((NodeObject*)s)->digest.hi);
    }
    NodeObject* self = PyObject_New(NodeObject, type);
    if (self == nullptr) return nullptr;
    self->seq = ++nodes_made;
    PyObject** fields[7] = {&self->op, &self->src, &self->arg, &self->dtype, &self->shape,
                            &self->payload, &self->site};
    PyObject* values[7] = {argv[0], src, argv[2], argv[3], argv[4], payload, current_site};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    self->digest = h.done();
    self->hash = (Py_hash_t)self->digest.lo == -1 ? -2 : (Py_hash_t)self->digest.lo;
    self->weakrefs = nullptr;
    self->walk = 0;
    self->position = -1;
    untrack_acyclic(self->src);
    untrack_acyclic(self->arg);
    return (PyObject*)self;
}

PyObject* node_of(PyObject* const* argv, const Digest& arg_digest) {
    return make_node(&NodeType, argv, Py_None, &arg_digest);
}

PyObject* node_new(PyTypeObject* type, PyObject* const* argv, size_t nargsf, PyObject* kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject* payload = Py_None;
    if (kwnames != nullptr) {
        Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
        if (nk == 1 && nargs == 5 &&
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "payload") == 0) {
            payload = argv[5];
        } else {
            PyErr_SetString(PyExc_TypeError, "Node(op, src, arg, dtype, shape, payload=None)");
            return nullptr;
        }
    } else if (nargs == 6) {
        payload = argv[5];
    } else if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "Node(op, src, arg, dtype, shape, payload=None)");
        return nullptr;
    }
    return make_node(type, argv, payload, nullptr);
}

PyObject* node_tp_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    // The slow entry (subclasses, ``Node.__new__``); calls go through node_new.
    Ref kwnames;
    std::vector<PyObject*> argv(PyTuple_GET_SIZE(args));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) argv[i] = PyTuple_GET_ITEM(args, i);
    if (kwargs != nullptr && PyDict_GET_SIZE(kwargs)) {
        kwnames.p = PyTuple_New(PyDict_GET_SIZE(kwargs));
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            Py_INCREF(k);
            PyTuple_SET_ITEM(kwnames.p, i++, k);
            argv.push_back(v);
        }
    }
    return node_new(type, argv.data(), PyTuple_GET_SIZE(args), kwnames.p);
}

PyObject* node_vectorcall(PyObject* type, PyObject* const* argv, size_t nargsf, PyObject* kw) {
    return node_new((PyTypeObject*)type, argv, nargsf, kw);
}

// Nodes form a DAG (a node's sources are older nodes), so no reference cycle runs through one:
// the type is not tracked by the cycle collector, and neither are the tuples of sources and
// templates it holds (untrack_acyclic). Otherwise the thousands of nodes a step records survive into
// the oldest generation, whose full collections over a large program's heap (half a million
// objects with transformers) take hundreds of milliseconds every few steps. Freeing a long chain
// of nodes is iterative: a node whose last reference goes while another is being freed waits in
// ``doomed`` instead of adding a C frame.
std::vector<NodeObject*> doomed;
bool freeing = false;

void node_free(NodeObject* self) {
    Py_CLEAR(self->op);
    Py_CLEAR(self->src);
    Py_CLEAR(self->arg);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->payload);
    Py_CLEAR(self->site);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

void node_dealloc(NodeObject* self) {
    if (self->weakrefs != nullptr) PyObject_ClearWeakRefs((PyObject*)self);
    if (freeing) {
        doomed.push_back(self);
        return;
    }
    freeing = true;
    node_free(self);
    while (!doomed.empty()) {
        NodeObject* next = doomed.back();
        doomed.pop_back();
        node_free(next);
    }
    freeing = false;
}

PyObject* node_num_outputs(NodeObject* self, void*) {
    return PyLong_FromSsize_t(PyTuple_Check(self->dtype) ? PyTuple_GET_SIZE(self->dtype) : 1);
}

PyObject* node_digest(NodeObject* self, void*) { return digest_int(self->digest); }

PyObject* node_repr(NodeObject* self) {
    Ref shape(PySequence_List(self->shape));
    if (!shape) return nullptr;
    char digest[16];
    snprintf(digest, sizeof digest, "%08lx", (unsigned long)((Py_uhash_t)self->hash & 0xFFFFFFFFUL));
    return PyUnicode_FromFormat("Node(%S, %S%R, #%s)", self->op, self->dtype, shape.p, digest);
}

PyMemberDef node_members[] = {
    {"op", T_OBJECT_EX, offsetof(NodeObject, op), 0, nullptr},
    {"src", T_OBJECT_EX, offsetof(NodeObject, src), 0, nullptr},
    {"arg", T_OBJECT_EX, offsetof(NodeObject, arg), 0, nullptr},
    {"dtype", T_OBJECT_EX, offsetof(NodeObject, dtype), 0, nullptr},
    {"shape", T_OBJECT_EX, offsetof(NodeObject, shape), 0, nullptr},
    {"payload", T_OBJECT_EX, offsetof(NodeObject, payload), 0, nullptr},
    {"site", T_OBJECT_EX, offsetof(NodeObject, site), 0, nullptr},
    {"hash", T_PYSSIZET, offsetof(NodeObject, hash), 0, nullptr},
    {"seq", T_ULONGLONG, offsetof(NodeObject, seq), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef node_getset[] = {
    {"num_outputs", (getter)node_num_outputs, nullptr, nullptr, nullptr},
    {"digest", (getter)node_digest, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyObject* attribute_to(PyObject*, PyObject* site) {
    PyObject* previous = current_site;  // the reference passes to the caller
    Py_INCREF(site);
    current_site = site;
    return previous;
}

PyObject* get_current_site(PyObject*, PyObject*) {
    Py_INCREF(current_site);
    return current_site;
}

// ----------------------------------------------------------------------------------------------
// The graph cut's walk (lazy_core/graph.py: _walk, which it mirrors): post-order from the roots,
// parameters by first use, and the structure's digest: the roots' digests and the wiring that
// tells apart graphs whose nodes digest alike.


unsigned long long walks = 0;  // numbers the walks; a node's ``walk`` says which reached it

PyObject* walk(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "walk(roots: tuple, data_op, scalar_op)");
        return nullptr;
    }
    PyObject* roots = argv[0];
    PyObject* data_op = argv[1];
    PyObject* scalar_op = argv[2];
    const unsigned long long epoch = ++walks;
    auto is = [](PyObject* a, PyObject* b) -> int {
        return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ);
    };
    auto as_node = [](PyObject* o) -> NodeObject* {
        if (!PyObject_TypeCheck(o, &NodeType) || ((NodeObject*)o)->src == nullptr ||
            !PyTuple_Check(((NodeObject*)o)->src) || ((NodeObject*)o)->op == nullptr) {
            PyErr_SetString(PyExc_TypeError, "walk: the graph holds something that is not a Node");
            return nullptr;
        }
        return (NodeObject*)o;
    };
    Ref order(PyList_New(0)), params(PyList_New(0));
    if (!order || !params) return nullptr;
    std::vector<Py_ssize_t> wiring;
    std::unordered_map<PyObject*, Py_ssize_t> param_pos;  // borrowed: the roots keep them alive
    struct Frame {
        NodeObject* node;
        Py_ssize_t i;
    };
    std::vector<Frame> stack;
    auto push = [&](NodeObject* node) {
        node->walk = epoch;
        node->position = -1;
        stack.push_back({node, 0});
    };
    for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(roots); r++) {
        NodeObject* root = as_node(PyTuple_GET_ITEM(roots, r));
        if (root == nullptr) return nullptr;
        if (root->walk == epoch) {
            wiring.push_back(-2 - root->position);
            continue;
        }
        push(root);
        while (!stack.empty()) {
            Frame& top = stack.back();
            if (top.i < PyTuple_GET_SIZE(top.node->src)) {
                NodeObject* child = as_node(PyTuple_GET_ITEM(top.node->src, top.i++));
                if (child == nullptr) return nullptr;
                if (child->walk != epoch) {
                    push(child);
                } else {
                    wiring.push_back(-2 - child->position);
                }
                continue;
            }
            NodeObject* node = top.node;
            stack.pop_back();
            node->position = PyList_GET_SIZE(order.p);
            if (PyList_Append(order.p, (PyObject*)node) < 0) return nullptr;
            int data = is(node->op, data_op);
            int scalar = data ? 0 : is(node->op, scalar_op);
            if (data < 0 || scalar < 0) return nullptr;
            if (data || scalar) {
                // Two leaves of one device buffer are one parameter.
                PyObject* ident = data ? node->payload : (PyObject*)node;
                auto p = param_pos.find(ident);
                if (p == param_pos.end()) {
                    p = param_pos.emplace(ident, PyList_GET_SIZE(params.p)).first;
                    if (PyList_Append(params.p, (PyObject*)node) < 0) return nullptr;
                }
                wiring.push_back(p->second);
            }
        }
    }
    // The structure enters only the graph key: the roots' digests, the wiring, the node count.
    Hasher h;
    h.add(TAG_GRAPH);
    h.add((uint64_t)PyTuple_GET_SIZE(roots));
    for (Py_ssize_t r = 0; r < PyTuple_GET_SIZE(roots); r++) {
        const Digest& d = ((NodeObject*)PyTuple_GET_ITEM(roots, r))->digest;
        h.add(d.lo);
        h.add(d.hi);
    }
    h.add((uint64_t)wiring.size());
    for (Py_ssize_t w : wiring) h.add((uint64_t)w);
    h.add((uint64_t)PyList_GET_SIZE(order.p));
    Ref structure(digest_int(h.done()));
    if (!structure) return nullptr;
    Ref order_t(PyList_AsTuple(order.p)), params_t(PyList_AsTuple(params.p));
    if (!order_t || !params_t) return nullptr;
    return PyTuple_Pack(3, order_t.p, params_t.p, structure.p);
}

PyMethodDef node_methods[] = {
    {"attribute_to", (PyCFunction)attribute_to, METH_O,
     "Attribute nodes created from now on to a site; returns the previous one."},
    {"current_site", (PyCFunction)get_current_site, METH_NOARGS, "The site of new nodes."},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(roots, data_op, scalar_op) -> (post-order, parameters, structure digest); graph.py."},
    {nullptr, nullptr, 0, nullptr}};

bool add_type(PyObject* module, PyTypeObject* type, const char* name) {
    if (PyType_Ready(type) < 0) return false;
    Py_INCREF(type);
    if (PyModule_AddObject(module, name, (PyObject*)type) == 0) return true;
    Py_DECREF(type);
    return false;
}

bool add_nodes(PyObject* module) {
    NodeType.tp_name = "lazy_core._native.Node";
    NodeType.tp_basicsize = sizeof(NodeObject);
    NodeType.tp_flags = Py_TPFLAGS_DEFAULT;
    NodeType.tp_doc = "One IR operation (see lazy_core/ir.py).";
    NodeType.tp_new = node_tp_new;
    NodeType.tp_vectorcall = node_vectorcall;
    NodeType.tp_dealloc = (destructor)node_dealloc;
    NodeType.tp_repr = (reprfunc)node_repr;
    NodeType.tp_members = node_members;
    NodeType.tp_getset = node_getset;
    NodeType.tp_weaklistoffset = offsetof(NodeObject, weakrefs);
    if (!add_type(module, &NodeType, "Node")) return false;
    Py_INCREF(Py_None);  // current_site's reference
    return PyModule_AddFunctions(module, node_methods) == 0;
}

}  // namespace lazy_native
