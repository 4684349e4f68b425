// The per-op recording fast path, in C: one call from __torch_dispatch__ records a common op
// (arguments that are lazy tensors, Python numbers and plain attributes; a memoized single-output
// shape) as one IR node and returns its new tensor.
//
// It mirrors the front end's Python path (lazy_torch/dispatch.py: _template, record) step by step
// and knows nothing of torch: the front end configures it with its tensor class, node and storage
// constructors, caches and callbacks. Anything it does not handle exactly like the Python path
// (an op without a registered plan, an uncached shape, a multi-output op, an unusual argument, an
// error) makes it call the Python path instead, which does the whole op again. So it never
// raises an error of its own and never leaves a half-recorded op.
//
// Written against the CPython C API (METH_FASTCALL, vectorcall): a binding layer's per-call
// argument conversion would cost as much as the Python work this replaces.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cmath>
#include <cstdio>
#include <unordered_map>
#include <vector>

namespace {

struct Config {
    PyObject* tensor_type = nullptr;   // the lazy tensor class (instances hold _lazy and _meta)
    PyObject* foreign_type = nullptr;  // other tensors: handed to `foreign`
    PyObject* fallback = nullptr;      // Python dispatch(func, args, kwargs)
    PyObject* flags = nullptr;         // a dict; a true "recording" entry sends every op to Python
    PyObject* meta_cache = nullptr;    // shape-inference memo: key -> Meta
    PyObject* constants = nullptr;     // (kind, value) -> constant Node
    PyObject* dtype_names = nullptr;   // dtype object -> IR dtype name
    PyObject* scalar_leaf = nullptr;   // scalar_leaf(value, dtype)
    PyObject* storage = nullptr;       // Storage(node, device)
    PyObject* wrap = nullptr;          // wrap(storage, meta) -> tensor
    PyObject* foreign = nullptr;       // foreign(t) -> (node, key); raises when t cannot be one
    PyObject* operands = nullptr;      // tuple: Operand(i) for small i
    PyObject* view_cache = nullptr;    // view key -> (Meta or Metas, view steps)
    PyObject* make_wrapper = nullptr;  // make_wrapper(cls, shape, dtype=, device=): a new tensor
    PyObject* devices = nullptr;       // device objects by index
    PyObject* str_types = nullptr;     // argument types that enter templates as str(value)
    PyObject* getitem_op = nullptr;    // the op name of a multi-output node's output i
};

Config cfg;
// Ops dispatch() recorded itself and ops it handed to the Python path (stats()).
unsigned long long handled = 0, handed = 0;
// func -> plan tuple, by kind:
//   (RECORD, name, scalar mask per position, scalar kwarg names, precision callable or None);
//    a call whose ``device`` keyword names another device than its operands' goes to Python
//   (VIEW, name, storage_relative): a view op; its Meta and view steps memoized by view_cache
//   (SHARE,): detach/alias, a new tensor on its argument's view
// Ops live for the whole process, so plans are keyed by identity and never removed.
enum Kind { RECORD = 0, VIEW = 1, SHARE = 2 };
std::unordered_map<PyObject*, PyObject*> plans;

PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision, *s_then, *s_storage;
PyObject* scalar_dtypes[4];  // IR dtype names of bool, int, float, complex

// Owned reference that releases itself.
struct Ref {
    PyObject* p;
    explicit Ref(PyObject* o = nullptr) : p(o) {}
    ~Ref() { Py_XDECREF(p); }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    PyObject* release() {
        PyObject* o = p;
        p = nullptr;
        return o;
    }
    explicit operator bool() const { return p != nullptr; }
};

// One op's operands, as the Python path's _Operands.
struct Operands {
    Ref srcs{PyList_New(0)};
    Ref keys{PyList_New(0)};
    Ref device;
};

// The marker of the last operand: from the table, past it a new one of the table's type
// (a foreach op over many tensors has thousands of operands).
PyObject* operand_marker(Operands& ops) {
    Py_ssize_t i = PyList_GET_SIZE(ops.srcs.p) - 1;
    if (i >= PyTuple_GET_SIZE(cfg.operands)) {
        Ref index(PyLong_FromSsize_t(i));
        if (!index) return nullptr;
        return PyObject_CallOneArg((PyObject*)Py_TYPE(PyTuple_GET_ITEM(cfg.operands, 0)), index.p);
    }
    PyObject* m = PyTuple_GET_ITEM(cfg.operands, i);
    Py_INCREF(m);
    return m;
}

bool append(PyObject* list, PyObject* item) {  // steals item
    if (item == nullptr) return false;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc == 0;
}

PyObject* lazy_operand(Operands& ops, PyObject* t) {
    Ref view(PyObject_GetAttr(t, s_lazy));
    if (!view) return nullptr;
    Ref device(PyObject_GetAttr(view.p, s_device));
    if (!device) return nullptr;
    if (!ops.device) {
        ops.device.p = device.release();
    } else if (device.p != ops.device.p &&
               PyObject_RichCompareBool(device.p, ops.device.p, Py_EQ) != 1) {
        return nullptr;  // the Python path raises PyTorch's device-mismatch error
    }
    if (!append(ops.srcs.p, PyObject_GetAttr(view.p, s_node))) return nullptr;
    if (!append(ops.keys.p, PyObject_GetAttr(t, s_meta))) return nullptr;
    return operand_marker(ops);
}

PyObject* foreign_operand(Operands& ops, PyObject* t) {
    Ref pair(PyObject_CallOneArg(cfg.foreign, t));
    if (!pair || !PyTuple_Check(pair.p) || PyTuple_GET_SIZE(pair.p) != 2) return nullptr;
    PyObject* node = PyTuple_GET_ITEM(pair.p, 0);
    PyObject* key = PyTuple_GET_ITEM(pair.p, 1);
    Py_INCREF(node);
    Py_INCREF(key);
    if (!append(ops.srcs.p, node) || !append(ops.keys.p, key)) return nullptr;
    return operand_marker(ops);
}

// 0 for bool, 1 int, 2 float, 3 complex (exact types only, as the Python path); -1 otherwise.
int number_kind(PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyBool_Type) return 0;
    if (t == &PyLong_Type) return 1;
    if (t == &PyFloat_Type) return 2;
    if (t == &PyComplex_Type) return 3;
    return -1;
}

