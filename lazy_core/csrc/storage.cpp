// The Storage type of lazy_core/value.py and the View type of lazy_core/view.py (the Python
// modules document them), the registry of live storages and a barrier's per-storage bookkeeping.
//
// The registry is a list threaded through the storages themselves, in creation order: a storage
// joins it when made and leaves it in its dealloc, so it needs no weak reference and the registry
// no sweeping. A storage refers to a node, a device index and its views cache, none of which can
// lead back to a storage, so storages stay out of the cycle collector: a traced step leaves about
// half as many tracked objects to be promoted into the oldest generation. Views refer to a storage
// and a tuple of view steps, so they stay out too, and so does the instance dict of a tensor
// holding one.
#include "native.h"

#include <unordered_map>
#include <vector>

namespace lazy_native {

struct StorageObject {
    PyObject_HEAD
    PyObject *node, *device, *views;  // views: None or a dict of view steps -> Access node
    PyObject* placement;              // None, or the front end's layout of the value on devices
    void* buffer;                     // the device buffer the value last was (identity only)
    long long id;
    StorageObject *prev, *next;
};

PyTypeObject StorageType = {PyVarObject_HEAD_INIT(nullptr, 0)};
StorageObject *first = nullptr, *last = nullptr;  // live storages, oldest first
long long next_id = 0;
PyObject *s_data = nullptr, *s_access = nullptr, *s_write = nullptr, *s_inverse_op = nullptr;

struct ViewObject {
    PyObject_HEAD
    PyObject *storage, *steps;  // steps: a tuple of view steps (lazy_core.view.ViewStep)
};

PyTypeObject ViewType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyObject* new_view(PyObject* storage, PyObject* steps);

// The payload of ``node`` if it is a device-data leaf, else nullptr; -1 (TypeError) if it is not
// a Node of this extension, the only kind lazy_core makes where this type is used.
int data_payload(PyObject* node, PyObject** payload) {
    *payload = nullptr;
    if (!Py_IS_TYPE(node, &NodeType)) {
        PyErr_SetString(PyExc_TypeError, "a Storage's value is a lazy_core Node");
        return -1;
    }
    PyObject* op = ((NodeObject*)node)->op;
    int data = op == s_data ? 1 : PyObject_RichCompareBool(op, s_data, Py_EQ);
    if (data > 0) *payload = ((NodeObject*)node)->payload;
    return data;
}

// storage.set(node): the new value; drops the views' Access nodes of the old one.
int storage_set_node(StorageObject* self, PyObject* node) {
    PyObject* payload;
    if (data_payload(node, &payload) < 0) return -1;
    if (payload != nullptr) self->buffer = payload;
    Py_INCREF(node);
    Py_XSETREF(self->node, node);
    Py_INCREF(Py_None);
    Py_SETREF(self->views, Py_None);
    return 0;
}

PyObject* storage_new(PyTypeObject* type, PyObject* const* argv, size_t nargsf, PyObject* kw) {
    if (PyVectorcall_NARGS(nargsf) != 2 || (kw != nullptr && PyTuple_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Storage(node, device)");
        return nullptr;
    }
    StorageObject* self = PyObject_New(StorageObject, type);
    if (self == nullptr) return nullptr;
    Py_INCREF(argv[1]);
    self->device = argv[1];
    Py_INCREF(Py_None);
    self->views = Py_None;
    self->placement = Py_NewRef(Py_None);
    self->node = nullptr;
    self->buffer = nullptr;
    self->id = next_id++;
    self->prev = last;
    self->next = nullptr;
    (last ? last->next : first) = self;
    last = self;
    if (storage_set_node(self, argv[0]) < 0) {
        Py_DECREF(self);
        return nullptr;
    }
    return (PyObject*)self;
}

PyObject* storage_vectorcall(PyObject* type, PyObject* const* argv, size_t nargsf, PyObject* kw) {
    return storage_new((PyTypeObject*)type, argv, nargsf, kw);
}

// tp_new of a type whose calls go through its vectorcall (``Type.__new__``, subclass calls).
template <vectorcallfunc call>
PyObject* positional_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    if (kwargs != nullptr && PyDict_GET_SIZE(kwargs)) {
        PyErr_Format(PyExc_TypeError, "%s() takes positional arguments only", type->tp_name);
        return nullptr;
    }
    return call((PyObject*)type, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), nullptr);
}

