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

#include <cmath>
#include <unordered_map>

namespace {

struct Config {
    PyObject* tensor_type = nullptr;   // the lazy tensor class (instances hold _lazy and _meta)
    PyObject* foreign_type = nullptr;  // other tensors: handed to `foreign`
    PyObject* fallback = nullptr;      // Python dispatch(func, args, kwargs)
    PyObject* flags = nullptr;         // a dict; a true "recording" entry sends every op to Python
    PyObject* meta_cache = nullptr;    // shape-inference memo: key -> Meta
    PyObject* constants = nullptr;     // (kind, value) -> constant Node
    PyObject* dtype_names = nullptr;   // dtype object -> IR dtype name
    PyObject* node = nullptr;          // Node(op, src, arg, dtype, shape)
    PyObject* scalar_leaf = nullptr;   // scalar_leaf(value, dtype)
    PyObject* storage = nullptr;       // Storage(node, device)
    PyObject* wrap = nullptr;          // wrap(storage, meta) -> tensor
    PyObject* foreign = nullptr;       // foreign(t) -> (node, key); raises when t cannot be one
    PyObject* operands = nullptr;      // tuple: Operand(i) for small i
};

Config cfg;
// func -> plan tuple (name, scalar mask per position, scalar kwarg names, precision or None).
// Ops live for the whole process, so plans are keyed by identity and never removed.
std::unordered_map<PyObject*, PyObject*> plans;

PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision;
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

PyObject* operand_marker(Operands& ops) {
    Py_ssize_t i = PyList_GET_SIZE(ops.srcs.p) - 1;
    if (i >= PyTuple_GET_SIZE(cfg.operands)) return nullptr;
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

// A non-Scalar argument as a hashable template entry (the Python path's _attr).
PyObject* attr(Operands& ops, PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || v == Py_None || t == &PyBool_Type ||
        t == &PyFloat_Type) {
        Py_INCREF(v);
        return v;
    }
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type)) return lazy_operand(ops, v);
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
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.foreign_type)) return foreign_operand(ops, v);
    PyObject* name = PyDict_GetItemWithError(cfg.dtype_names, v);  // a dtype
    if (name != nullptr) Py_INCREF(name);
    return name;  // anything else (devices, generators, ...) is the Python path's
}

PyObject* entry(Operands& ops, PyObject* v, bool scalar_slot) {
    if (Py_TYPE(v) == (PyTypeObject*)cfg.tensor_type) return lazy_operand(ops, v);
    if (scalar_slot) {
        int kind = number_kind(v);
        if (kind >= 0) return scalar_operand(ops, v, kind);
    }
    return attr(ops, v);
}

bool is_single_meta(PyObject* meta, PyObject** dtype_name) {
    if (!PyTuple_CheckExact(meta) || PyTuple_GET_SIZE(meta) != 4) return false;
    *dtype_name = PyDict_GetItemWithError(cfg.dtype_names, PyTuple_GET_ITEM(meta, 3));
    return *dtype_name != nullptr;
}