// 0 and 1 are baked into graphs; -0.0 is not 0 here (its sign matters to division).
bool is_constant(PyObject* v, int kind) {
    switch (kind) {
        case 0:
            return true;
        case 1: {
            int overflow = 0;
            long x = PyLong_AsLongAndOverflow(v, &overflow);
            return !overflow && (x == 0 || x == 1);
        }
        case 2: {
            double d = PyFloat_AS_DOUBLE(v);
            return (d == 0.0 && !std::signbit(d)) || d == 1.0;
        }
        default: {
            Py_complex c = PyComplex_AsCComplex(v);
            return c.imag == 0.0 && (c.real == 0.0 || c.real == 1.0);
        }
    }
}

PyObject* scalar_operand(Operands& ops, PyObject* v, int kind) {
    PyObject* type = (PyObject*)Py_TYPE(v);
    PyObject* node;
    if (is_constant(v, kind)) {
        Ref key(PyTuple_Pack(2, type, v));
        if (!key) return nullptr;
        node = PyDict_GetItemWithError(cfg.constants, key.p);  // borrowed
        if (node == nullptr) return nullptr;                   // made once, by the Python path
        Py_INCREF(node);
    } else {
        PyObject* call[2] = {v, scalar_dtypes[kind]};
        node = PyObject_Vectorcall(cfg.scalar_leaf, call, 2, nullptr);
    }
    if (!append(ops.srcs.p, node)) return nullptr;
    Py_INCREF(type);
    if (!append(ops.keys.p, type)) return nullptr;
    return operand_marker(ops);
}

// A dtype as its IR name, a device, layout or memory format as its str; nullptr for anything
// else (generators, symbolic ints, ...: the Python path's).
PyObject* named(PyObject* v) {
    PyObject* name = PyDict_GetItemWithError(cfg.dtype_names, v);
    if (name != nullptr) {
        Py_INCREF(name);
        return name;
    }
    if (PyErr_Occurred()) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cfg.str_types); i++) {
        if (Py_TYPE(v) == (PyTypeObject*)PyTuple_GET_ITEM(cfg.str_types, i)) return PyObject_Str(v);
    }
    return nullptr;
}

// A non-Scalar argument as a hashable entry. In a template (``ops`` given; the Python path's
// _attr) a lazy tensor becomes an operand; in a view's memo key (``ops`` null; _view_key) it is
// its Meta. Sequences become tuples, dtypes their names, other plain values stay themselves.
PyObject* attr(Operands* ops, PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || v == Py_None || t == &PyBool_Type ||
        t == &PyFloat_Type) {
        Py_INCREF(v);
        return v;
    }
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type))
        return ops ? lazy_operand(*ops, v) : PyObject_GetAttr(v, s_meta);
    if (PyTuple_Check(v) || PyList_Check(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject** items = PySequence_Fast_ITEMS(v);
        Ref out(PyTuple_New(n));
        if (!out) return nullptr;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject* e = attr(ops, items[i]);
            if (e == nullptr) return nullptr;
            PyTuple_SET_ITEM(out.p, i, e);
        }
        return out.release();
    }
    if (ops && PyObject_TypeCheck(v, (PyTypeObject*)cfg.foreign_type))
        return foreign_operand(*ops, v);
    return named(v);
}

