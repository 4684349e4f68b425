// __torch_dispatch__ in C: find the op's plan (registered by the front end, lazy_torch/dispatch.py)
// and record the op, make its view or share its argument's value; whatever it cannot do exactly
// as the Python path would goes to the Python path (see record.cpp). Also the plans' registry,
// the configuration the front end gives, and the module's initialization.
#include "native.h"

#include <unordered_map>

namespace lazy_native {

Config cfg;
// Ops dispatch() recorded itself and ops it handed to the Python path (stats()).
unsigned long long handled = 0, handed = 0;
// func -> plan tuple, by kind:
//   (RECORD, name, scalar mask per position, scalar kwarg names, precision callable or None
//    [, value check]); a call whose ``device`` keyword names another device than its operands'
//    goes to Python. The value check is the op's entry of ``value_checks`` (see record.cpp's
//    value_checked), appended to its plan whenever either is registered.
//   (VIEW, name, storage_relative): a view op; its Meta and view steps memoized by view_cache
//   (SHARE,): detach/alias, a new tensor on its argument's view
// Ops live for the whole process, so plans are keyed by identity and never removed.
enum Kind { RECORD = 0, VIEW = 1, SHARE = 2 };
std::unordered_map<PyObject*, PyObject*> plans;
// func -> (check, argument positions, keyword names): eager's checks of the values of numbers,
// for the few ops that have one (lazy_torch/scalar_checks.py). Kept apart from the plans so that
// either may be registered first.
std::unordered_map<PyObject*, PyObject*> value_checks;

PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision, *s_then,
    *s_storage, *s_assign, *s_is_floating_point;
PyObject* scalar_dtypes[4];  // IR dtype names of bool, int, float, complex

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
    // The Python path's _view_key: (name, digest((args, kwargs))).
    Hasher h;
    h.add(TAG_TUPLE);
    h.add(2);
    if (!absorb(h, args_k.p) || !absorb(h, kwargs_k.p)) return nullptr;
    Ref digest(digest_int(h.done()));
    Ref key(digest ? PyTuple_Pack(2, PyTuple_GET_ITEM(plan, 1), digest.p) : nullptr);
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

// Make ``plan`` func's plan, with func's value check appended to a RECORD plan that has one.
bool set_plan(PyObject* func, PyObject* plan) {
    Ref full(Py_NewRef(plan));
    auto check = value_checks.find(func);
    if (check != value_checks.end() && PyLong_AsLong(PyTuple_GET_ITEM(plan, 0)) == RECORD) {
        Ref spec(PyTuple_Pack(1, check->second));
        if (!spec) return false;
        Py_SETREF(full.p, PySequence_Concat(plan, spec.p));
        if (!full) return false;
    }
    PyObject*& slot = plans[func];
    if (slot == nullptr) Py_INCREF(func);  // the key lives as long as the plan
    Py_XSETREF(slot, full.release());
    return true;
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
        PyErr_SetString(PyExc_TypeError, "register(func, plan): see the plan kinds in dispatch.cpp");
        return nullptr;
    }
    return set_plan(argv[0], argv[1]) ? Py_NewRef(Py_None) : nullptr;
}

// value_check(func, (check, positions, names)): eager's checks of the numbers of calls of func,
// which its RECORD plan (registered before or after) runs; see record.cpp's value_checked.
PyObject* register_value_check(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    PyObject* spec = nargs == 2 ? argv[1] : nullptr;
    if (spec == nullptr || !PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 3 ||
        !PyCallable_Check(PyTuple_GET_ITEM(spec, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 2))) {
        PyErr_SetString(PyExc_TypeError, "value_check(func, (check, positions, names))");
        return nullptr;
    }
    PyObject*& slot = value_checks[argv[0]];
    if (slot == nullptr) Py_INCREF(argv[0]);
    Py_INCREF(spec);
    Py_XSETREF(slot, spec);
    auto plan = plans.find(argv[0]);
    if (plan == plans.end()) Py_RETURN_NONE;
    // The registered plan again, now with the check (a plan of 6 has one already: drop it).
    Ref base(PyTuple_GetSlice(plan->second, 0, 5));
    return base && set_plan(argv[0], base.p) ? Py_NewRef(Py_None) : nullptr;
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

PyObject* stats(PyObject*, PyObject*) {
    return Py_BuildValue("{sKsK}", "native", handled, "python", handed);
}

PyMethodDef dispatch_methods[] = {
    {"stats", (PyCFunction)stats, METH_NOARGS,
     "Ops dispatch() recorded in C and ops it handed to the Python path, since import."},
    {"dispatch", (PyCFunction)(void (*)(void))dispatch, METH_FASTCALL,
     "__torch_dispatch__ body: record the op in C when it can, else call the fallback."},
    {"register", (PyCFunction)(void (*)(void))register_plan, METH_FASTCALL,
     "register(func, plan): handle func in C (plan kinds: see csrc/dispatch.cpp)."},
    {"value_check", (PyCFunction)(void (*)(void))register_value_check, METH_FASTCALL,
     "value_check(func, (check, positions, names)): run check(args, kwargs) before recording "
     "func in C when a number or CPU tensor fills one of those arguments."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Give the fast path the front end's classes, caches and callbacks."},
    {nullptr, nullptr, 0, nullptr}};

bool add_dispatch(PyObject* module) {
    PyObject** names[] = {&s_lazy,      &s_meta, &s_device,  &s_node,   &s_recording,
                          &s_precision, &s_then, &s_storage, &s_assign, &s_is_floating_point};
    const char* texts[] = {"_lazy",      "_meta", "device",  "node",   "recording",
                           "_precision", "then",  "storage", "assign", "is_floating_point"};
    static_assert(sizeof(names) / sizeof(names[0]) == sizeof(texts) / sizeof(texts[0]));
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == nullptr) return false;
    const char* dtypes[4] = {"bool", "int64", "float64", "complex128"};
    for (int i = 0; i < 4; i++)
        if ((scalar_dtypes[i] = PyUnicode_InternFromString(dtypes[i])) == nullptr) return false;
    return PyModule_AddFunctions(module, dispatch_methods) == 0;
}

PyModuleDef module = {PyModuleDef_HEAD_INIT, "lazy_core._native",
                      "The per-op recording fast path (see lazy_core/csrc).", -1, nullptr};

}  // namespace lazy_native

PyMODINIT_FUNC PyInit__native(void) {
    using namespace lazy_native;
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    if (!add_dispatch(m) || !add_recording(m) || !add_nodes(m) || !add_digests(m) ||
        !add_storages(m) || !add_autocast(m)) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