// The whole op, or nullptr to hand it to the Python path.
PyObject* record(PyObject* plan, PyObject* args, PyObject* kwargs) {
    PyObject* name = PyTuple_GET_ITEM(plan, 0);
    PyObject* mask = PyTuple_GET_ITEM(plan, 1);
    PyObject* scalar_names = PyTuple_GET_ITEM(plan, 2);
    PyObject* precision = PyTuple_GET_ITEM(plan, 3);
    Operands ops;
    if (!ops.srcs || !ops.keys) return nullptr;

    Py_ssize_t n = PyTuple_GET_SIZE(args);
    Ref args_t(PyTuple_New(n));
    if (!args_t) return nullptr;
    Py_ssize_t slots = PyTuple_GET_SIZE(mask);
    for (Py_ssize_t i = 0; i < n; i++) {
        bool scalar_slot = i < slots && PyTuple_GET_ITEM(mask, i) == Py_True;
        PyObject* e = entry(ops, PyTuple_GET_ITEM(args, i), scalar_slot);
        if (e == nullptr) return nullptr;
        PyTuple_SET_ITEM(args_t.p, i, e);
    }
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    Ref kwargs_t(PyTuple_New(nk));
    if (!kwargs_t) return nullptr;
    if (nk) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            int scalar_slot = PySet_Contains(scalar_names, k);
            if (scalar_slot < 0) return nullptr;
            PyObject* e = entry(ops, v, scalar_slot == 1);
            if (e == nullptr) return nullptr;
            PyObject* pair = PyTuple_Pack(2, k, e);
            Py_DECREF(e);
            if (pair == nullptr) return nullptr;
            PyTuple_SET_ITEM(kwargs_t.p, i++, pair);
        }
    }
    if (!ops.device) return nullptr;  // factories take their device from keywords

    Ref keys(PyList_AsTuple(ops.keys.p));
    if (!keys) return nullptr;
    Ref key(PyTuple_Pack(4, name, args_t.p, kwargs_t.p, keys.p));
    if (!key) return nullptr;
    PyObject* meta = PyDict_GetItemWithError(cfg.meta_cache, key.p);  // borrowed
    PyObject* dtype_name;
    if (meta == nullptr || !is_single_meta(meta, &dtype_name)) return nullptr;

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
    PyObject* node_args[5] = {name, srcs.p, arg.p, dtype_name, PyTuple_GET_ITEM(meta, 0)};
    Ref node(PyObject_Vectorcall(cfg.node, node_args, 5, nullptr));
    if (!node) return nullptr;
    PyObject* storage_args[2] = {node.p, ops.device.p};
    Ref storage(PyObject_Vectorcall(cfg.storage, storage_args, 2, nullptr));
    if (!storage) return nullptr;
    PyObject* wrap_args[2] = {storage.p, meta};
    return PyObject_Vectorcall(cfg.wrap, wrap_args, 2, nullptr);
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
            PyObject* out = record(plan->second, args, kwargs == Py_None ? nullptr : kwargs);
            if (out != nullptr) return out;
        }
        PyErr_Clear();  // whatever went wrong, the Python path does the op again
    }
    return call_fallback(func, args, kwargs);
}

PyObject* register_plan(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(argv[1]) || PyTuple_GET_SIZE(argv[1]) != 4 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(argv[1], 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(argv[1], 1)) ||
        !PyAnySet_Check(PyTuple_GET_ITEM(argv[1], 2))) {
        PyErr_SetString(PyExc_TypeError,
                        "register(func, (name, scalar_mask, scalar_names, precision))");
        return nullptr;
    }
    PyObject*& slot = plans[argv[0]];
    if (slot == nullptr) Py_INCREF(argv[0]);  // the key lives as long as the plan
    Py_INCREF(argv[1]);
    Py_XSETREF(slot, argv[1]);
    Py_RETURN_NONE;
}

PyObject* configure(PyObject*, PyObject* args, PyObject* kw) {
    static const char* names[] = {"tensor_type", "foreign_type", "fallback", "flags",
                                  "meta_cache",  "constants",    "dtype_names", "node",
                                  "scalar_leaf", "storage",      "wrap",      "foreign",
                                  "operands",    nullptr};
    Config c;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "O!O!OO!O!O!O!OOOOOO!:configure", (char**)names, &PyType_Type,
            &c.tensor_type, &PyType_Type, &c.foreign_type, &c.fallback, &PyDict_Type, &c.flags,
            &PyDict_Type, &c.meta_cache, &PyDict_Type, &c.constants, &PyDict_Type,
            &c.dtype_names, &c.node, &c.scalar_leaf, &c.storage, &c.wrap, &c.foreign,
            &PyTuple_Type, &c.operands))
        return nullptr;
    PyObject** fields[] = {&c.tensor_type, &c.foreign_type, &c.fallback, &c.flags,
                           &c.meta_cache,  &c.constants,    &c.dtype_names, &c.node,
                           &c.scalar_leaf, &c.storage,      &c.wrap,      &c.foreign,
                           &c.operands};
    PyObject** old[] = {&cfg.tensor_type, &cfg.foreign_type, &cfg.fallback, &cfg.flags,
                        &cfg.meta_cache,  &cfg.constants,    &cfg.dtype_names, &cfg.node,
                        &cfg.scalar_leaf, &cfg.storage,      &cfg.wrap,      &cfg.foreign,
                        &cfg.operands};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        Py_INCREF(*fields[i]);
        Py_XSETREF(*old[i], *fields[i]);
    }
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "__torch_dispatch__ body: record the op in C when it can, else call the fallback."},
    {"register", (PyCFunction)(void (*)(void))register_plan, METH_FASTCALL,
     "register(func, (name, scalar_mask, scalar_names, precision)): record func in C."},
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
    const char* dtypes[4] = {"bool", "int64", "float64", "complex128"};
    for (int i = 0; i < 4; i++) scalar_dtypes[i] = PyUnicode_InternFromString(dtypes[i]);
    return PyModule_Create(&module);
}