PyObject* entry(Operands& ops, PyObject* v, bool scalar_slot) {
    if (Py_TYPE(v) == (PyTypeObject*)cfg.tensor_type) return lazy_operand(ops, v);
    if (scalar_slot) {
        int kind = number_kind(v);
        if (kind >= 0) return scalar_operand(ops, v, kind);
    }
    return attr(&ops, v);
}

bool is_single_meta(PyObject* meta, PyObject** dtype_name) {
    if (!PyTuple_CheckExact(meta) || PyTuple_GET_SIZE(meta) != 4) return false;
    *dtype_name = PyDict_GetItemWithError(cfg.dtype_names, PyTuple_GET_ITEM(meta, 3));
    return *dtype_name != nullptr;
}

extern PyTypeObject NodeType;
PyObject* node_new(PyTypeObject* type, PyObject* const* argv, size_t nargsf, PyObject* kwnames);

bool is_dense(PyObject* shape, PyObject* stride) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(stride)) return false;
    Py_ssize_t n = PyTuple_GET_SIZE(shape);
    if (PyTuple_GET_SIZE(stride) != n) return false;
    long long expected = 1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        long long st = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
        if (PyErr_Occurred() || st != expected) return false;
        expected *= size > 1 ? size : 1;
    }
    return true;
}

// A new tensor holding ``view`` on device ``device`` (the Python path's wrap). A dense tensor at
// offset 0 passes only what it must: keyword arguments cost their parsing.
PyObject* make_tensor(PyObject* view, PyObject* meta, PyObject* device) {
    PyObject* shape = PyTuple_GET_ITEM(meta, 0);
    PyObject* stride = PyTuple_GET_ITEM(meta, 1);
    PyObject* offset = PyTuple_GET_ITEM(meta, 2);
    Py_ssize_t index = PyLong_Check(device) ? PyLong_AsSsize_t(device) : -1;
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices) || !PyLong_Check(offset)) {
        PyErr_Clear();
        PyObject* wrap_args[2] = {view, meta};
        return PyObject_Vectorcall(cfg.wrap, wrap_args, 2, nullptr);
    }
    static PyObject* dense_kwnames = Py_BuildValue("(ss)", "dtype", "device");
    static PyObject* strided_kwnames =
        Py_BuildValue("(ssss)", "strides", "storage_offset", "dtype", "device");
    PyObject* dtype = PyTuple_GET_ITEM(meta, 3);
    PyObject* dev = PyTuple_GET_ITEM(cfg.devices, index);
    bool dense = PyLong_AsLong(offset) == 0 && is_dense(shape, stride);
    PyErr_Clear();
    Ref t;
    if (dense) {
        PyObject* call[4] = {cfg.tensor_type, shape, dtype, dev};
        t.p = PyObject_Vectorcall(cfg.make_wrapper, call, 2, dense_kwnames);
    } else {
        PyObject* call[6] = {cfg.tensor_type, shape, stride, offset, dtype, dev};
        t.p = PyObject_Vectorcall(cfg.make_wrapper, call, 2, strided_kwnames);
    }
    if (!t || PyObject_SetAttr(t.p, s_lazy, view) < 0 || PyObject_SetAttr(t.p, s_meta, meta) < 0)
        return nullptr;
    return t.release();
}

// A new tensor with its own storage holding ``node`` (the Python path's fresh).
PyObject* fresh(PyObject* node, PyObject* meta, PyObject* device) {
    PyObject* storage_args[2] = {node, device};
    Ref storage(PyObject_Vectorcall(cfg.storage, storage_args, 2, nullptr));
    return storage ? make_tensor(storage.p, meta, device) : nullptr;
}