void storage_dealloc(StorageObject* self) {
    (self->prev ? self->prev->next : first) = self->next;
    (self->next ? self->next->prev : last) = self->prev;
    Py_XDECREF(self->node);
    Py_XDECREF(self->device);
    Py_XDECREF(self->views);
    Py_XDECREF(self->placement);
    PyObject_Free(self);
}

PyObject* storage_set(StorageObject* self, PyObject* node) {
    if (storage_set_node(self, node) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject* storage_then(StorageObject* self, PyObject* step) {
    Ref steps(PyTuple_Pack(1, step));
    return steps ? new_view((PyObject*)self, steps.p) : nullptr;
}

PyObject* storage_repr(StorageObject* self) {
    return PyUnicode_FromFormat("Storage#%lld(%R)", self->id, self->node);
}

PyObject* get_node(StorageObject* self, void*) {
    Py_INCREF(self->node);
    return self->node;
}

PyObject* get_self(StorageObject* self, void*) {
    Py_INCREF(self);
    return (PyObject*)self;
}

PyObject* get_views(StorageObject* self, void*) {
    Py_INCREF(self->views);
    return self->views;
}

int set_views(StorageObject* self, PyObject* value, void*) {
    if (value == nullptr || (value != Py_None && !PyDict_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "Storage.views is None or a dict");
        return -1;
    }
    Py_INCREF(value);
    Py_SETREF(self->views, value);
    return 0;
}

PyObject* get_placement(StorageObject* self, void*) { return Py_NewRef(self->placement); }

// A placement must not lead back to a storage: storages are outside the cycle collector. The
// front end keeps plain tuples of ints, strings and None here.
int set_placement(StorageObject* self, PyObject* value, void*) {
    if (value == nullptr) value = Py_None;
    if (value != Py_None && !PyTuple_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "Storage.placement is None or a tuple");
        return -1;
    }
    Py_SETREF(self->placement, Py_NewRef(value));
    return 0;
}

PyObject* get_buffer_id(StorageObject* self, void*) {
    if (self->buffer == nullptr) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(self->buffer);  // what id() of the buffer is
}

PyObject* get_pending(StorageObject* self, void*) {
    PyObject* payload;
    if (data_payload(self->node, &payload) < 0) return nullptr;
    return PyBool_FromLong(payload == nullptr);
}

PyObject* get_id(StorageObject* self, void*) { return PyLong_FromLongLong(self->id); }

PyObject* get_device(StorageObject* self, void*) {
    Py_INCREF(self->device);
    return self->device;
}

PyGetSetDef storage_getset[] = {
    {"node", (getter)get_node, nullptr, "The current value (written through set).", nullptr},
    {"views", (getter)get_views, (setter)set_views, "View steps -> Access node, or None.", nullptr},
    {"buffer_id", (getter)get_buffer_id, nullptr, "id() of the buffer last held, or None.", nullptr},
    {"pending", (getter)get_pending, nullptr, "True while the value is not a buffer.", nullptr},
    {"storage", (getter)get_self, nullptr, "The storage itself (a view with no steps).", nullptr},
    {"id", (getter)get_id, nullptr, "Creation number.", nullptr},
    {"device", (getter)get_device, nullptr, "The device index.", nullptr},
    {"placement", (getter)get_placement, (setter)set_placement,
     "None, or how the value is laid out over several devices (a tuple the front end reads).",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef storage_methods[] = {
    {"set", (PyCFunction)storage_set, METH_O, "Make node the value."},
    {"assign", (PyCFunction)storage_set, METH_O, "Make node the value (as a view with no steps)."},
    {"then", (PyCFunction)storage_then, METH_O, "A view of this storage: View(self, (step,))."},
    {nullptr, nullptr, 0, nullptr}};

// ----------------------------------------------------------------------------------------------
// View: a storage and the view steps from its value to the tensor's.

// A view's storage, which the View constructor checks is a Storage of this extension.
StorageObject* storage_of(ViewObject* view) { return (StorageObject*)view->storage; }

PyObject* new_view(PyObject* storage, PyObject* steps) {
    ViewObject* self = PyObject_New(ViewObject, &ViewType);
    if (self == nullptr) return nullptr;
    self->storage = Py_NewRef(storage);
    self->steps = Py_NewRef(steps);
    return (PyObject*)self;
}

PyObject* view_vectorcall(PyObject*, PyObject* const* argv, size_t nargsf, PyObject* kw) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n < 1 || n > 2 || (kw != nullptr && PyTuple_GET_SIZE(kw)) ||
        !Py_IS_TYPE(argv[0], &StorageType) || (n == 2 && !PyTuple_Check(argv[1]))) {
        PyErr_SetString(PyExc_TypeError, "View(storage, steps=()): a Storage and a tuple");
        return nullptr;
    }
    if (n == 2) return new_view(argv[0], argv[1]);
    Ref empty(PyTuple_New(0));
    return empty ? new_view(argv[0], empty.p) : nullptr;
}

void view_dealloc(ViewObject* self) {
    Py_XDECREF(self->storage);
    Py_XDECREF(self->steps);
    PyObject_Free(self);
}

// The view's current value: an Access of the storage's value, cached on the storage per value so
// every view with these steps shares one Access node.
PyObject* view_node(ViewObject* self, void*) {
    StorageObject* storage = storage_of(self);
    if (PyTuple_GET_SIZE(self->steps) == 0) return Py_NewRef(storage->node);
    if (storage->views == Py_None) {
        PyObject* fresh = PyDict_New();
        if (fresh == nullptr) return nullptr;
        Py_SETREF(storage->views, fresh);
    }
    Ref cache(Py_NewRef(storage->views));
    PyObject* found = PyDict_GetItemWithError(cache.p, self->steps);
    if (found != nullptr) return Py_NewRef(found);
    if (PyErr_Occurred()) return nullptr;
    Ref node(Py_NewRef(storage->node));
    for (Py_ssize_t i = 0; node && i < PyTuple_GET_SIZE(self->steps); i++)
        Py_SETREF(node.p,
                  PyObject_CallMethodOneArg(PyTuple_GET_ITEM(self->steps, i), s_access, node.p));
    if (!node || PyDict_SetItem(cache.p, self->steps, node.p) < 0) return nullptr;
    return node.release();
}

// Make ``value`` the view's value: the inverse of each step from the innermost outwards gives the
// storage's new value (an Assign); reading the view back gives what was written.
PyObject* view_assign(ViewObject* self, PyObject* value) {
    StorageObject* storage = storage_of(self);
    PyObject* steps = self->steps;
    Py_ssize_t n = PyTuple_GET_SIZE(steps);
    if (n == 0) return storage_set(storage, value);
    Ref parents(PyList_New(0));
    Ref parent(Py_NewRef(storage->node));
    if (!parents || !parent || PyList_Append(parents.p, parent.p) < 0) return nullptr;
    for (Py_ssize_t i = 0; i + 1 < n; i++) {
        Ref next(PyObject_CallMethodOneArg(PyTuple_GET_ITEM(steps, i), s_access, parent.p));
        if (!next || PyList_Append(parents.p, next.p) < 0) return nullptr;
        Py_SETREF(parent.p, next.release());
    }
    Ref written(Py_NewRef(value));
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        // step.write(parent, written); the slot before the arguments is the callee's to use.
        PyObject* args[4] = {nullptr, PyTuple_GET_ITEM(steps, i), PyList_GET_ITEM(parents.p, i),
                             written.p};
        Ref next(PyObject_VectorcallMethod(s_write, args + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                           nullptr));
        if (!next) return nullptr;
        Py_SETREF(written.p, next.release());
    }
    if (storage_set_node(storage, written.p) < 0) return nullptr;
    PyObject* cache = PyDict_New();
    if (cache == nullptr) return nullptr;
    Py_SETREF(storage->views, cache);
    if (PyDict_SetItem(cache, steps, value) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject* view_then(ViewObject* self, PyObject* step) {
    Py_ssize_t n = PyTuple_GET_SIZE(self->steps);
    Ref steps(PyTuple_New(n + 1));
    if (!steps) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(steps.p, i, Py_NewRef(PyTuple_GET_ITEM(self->steps, i)));
    PyTuple_SET_ITEM(steps.p, n, Py_NewRef(step));
    return new_view(self->storage, steps.p);
}

PyObject* view_writable(ViewObject* self, void*) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->steps); i++) {
        Ref inverse(PyObject_GetAttr(PyTuple_GET_ITEM(self->steps, i), s_inverse_op));
        if (!inverse) return nullptr;
        if (inverse.p == Py_None) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

PyObject* view_device(ViewObject* self, void*) { return Py_NewRef(storage_of(self)->device); }

PyObject* view_storage(ViewObject* self, void*) { return Py_NewRef(self->storage); }
PyObject* view_steps(ViewObject* self, void*) { return Py_NewRef(self->steps); }

PyGetSetDef view_getset[] = {
    {"node", (getter)view_node, nullptr, "The current value (an Access of the storage's).", nullptr},
    {"storage", (getter)view_storage, nullptr, "The storage the view is a window on.", nullptr},
    {"steps", (getter)view_steps, nullptr, "The view steps from the storage's value.", nullptr},
    {"writable", (getter)view_writable, nullptr, "Whether every step has an inverse.", nullptr},
    {"device", (getter)view_device, nullptr, "The storage's device index.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyObject* assign(PyObject* value, PyObject* node) {
    if (Py_IS_TYPE(value, &StorageType)) return storage_set((StorageObject*)value, node);
    if (Py_IS_TYPE(value, &ViewType)) return view_assign((ViewObject*)value, node);
    return PyObject_CallMethodOneArg(value, s_assign, node);
}

PyMethodDef view_methods[] = {
    {"assign", (PyCFunction)view_assign, METH_O, "Make value the view's value (an Assign)."},
    {"then", (PyCFunction)view_then, METH_O, "A view of this view."},
    {nullptr, nullptr, 0, nullptr}};

// ----------------------------------------------------------------------------------------------
// The registry.

// live_storages(): the live storages, oldest first.
PyObject* live_storages(PyObject*, PyObject*) {
    Ref out(PyList_New(0));
    if (!out) return nullptr;
    for (StorageObject* s = first; s != nullptr; s = s->next)
        if (PyList_Append(out.p, (PyObject*)s) < 0) return nullptr;
    return out.release();
}

// pending_and_held(): the live storages with pending values, oldest first, and the ids of the
// device buffers the others hold.
PyObject* pending_and_held(PyObject*, PyObject*) {
    Ref pending(PyList_New(0)), held(PySet_New(nullptr));
    if (!pending || !held) return nullptr;
    for (StorageObject* s = first; s != nullptr; s = s->next) {
        PyObject* payload;
        if (data_payload(s->node, &payload) < 0) return nullptr;
        if (payload == nullptr) {
            if (PyList_Append(pending.p, (PyObject*)s) < 0) return nullptr;
            continue;
        }
        Ref ident(PyLong_FromVoidPtr(payload));
        if (!ident || PySet_Add(held.p, ident.p) < 0) return nullptr;
    }
    return PyTuple_Pack(2, pending.p, held.p);
}

// The barrier's bookkeeping over a cut graph's storages and parameters (value.py's twins: settle,
// buffer_partners, unheld). Nodes and storages are compared by identity, as id() does.

bool is_storage_list(PyObject* o) {
    if (!PyList_Check(o)) return false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(o); i++)
        if (!Py_IS_TYPE(PyList_GET_ITEM(o, i), &StorageType)) return false;
    return true;
}

bool is_node_tuple(PyObject* o) {
    if (!PyTuple_Check(o)) return false;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o); i++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(o, i), &NodeType)) return false;
    return true;
}