// The template of one call of a RECORD plan's op and its memoized Meta (borrowed), the Python
// path's _template and infer; ops.keys from ``first`` on are this call's.
bool templated(PyObject* plan, PyObject* args, PyObject* kwargs, Operands& ops,
               Py_ssize_t first, Ref& args_t, Ref& kwargs_t, PyObject** meta) {
    PyObject* mask = PyTuple_GET_ITEM(plan, 2);
    PyObject* scalar_names = PyTuple_GET_ITEM(plan, 3);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    args_t.p = PyTuple_New(n);
    if (!args_t) return false;
    Py_ssize_t slots = PyTuple_GET_SIZE(mask);
    for (Py_ssize_t i = 0; i < n; i++) {
        bool scalar_slot = i < slots && PyTuple_GET_ITEM(mask, i) == Py_True;
        PyObject* e = entry(ops, PyTuple_GET_ITEM(args, i), scalar_slot);
        if (e == nullptr) return false;
        PyTuple_SET_ITEM(args_t.p, i, e);
    }
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    kwargs_t.p = PyTuple_New(nk);
    if (!kwargs_t) return false;
    if (nk) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            int scalar_slot = PySet_Contains(scalar_names, k);
            if (scalar_slot < 0) return false;
            PyObject* e = entry(ops, v, scalar_slot == 1);
            if (e == nullptr) return false;
            PyObject* pair = PyTuple_Pack(2, k, e);
            Py_DECREF(e);
            if (pair == nullptr) return false;
            PyTuple_SET_ITEM(kwargs_t.p, i++, pair);
        }
    }
    Ref keys(PyList_GetSlice(ops.keys.p, first, PyList_GET_SIZE(ops.keys.p)));
    if (!keys) return false;
    PyObject* keys_t = PyList_AsTuple(keys.p);
    if (keys_t == nullptr) return false;
    Ref key(Py_BuildValue("(OOON)", PyTuple_GET_ITEM(plan, 1), args_t.p, kwargs_t.p, keys_t));
    if (!key) return false;
    *meta = PyDict_GetItemWithError(cfg.meta_cache, key.p);
    return *meta != nullptr;
}

// The outputs of a multi-output op: one node with a dtype and shape per output (None where
// the op produces none), and a tensor per output on its getitem node, in a tuple or list as
// ``metas`` is (the Python path's _wrap_outputs).
PyObject* record_outputs(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* metas,
                         PyObject* device) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    Ref dtypes(PyTuple_New(n)), shapes(PyTuple_New(n));
    if (!dtypes || !shapes) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *dtype = Py_None, *shape = Py_None;
        if (items[i] != Py_None) {
            if (!is_single_meta(items[i], &dtype)) return nullptr;
            shape = PyTuple_GET_ITEM(items[i], 0);
        }
        Py_INCREF(dtype);
        Py_INCREF(shape);
        PyTuple_SET_ITEM(dtypes.p, i, dtype);
        PyTuple_SET_ITEM(shapes.p, i, shape);
    }
    PyObject* node_args[5] = {name, srcs, arg, dtypes.p, shapes.p};
    Ref node(node_new(&NodeType, node_args, 5, nullptr));
    Ref source(node ? PyTuple_Pack(1, node.p) : nullptr);
    Ref outs(PyTuple_New(n));
    if (!source || !outs) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* out = Py_None;
        if (items[i] == Py_None) {
            Py_INCREF(out);
        } else {
            Ref index(PyLong_FromSsize_t(i));
            if (!index) return nullptr;
            PyObject* getitem_args[5] = {cfg.getitem_op, source.p, index.p,
                                         PyTuple_GET_ITEM(dtypes.p, i), PyTuple_GET_ITEM(shapes.p, i)};
            Ref output(node_new(&NodeType, getitem_args, 5, nullptr));
            out = output ? fresh(output.p, items[i], device) : nullptr;
            if (out == nullptr) return nullptr;
        }
        PyTuple_SET_ITEM(outs.p, i, out);
    }
    return PyTuple_CheckExact(metas) ? outs.release() : PySequence_List(outs.p);
}

// Whether the ``device`` keyword is absent, None or the device of index ``device``.
bool on_own_device(PyObject* kwargs, PyObject* device) {
    PyObject* v = PyDict_GetItemWithError(kwargs, s_device);
    if (v == nullptr || v == Py_None) return v == Py_None || !PyErr_Occurred();
    Py_ssize_t index = PyLong_AsSsize_t(device);
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices)) return false;
    return PyObject_RichCompareBool(v, PyTuple_GET_ITEM(cfg.devices, index), Py_EQ) == 1;
}

// The whole op, or nullptr to hand it to the Python path.
PyObject* record(PyObject* plan, PyObject* args, PyObject* kwargs) {
    PyObject* name = PyTuple_GET_ITEM(plan, 1);
    PyObject* precision = PyTuple_GET_ITEM(plan, 4);
    Operands ops;
    if (!ops.srcs || !ops.keys) return nullptr;
    Ref args_t, kwargs_t;
    PyObject* meta;
    PyObject* dtype_name;
    if (!templated(plan, args, kwargs, ops, 0, args_t, kwargs_t, &meta)) return nullptr;
    if (!ops.device) return nullptr;  // factories take their device from keywords
    if (kwargs && !on_own_device(kwargs, ops.device.p)) return nullptr;  // e.g. _to_copy to CPU
    bool single = is_single_meta(meta, &dtype_name);
    if (!single && (PyErr_Occurred() || !(PyTuple_CheckExact(meta) || PyList_CheckExact(meta))))
        return nullptr;

    if (precision != Py_None) {  // matmuls record the float32 precision in force
        Ref p(PyObject_CallNoArgs(precision));
        if (!p) return nullptr;
        Ref extra(Py_BuildValue("((OO))", s_precision, p.p));
        if (!extra) return nullptr;
        PyObject* joined = PySequence_Concat(kwargs_t.p, extra.p);
        if (joined == nullptr) return nullptr;
        Py_SETREF(kwargs_t.p, joined);
    }
    Ref arg(PyTuple_Pack(2, args_t.p, kwargs_t.p));
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!arg || !srcs) return nullptr;
    if (!single) return record_outputs(name, srcs.p, arg.p, meta, ops.device.p);
    PyObject* node_args[5] = {name, srcs.p, arg.p, dtype_name, PyTuple_GET_ITEM(meta, 0)};
    Ref node(node_new(&NodeType, node_args, 5, nullptr));
    return node ? fresh(node.p, meta, ops.device.p) : nullptr;
}

// elements(plan, calls): the operands, per-call templates and Metas of a foreach op's element
// calls ``[(args, kwargs), ...]`` sharing one operand list (lazy_torch's record_elements), or
// None where the Python path must do it.
PyObject* elements(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(argv[0]) || PyTuple_GET_SIZE(argv[0]) != 5 ||
        !PyList_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "elements(record plan, [(args, kwargs), ...])");
        return nullptr;
    }
    PyObject* plan = argv[0];
    PyObject* calls = argv[1];
    Operands ops;
    Py_ssize_t n = PyList_GET_SIZE(calls);
    Ref templates(PyTuple_New(n)), metas(PyList_New(n));
    bool ok = ops.srcs && ops.keys && templates && metas;
    for (Py_ssize_t e = 0; ok && e < n; e++) {
        PyObject* call = PyList_GET_ITEM(calls, e);
        if (!PyTuple_CheckExact(call) || PyTuple_GET_SIZE(call) != 2 ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(call, 0)) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(call, 1))) {
            ok = false;
            break;
        }
        PyObject* kwargs = PyTuple_GET_ITEM(call, 1);
        Ref args_t, kwargs_t;
        PyObject* meta;
        ok = templated(plan, PyTuple_GET_ITEM(call, 0), PyDict_GET_SIZE(kwargs) ? kwargs : nullptr,
                       ops, PyList_GET_SIZE(ops.keys.p), args_t, kwargs_t, &meta);
        if (!ok) break;
        PyObject* pair = PyTuple_Pack(2, args_t.p, kwargs_t.p);
        ok = pair != nullptr;
        if (!ok) break;
        PyTuple_SET_ITEM(templates.p, e, pair);
        Py_INCREF(meta);
        PyList_SET_ITEM(metas.p, e, meta);
    }
    if (!ok || !ops.device) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!srcs) return nullptr;
    return PyTuple_Pack(4, srcs.p, templates.p, metas.p, ops.device.p);
}

PyObject* view(PyObject* plan, PyObject* args, PyObject* kwargs) {
    if (PyTuple_GET_SIZE(args) < 1 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), (PyTypeObject*)cfg.tensor_type))
        return nullptr;
    Ref args_k(attr(nullptr, args));
    if (!args_k) return nullptr;
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    Ref kwargs_k(PyTuple_New(nk));
    if (!kwargs_k) return nullptr;
    if (nk) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            Ref e(attr(nullptr, v));
            if (!e) return nullptr;
            PyObject* pair = PyTuple_Pack(2, k, e.p);
            if (pair == nullptr) return nullptr;
            PyTuple_SET_ITEM(kwargs_k.p, i++, pair);
        }
    }
    Ref key(PyTuple_Pack(3, PyTuple_GET_ITEM(plan, 1), args_k.p, kwargs_k.p));
    if (!key) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(cfg.view_cache, key.p);  // borrowed
    if (entry == nullptr) return nullptr;
    PyObject* meta = PyTuple_GET_ITEM(entry, 0);
    PyObject* steps = PyTuple_GET_ITEM(entry, 1);
    Ref parent(PyObject_GetAttr(PyTuple_GET_ITEM(args, 0), s_lazy));
    if (!parent) return nullptr;
    if (PyTuple_GET_ITEM(plan, 2) == Py_True) {
        PyObject* storage = PyObject_GetAttr(parent.p, s_storage);
        if (storage == nullptr) return nullptr;
        Py_SETREF(parent.p, storage);
    }
    PyObject* dtype_name;
    Ref device(PyObject_GetAttr(parent.p, s_device));
    if (!device) return nullptr;
    auto one = [&](PyObject* step, PyObject* m) -> PyObject* {
        Ref v(PyObject_CallMethodOneArg(parent.p, s_then, step));
        if (!v) return nullptr;
        return make_tensor(v.p, m, device.p);
    };
    if (is_single_meta(meta, &dtype_name)) return one(PyTuple_GET_ITEM(steps, 0), meta);
    if (PyErr_Occurred()) return nullptr;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(meta);
    PyObject** metas = PySequence_Fast_ITEMS(meta);
    Ref outs(PyList_New(n));
    if (!outs) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* t = one(PyTuple_GET_ITEM(steps, i), metas[i]);
        if (t == nullptr) return nullptr;
        PyList_SET_ITEM(outs.p, i, t);
    }
    return PyTuple_Check(meta) ? PyList_AsTuple(outs.p) : outs.release();
}