// Each root's position in ``roots`` (the last one where a node repeats, as a dict would keep).
std::unordered_map<PyObject*, Py_ssize_t> positions(PyObject* roots) {
    std::unordered_map<PyObject*, Py_ssize_t> at;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(roots); k++) at[PyTuple_GET_ITEM(roots, k)] = k;
    return at;
}

// settle(storages, roots, outputs): after a graph ran, each storage's value becomes the output
// buffer of its root (its current node; roots[k] computed outputs[k]) as a data leaf.
PyObject* settle(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 3 || !is_storage_list(argv[0]) || !is_node_tuple(argv[1]) ||
        !PySequence_Check(argv[2]) || PySequence_Size(argv[2]) != PyTuple_GET_SIZE(argv[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "settle(storages: list, roots: tuple of Nodes, outputs: one per root)");
        return nullptr;
    }
    Ref outputs(PySequence_Fast(argv[2], "outputs"));
    if (!outputs) return nullptr;
    auto at = positions(argv[1]);
    Ref no_src(PyTuple_New(0));
    if (!no_src) return nullptr;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(argv[0]); i++) {
        StorageObject* s = (StorageObject*)PyList_GET_ITEM(argv[0], i);
        auto k = at.find(s->node);
        if (k == at.end()) {
            PyErr_SetString(PyExc_KeyError, "settle: a storage's value is not one of the roots");
            return nullptr;
        }
        NodeObject* root = (NodeObject*)s->node;
        PyObject* leaf_args[6] = {s_data, no_src.p, Py_None, root->dtype, root->shape,
                                  PySequence_Fast_GET_ITEM(outputs.p, k->second)};
        Ref leaf(node_new(&NodeType, leaf_args, 6, nullptr));
        if (!leaf || storage_set_node(s, leaf.p) < 0) return nullptr;
    }
    Py_RETURN_NONE;
}