PyObject* share(PyObject* args) {
    if (PyTuple_GET_SIZE(args) < 1) return nullptr;
    PyObject* t = PyTuple_GET_ITEM(args, 0);
    if (!PyObject_TypeCheck(t, (PyTypeObject*)cfg.tensor_type)) return nullptr;
    Ref v(PyObject_GetAttr(t, s_lazy));
    Ref m(PyObject_GetAttr(t, s_meta));
    if (!v || !m) return nullptr;
    Ref device(PyObject_GetAttr(v.p, s_device));
    if (!device) return nullptr;
    return make_tensor(v.p, m.p, device.p);
}

PyObject* call_fallback(PyObject* func, PyObject* args, PyObject* kwargs) {
    Ref empty;
    if (kwargs == nullptr || kwargs == Py_None) {
        empty.p = PyDict_New();
        if (!empty) return nullptr;
        kwargs = empty.p;
    }
    PyObject* call[3] = {func, args, kwargs};
    return PyObject_Vectorcall(cfg.fallback, call, 3, nullptr);
}

// __torch_dispatch__(cls, func, types, args=(), kwargs=None), as a classmethod.
PyObject* dispatch(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "dispatch(cls, func, types, args=(), kwargs=None)");
        return nullptr;
    }
    if (cfg.fallback == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "lazy_core._native: configure() was not called");
        return nullptr;
    }
    PyObject* func = argv[1];
    PyObject* args = nargs > 3 ? argv[3] : nullptr;
    PyObject* kwargs = nargs > 4 ? argv[4] : nullptr;
    Ref empty_args;
    if (args == nullptr) {
        empty_args.p = PyTuple_New(0);
        args = empty_args.p;
    }
    auto plan = plans.find(func);
    if (plan != plans.end() && PyTuple_CheckExact(args) &&
        (kwargs == nullptr || kwargs == Py_None || PyDict_CheckExact(kwargs))) {
        PyObject* recording = PyDict_GetItemWithError(cfg.flags, s_recording);
        if (recording == nullptr || !PyObject_IsTrue(recording)) {
            PyObject* p = plan->second;
            if (kwargs == Py_None) kwargs = nullptr;
            long kind = PyLong_AsLong(PyTuple_GET_ITEM(p, 0));
            PyObject* out = kind == RECORD ? record(p, args, kwargs)
                            : kind == VIEW ? view(p, args, kwargs)
                                           : share(args);
            if (out != nullptr) {
                handled++;
                return out;
            }
        }
        PyErr_Clear();  // whatever went wrong, the Python path does the op again
    }
    handed++;
    return call_fallback(func, args, kwargs);
}

PyObject* register_plan(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    bool ok = nargs == 2 && PyTuple_CheckExact(argv[1]) && PyTuple_GET_SIZE(argv[1]) >= 1 &&
              PyLong_CheckExact(PyTuple_GET_ITEM(argv[1], 0));
    if (ok) {
        PyObject* p = argv[1];
        Py_ssize_t n = PyTuple_GET_SIZE(p);
        switch (PyLong_AsLong(PyTuple_GET_ITEM(p, 0))) {
            case RECORD:
                ok = n == 5 && PyUnicode_Check(PyTuple_GET_ITEM(p, 1)) &&
                     PyTuple_Check(PyTuple_GET_ITEM(p, 2)) && PyAnySet_Check(PyTuple_GET_ITEM(p, 3));
                break;
            case VIEW:
                ok = n == 3 && PyUnicode_Check(PyTuple_GET_ITEM(p, 1)) &&
                     PyBool_Check(PyTuple_GET_ITEM(p, 2));
                break;
            case SHARE:
                ok = n == 1;
                break;
            default:
                ok = false;
        }
    }
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "register(func, plan): see the plan kinds in _native.cpp");
        return nullptr;
    }
    PyObject*& slot = plans[argv[0]];
    if (slot == nullptr) Py_INCREF(argv[0]);  // the key lives as long as the plan
    Py_INCREF(argv[1]);
    Py_XSETREF(slot, argv[1]);
    Py_RETURN_NONE;
}

// configure(**fields): every field of Config by name, each checked against its type (nullptr:
// any object; callables are called).
struct Field {
    const char* name;
    PyObject** slot;
    PyTypeObject* type;
};
const Field fields[] = {
    {"tensor_type", &cfg.tensor_type, &PyType_Type}, {"foreign_type", &cfg.foreign_type, &PyType_Type},
    {"fallback", &cfg.fallback, nullptr},            {"flags", &cfg.flags, &PyDict_Type},
    {"meta_cache", &cfg.meta_cache, &PyDict_Type},   {"constants", &cfg.constants, &PyDict_Type},
    {"dtype_names", &cfg.dtype_names, &PyDict_Type}, {"scalar_leaf", &cfg.scalar_leaf, nullptr},
    {"storage", &cfg.storage, nullptr},              {"wrap", &cfg.wrap, nullptr},
    {"foreign", &cfg.foreign, nullptr},              {"operands", &cfg.operands, &PyTuple_Type},
    {"view_cache", &cfg.view_cache, &PyDict_Type},   {"make_wrapper", &cfg.make_wrapper, nullptr},
    {"devices", &cfg.devices, &PyTuple_Type},        {"str_types", &cfg.str_types, &PyTuple_Type},
    {"getitem_op", &cfg.getitem_op, &PyUnicode_Type},
};
constexpr size_t n_fields = sizeof(fields) / sizeof(fields[0]);

PyObject* configure(PyObject*, PyObject* args, PyObject* kw) {
    if (PyTuple_GET_SIZE(args) != 0 || kw == nullptr || (size_t)PyDict_GET_SIZE(kw) != n_fields) {
        PyErr_Format(PyExc_TypeError, "configure() takes exactly its %zu fields, by keyword",
                     n_fields);
        return nullptr;
    }
    PyObject* values[n_fields];
    for (size_t i = 0; i < n_fields; i++) {
        values[i] = PyDict_GetItemString(kw, fields[i].name);  // borrowed
        if (values[i] == nullptr) {
            PyErr_Format(PyExc_TypeError, "configure() needs %s", fields[i].name);
            return nullptr;
        }
        if (fields[i].type != nullptr && !PyObject_TypeCheck(values[i], fields[i].type)) {
            PyErr_Format(PyExc_TypeError, "configure(): %s must be a %s", fields[i].name,
                         fields[i].type->tp_name);
            return nullptr;
        }
    }
    for (size_t i = 0; i < n_fields; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*fields[i].slot, values[i]);
    }
    Py_RETURN_NONE;
}

// ----------------------------------------------------------------------------------------------
// Node: the IR node type of lazy_core/ir.py (which documents it and keeps a Python twin for
// builds without this extension). Same attributes, same structural hash.

PyObject* current_site = Py_None;  // the user site new nodes are attributed to (attribute_to)

struct NodeObject {
    PyObject_HEAD
    PyObject *op, *src, *arg, *dtype, *shape, *payload, *site;
    Py_hash_t hash;
    PyObject* weakrefs;
    // The graph walk's marks: the walk that last reached this node, and the node's post-order
    // position in it (-1 while on its stack). No map from nodes to positions is needed.
    unsigned long long walk;
    Py_ssize_t position;
};

// CPython's tuple hash (xxHash-based, 3.8+) over the given lanes, so a node hashes exactly as
// ``hash((op, arg, dtype, shape, tuple(s.hash for s in src)))`` does in the Python twin.
struct TupleHash {
    static constexpr Py_uhash_t P1 = 11400714785074694791ULL, P2 = 14029467366897019727ULL,
                                P5 = 2870177450012600261ULL;
    Py_uhash_t acc = P5;
    Py_ssize_t n = 0;
    void add(Py_uhash_t lane) {
        acc += lane * P2;
        acc = (acc << 31) | (acc >> 33);
        acc *= P1;
        n++;
    }
    Py_hash_t done() const {
        Py_uhash_t a = acc + ((Py_uhash_t)n ^ (P5 ^ 3527539UL));
        return a == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)a;
    }
};