// buffer_partners(storages, params, donated, roots) -> {parameter index: root index}: each
// donated parameter whose buffer a storage last held, paired with the root of that storage's
// new value (the last such storage, where two held one buffer).
PyObject* buffer_partners(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 4 || !is_storage_list(argv[0]) || !is_node_tuple(argv[1]) ||
        !PyTuple_Check(argv[2]) || !is_node_tuple(argv[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "buffer_partners(storages: list, params: tuple, donated: tuple, roots: tuple)");
        return nullptr;
    }
    PyObject *params = argv[1], *donated = argv[2];
    std::unordered_map<void*, PyObject*> by_buffer;  // payload -> parameter index (borrowed)
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(donated); d++) {
        PyObject* index = PyTuple_GET_ITEM(donated, d);
        Py_ssize_t i = PyLong_AsSsize_t(index);
        if (i == -1 && PyErr_Occurred()) return nullptr;
        if (i < 0 || i >= PyTuple_GET_SIZE(params)) {
            PyErr_SetString(PyExc_IndexError, "buffer_partners: a donated index out of range");
            return nullptr;
        }
        by_buffer[((NodeObject*)PyTuple_GET_ITEM(params, i))->payload] = index;
    }
    auto at = positions(argv[3]);
    Ref partners(PyDict_New());
    if (!partners) return nullptr;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(argv[0]); i++) {
        StorageObject* s = (StorageObject*)PyList_GET_ITEM(argv[0], i);
        if (s->buffer == nullptr) continue;
        auto p = by_buffer.find(s->buffer);
        if (p == by_buffer.end()) continue;
        auto k = at.find(s->node);
        if (k == at.end()) {
            PyErr_SetString(PyExc_KeyError, "buffer_partners: a storage's value is not a root");
            return nullptr;
        }
        Ref root(PyLong_FromSsize_t(k->second));
        if (!root || PyDict_SetItem(partners.p, p->second, root.p) < 0) return nullptr;
    }
    return partners.release();
}

// unheld(params, candidates, counts, held) -> the candidate parameters whose buffer no live
// storage holds (``held``: buffer ids), in order, at most counts[slot] of each slot;
// ``candidates`` are (parameter index, slot index) pairs.
PyObject* unheld(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 4 || !is_node_tuple(argv[0]) || !PyTuple_Check(argv[1]) ||
        !PyTuple_Check(argv[2]) || !PyAnySet_Check(argv[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "unheld(params: tuple, candidates: tuple, counts: tuple, held: set)");
        return nullptr;
    }
    PyObject *params = argv[0], *candidates = argv[1], *held = argv[3];
    std::vector<Py_ssize_t> free(PyTuple_GET_SIZE(argv[2]));
    for (size_t j = 0; j < free.size(); j++) {
        free[j] = PyLong_AsSsize_t(PyTuple_GET_ITEM(argv[2], j));
        if (free[j] == -1 && PyErr_Occurred()) return nullptr;
    }
    Ref out(PyList_New(0));
    if (!out) return nullptr;
    for (Py_ssize_t c = 0; c < PyTuple_GET_SIZE(candidates); c++) {
        PyObject* pair = PyTuple_GET_ITEM(candidates, c);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "unheld: a candidate is not an (index, slot) pair");
            return nullptr;
        }
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
        Py_ssize_t slot = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 1));
        if ((i == -1 || slot == -1) && PyErr_Occurred()) return nullptr;
        if (i < 0 || i >= PyTuple_GET_SIZE(params) || slot < 0 || (size_t)slot >= free.size()) {
            PyErr_SetString(PyExc_IndexError, "unheld: a candidate out of range");
            return nullptr;
        }
        if (free[slot] <= 0) continue;
        Ref ident(PyLong_FromVoidPtr(((NodeObject*)PyTuple_GET_ITEM(params, i))->payload));
        if (!ident) return nullptr;
        int is_held = PySet_Contains(held, ident.p);
        if (is_held < 0) return nullptr;
        if (is_held) continue;
        free[slot]--;
        if (PyList_Append(out.p, PyTuple_GET_ITEM(pair, 0)) < 0) return nullptr;
    }
    return PyList_AsTuple(out.p);
}