// hash() of a Python int holding x: x modulo 2**61 - 1, keeping its sign; -1 becomes -2.
Py_hash_t int_hash(Py_hash_t x) {
    const Py_uhash_t modulus = ((Py_uhash_t)1 << 61) - 1;
    Py_uhash_t magnitude = x < 0 ? (Py_uhash_t)0 - (Py_uhash_t)x : (Py_uhash_t)x;
    Py_hash_t r = (Py_hash_t)(magnitude % modulus);
    if (x < 0) r = -r;
    return r == -1 ? -2 : r;
}

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
    PyObject* src = argv[1];
    if (!PyTuple_Check(src)) {
        PyErr_SetString(PyExc_TypeError, "Node: src must be a tuple of Nodes");
        return nullptr;
    }
    TupleHash srcs;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(src); i++) {
        PyObject* s = PyTuple_GET_ITEM(src, i);
        if (!PyObject_TypeCheck(s, &NodeType)) {
            PyErr_SetString(PyExc_TypeError, "Node: src must be a tuple of Nodes");
            return nullptr;
        }
        srcs.add((Py_uhash_t)int_hash(((NodeObject*)s)->hash));
    }
    TupleHash h;
    PyObject* hashed[4] = {argv[0], argv[2], argv[3], argv[4]};
    for (int i = 0; i < 4; i++) {
        Py_hash_t lane = PyObject_Hash(hashed[i]);
        if (lane == -1) return nullptr;
        h.add((Py_uhash_t)lane);
        if (i == 3) h.add((Py_uhash_t)srcs.done());
    }
    NodeObject* self = PyObject_New(NodeObject, type);
    if (self == nullptr) return nullptr;
    PyObject** fields[7] = {&self->op, &self->src, &self->arg, &self->dtype, &self->shape,
                            &self->payload, &self->site};
    PyObject* values[7] = {argv[0], src, argv[2], argv[3], argv[4], payload, current_site};
    for (int i = 0; i < 7; i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    self->hash = h.done();
    self->weakrefs = nullptr;
    self->walk = 0;
    self->position = -1;
    untrack_acyclic(self->src);
    untrack_acyclic(self->arg);
    return (PyObject*)self;
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
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef node_getset[] = {
    {"num_outputs", (getter)node_num_outputs, nullptr, nullptr, nullptr},
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
// parameters by first use, and the wiring that tells apart graphs whose nodes hash alike.


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
    Ref wires(PyTuple_New((Py_ssize_t)wiring.size()));
    if (!wires) return nullptr;
    for (size_t i = 0; i < wiring.size(); i++) {
        PyObject* w = PyLong_FromSsize_t(wiring[i]);
        if (w == nullptr) return nullptr;
        PyTuple_SET_ITEM(wires.p, (Py_ssize_t)i, w);
    }
    Ref order_t(PyList_AsTuple(order.p)), params_t(PyList_AsTuple(params.p));
    if (!order_t || !params_t) return nullptr;
    return PyTuple_Pack(3, order_t.p, params_t.p, wires.p);
}

PyObject* stats(PyObject*, PyObject*) {
    return Py_BuildValue("{sKsK}", "native", handled, "python", handed);
}

PyMethodDef methods[] = {
    {"elements", (PyCFunction)(void (*)(void))elements, METH_FASTCALL,
     "elements(plan, calls) -> (srcs, templates, metas, device) or None: a foreach op's elements."},
    {"stats", (PyCFunction)stats, METH_NOARGS,
     "Ops dispatch() recorded in C and ops it handed to the Python path, since import."},
    {"attribute_to", (PyCFunction)attribute_to, METH_O,
     "Attribute nodes created from now on to a site; returns the previous one."},
    {"current_site", (PyCFunction)get_current_site, METH_NOARGS, "The site of new nodes."},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(roots, data_op, scalar_op) -> (post-order, parameters, wiring); see graph.py."},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "__torch_dispatch__ body: record the op in C when it can, else call the fallback."},
    {"register", (PyCFunction)(void (*)(void))register_plan, METH_FASTCALL,
     "register(func, plan): handle func in C (plan kinds: see _native.cpp)."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Give the fast path the front end's classes, caches and callbacks."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "lazy_core._native",
                      "The per-op recording fast path (see lazy_core/_native.cpp).", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
    s_lazy = PyUnicode_InternFromString("_lazy");
    s_meta = PyUnicode_InternFromString("_meta");
    s_device = PyUnicode_InternFromString("device");
    s_node = PyUnicode_InternFromString("node");
    s_recording = PyUnicode_InternFromString("recording");
    s_precision = PyUnicode_InternFromString("_precision");
    s_then = PyUnicode_InternFromString("then");
    s_storage = PyUnicode_InternFromString("storage");
    const char* dtypes[4] = {"bool", "int64", "float64", "complex128"};
    for (int i = 0; i < 4; i++) scalar_dtypes[i] = PyUnicode_InternFromString(dtypes[i]);
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
    if (PyType_Ready(&NodeType) < 0) return nullptr;
    Py_INCREF(Py_None);  // current_site's reference
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    Py_INCREF(&NodeType);
    if (PyModule_AddObject(m, "Node", (PyObject*)&NodeType) < 0) return nullptr;
    return m;
}