PyMethodDef registry_methods[] = {
    {"live_storages", (PyCFunction)live_storages, METH_NOARGS, "Live storages, oldest first."},
    {"pending_and_held", (PyCFunction)pending_and_held, METH_NOARGS,
     "(pending storages, ids of the buffers the others hold); lazy_core/value.py."},
    {"settle", (PyCFunction)(void (*)(void))settle, METH_FASTCALL,
     "settle(storages, roots, outputs): each storage's value becomes its root's output buffer."},
    {"buffer_partners", (PyCFunction)(void (*)(void))buffer_partners, METH_FASTCALL,
     "buffer_partners(storages, params, donated, roots) -> {donated parameter: root}."},
    {"unheld", (PyCFunction)(void (*)(void))unheld, METH_FASTCALL,
     "unheld(params, candidates, counts, held) -> candidate parameters no storage holds."},
    {nullptr, nullptr, 0, nullptr}};

bool add_storages(PyObject* module) {
    s_data = PyUnicode_InternFromString("data");
    s_access = PyUnicode_InternFromString("access");
    s_write = PyUnicode_InternFromString("write");
    s_inverse_op = PyUnicode_InternFromString("inverse_op");
    for (PyObject* name : {s_data, s_access, s_write, s_inverse_op})
        if (name == nullptr) return false;
    StorageType.tp_name = "lazy_core._native.Storage";
    StorageType.tp_basicsize = sizeof(StorageObject);
    StorageType.tp_flags = Py_TPFLAGS_DEFAULT;
    StorageType.tp_doc = "The current value of one buffer (see lazy_core/value.py).";
    StorageType.tp_new = positional_new<storage_vectorcall>;
    StorageType.tp_vectorcall = storage_vectorcall;
    StorageType.tp_dealloc = (destructor)storage_dealloc;
    StorageType.tp_repr = (reprfunc)storage_repr;
    StorageType.tp_getset = storage_getset;
    StorageType.tp_methods = storage_methods;
    if (!add_type(module, &StorageType, "Storage")) return false;
    // A storage is the view of itself with no steps.
    Ref steps(PyTuple_New(0));
    if (!steps || PyDict_SetItemString(StorageType.tp_dict, "steps", steps.p) < 0 ||
        PyDict_SetItemString(StorageType.tp_dict, "writable", Py_True) < 0)
        return false;
    PyType_Modified(&StorageType);
    ViewType.tp_name = "lazy_core._native.View";
    ViewType.tp_basicsize = sizeof(ViewObject);
    ViewType.tp_flags = Py_TPFLAGS_DEFAULT;
    ViewType.tp_doc = "A tensor's window on a storage (see lazy_core/view.py).";
    ViewType.tp_new = positional_new<view_vectorcall>;
    ViewType.tp_vectorcall = view_vectorcall;
    ViewType.tp_dealloc = (destructor)view_dealloc;
    ViewType.tp_getset = view_getset;
    ViewType.tp_methods = view_methods;
    if (!add_type(module, &ViewType, "View")) return false;
    return PyModule_AddFunctions(module, registry_methods) == 0;
}

}  // namespace lazy_native
