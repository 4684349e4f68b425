// __torch_dispatch__ in C: find the op's plan (registered by the front end, lazy_torch/dispatch.py)
// and record the op (record.cpp), make its view from the view memo, or share its argument's
// value. Where the plan declines (see record.cpp) or the op has none, the op's Python handler
// runs. Also the Plan type, the plans' registry, the configuration and the module.
#include "native.h"

#include <unordered_map>

namespace lazy_native {

const CoreApi* core = nullptr;
Config cfg;

PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision, *s_then, *s_storage,
    *s_is_floating_point, *s_dim, *s_item, *s_dtype, *s_type, *s_index, *s_cpu;
PyObject* scalar_dtypes[4];  // IR dtype names of bool, int, float, complex

namespace {

// Ops dispatch() did itself and ops it handed to their Python handlers (stats()).
unsigned long long handled = 0, handed = 0;

// An op's registered plan, and its value check: None, or (check, argument positions, keyword
// names), eager's checks of the values of numbers for the few ops that have one
// (lazy_torch/scalar_checks.py). ``check(args, kwargs)`` raises eager's error for numbers eager
// refuses (a negative integer power, an integer division by 0); it runs only when an argument at
// one of those positions or keywords holds a number or a CPU tensor, so calls that pass none
// (``add`` without ``alpha``) pay nothing. Either may be registered first. Ops live for the whole
// process, so entries are keyed by identity and never removed.
struct Registered {
    PyObject* plan = nullptr;
    PyObject* check = nullptr;
};
std::unordered_map<PyObject*, Registered> registry;

// Whether an argument is one a value check reads: a Python number or a tensor that is not lazy
// (a CPU scalar); a lazy tensor's value is unknown while tracing.
bool checked_value(PyObject* v) {
    return v != Py_None && !PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type);
}

// False when the check raised (the handler runs the op, and the check, again).
bool value_checked(PyObject* spec, PyObject* args, PyObject* kwargs) {
    PyObject* positions = PyTuple_GET_ITEM(spec, 1);
    PyObject* names = PyTuple_GET_ITEM(spec, 2);
    bool reads = false;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; !reads && i < PyTuple_GET_SIZE(positions); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
        reads = at >= 0 && at < n && checked_value(PyTuple_GET_ITEM(args, at));
    }
    for (Py_ssize_t i = 0; !reads && kwargs && i < PyTuple_GET_SIZE(names); i++) {
        PyObject* v = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, i));
        if (v == nullptr && PyErr_Occurred()) return false;
        reads = v != nullptr && checked_value(v);
    }
    if (!reads) return true;
    Ref kw(kwargs ? Py_NewRef(kwargs) : PyDict_New());
    if (!kw) return false;
    PyObject* call[2] = {args, kw.p};
    Ref ok(PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 0), call, 2, nullptr));
    return ok.p != nullptr;
}

// A view op from the view memo: its tensor(s) on the argument's view or storage; nullptr (to
// decline) on a miss.
PyObject* view(PlanObject* plan, PyObject* args, PyObject* kwargs) {
    if (PyTuple_GET_SIZE(args) < 1 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(args, 0), (PyTypeObject*)cfg.tensor_type))
        return nullptr;
    Ref key(view_key(plan->name, args, kwargs));
    if (!key) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(cfg.view_cache, key.p);  // borrowed
    if (entry == nullptr) return nullptr;
    PyObject* meta = PyTuple_GET_ITEM(entry, 0);
    PyObject* steps = PyTuple_GET_ITEM(entry, 1);
    Ref parent(PyObject_GetAttr(PyTuple_GET_ITEM(args, 0), s_lazy));
    if (!parent) return nullptr;
    if (plan->storage_relative) {
        PyObject* storage = PyObject_GetAttr(parent.p, s_storage);
        if (storage == nullptr) return nullptr;
        Py_SETREF(parent.p, storage);
    }
    Ref device(PyObject_GetAttr(parent.p, s_device));
    if (!device) return nullptr;
    auto one = [&](PyObject* step, PyObject* m) -> PyObject* {
        Ref v(PyObject_CallMethodOneArg(parent.p, s_then, step));
        return v ? make_tensor(v.p, m, device.p) : nullptr;
    };
    PyObject* dtype_name;
    int single = single_meta(meta, &dtype_name);
    if (single < 0) return nullptr;
    if (single) return one(PyTuple_GET_ITEM(steps, 0), meta);
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

// detach, alias: a new tensor on the argument's view.
PyObject* share(PyObject* args) {
    if (PyTuple_GET_SIZE(args) < 1) return nullptr;
    PyObject* t = PyTuple_GET_ITEM(args, 0);
    if (!PyObject_TypeCheck(t, (PyTypeObject*)cfg.tensor_type)) return nullptr;
    Ref v(PyObject_GetAttr(t, s_lazy));
    Ref m(v ? PyObject_GetAttr(t, s_meta) : nullptr);
    Ref device(m ? PyObject_GetAttr(v.p, s_device) : nullptr);
    return device ? make_tensor(v.p, m.p, device.p) : nullptr;
}

PyObject* call_handler(PyObject* func, PyObject* args, PyObject* kwargs) {
    Ref kw(kwargs ? Py_NewRef(kwargs) : PyDict_New());
    if (!kw) return nullptr;
    PyObject* call[3] = {func, args, kw.p};
    return PyObject_Vectorcall(cfg.fallback, call, 3, nullptr);
}

// Automatic graph cuts: once ``cut_every`` nodes were made since the last barrier, the next op
// calls ``cut_hook(func)`` first (lazy_torch/sync.py), which dispatches the pending graph, or
// returns True to be asked again before the op after it.
unsigned long long cut_every = 0, cut_mark = 0;
PyObject* cut_hook = nullptr;

// configure_cuts(every, hook): cut after ``every`` nodes (0: never); cut_reset(): a barrier ran.
PyObject* configure_cuts(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "configure_cuts(every, hook)");
        return nullptr;
    }
    unsigned long long every = PyLong_AsUnsignedLongLong(argv[0]);
    if (every == (unsigned long long)-1 && PyErr_Occurred()) return nullptr;
    cut_every = every;
    cut_mark = *core->nodes_made;
    Py_XSETREF(cut_hook, Py_NewRef(argv[1]));
    Py_RETURN_NONE;
}

PyObject* cut_reset(PyObject*, PyObject*) {
    cut_mark = *core->nodes_made;
    Py_RETURN_NONE;
}

// __torch_dispatch__(cls, func, types, args=(), kwargs=None), as a classmethod.
PyObject* dispatch(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (cut_every && nargs > 1 && *core->nodes_made - cut_mark >= cut_every) {
        cut_mark = *core->nodes_made;  // the hook's own ops do not call it again
        Ref done(PyObject_CallOneArg(cut_hook, argv[1]));  // hook(func)
        if (!done) return nullptr;
        // True: not here; ask again before the next op (the hook looks for its loop's head).
        if (done.p == Py_True) cut_mark = *core->nodes_made - cut_every;
    }
    if (nargs < 3 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "dispatch(cls, func, types, args=(), kwargs=None)");
        return nullptr;
    }
    if (cfg.fallback == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "lazy_torch._native: configure() was not called");
        return nullptr;
    }
    PyObject* func = argv[1];
    PyObject* args = nargs > 3 ? argv[3] : nullptr;
    PyObject* kwargs = nargs > 4 && argv[4] != Py_None ? argv[4] : nullptr;
    Ref empty_args;
    if (args == nullptr) {
        empty_args.p = PyTuple_New(0);
        args = empty_args.p;
    }
    auto found = registry.find(func);
    if (found != registry.end() && found->second.plan != nullptr && PyTuple_CheckExact(args) &&
        (kwargs == nullptr || PyDict_CheckExact(kwargs))) {
        PyObject* recording = PyDict_GetItemWithError(cfg.flags, s_recording);
        if (recording == nullptr || !PyObject_IsTrue(recording)) {
            PlanObject* plan = (PlanObject*)found->second.plan;
            if (kwargs != nullptr && PyDict_GET_SIZE(kwargs) == 0) kwargs = nullptr;
            PyObject* check = found->second.check;
            PyObject* out = nullptr;
            if (plan->kind == RECORD) {
                if (check == nullptr || value_checked(check, args, kwargs))
                    out = record_call(plan, args, kwargs, nullptr, nullptr, true);
            } else {
                out = plan->kind == VIEW ? view(plan, args, kwargs) : share(args);
            }
            if (out != nullptr) {
                handled++;
                return out;
            }
        }
        PyErr_Clear();  // whatever went wrong, the handler does the op again
    }
    handed++;
    return call_handler(func, args, kwargs);
}

PyObject* register_plan(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !Py_IS_TYPE(argv[1], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "register(func, plan: Plan)");
        return nullptr;
    }
    Registered& slot = registry[argv[0]];
    if (slot.plan == nullptr && slot.check == nullptr) Py_INCREF(argv[0]);  // the key lives on
    Py_XSETREF(slot.plan, Py_NewRef(argv[1]));
    Py_RETURN_NONE;
}

PyObject* register_value_check(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    PyObject* spec = nargs == 2 ? argv[1] : nullptr;
    if (spec == nullptr || !PyTuple_CheckExact(spec) || PyTuple_GET_SIZE(spec) != 3 ||
        !PyCallable_Check(PyTuple_GET_ITEM(spec, 0)) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 2))) {
        PyErr_SetString(PyExc_TypeError, "value_check(func, (check, positions, names))");
        return nullptr;
    }
    Registered& slot = registry[argv[0]];
    if (slot.plan == nullptr && slot.check == nullptr) Py_INCREF(argv[0]);
    Py_XSETREF(slot.check, Py_NewRef(spec));
    Py_RETURN_NONE;
}

// configure(**fields): any fields of Config by name, each checked against its type (nullptr: any
// object; callables are called).
struct Field {
    const char* name;
    PyObject** slot;
    PyTypeObject* type;
};
const Field fields[] = {
    {"tensor_type", &cfg.tensor_type, &PyType_Type},
    {"meta_type", &cfg.meta_type, &PyType_Type},
    {"foreign_type", &cfg.foreign_type, &PyType_Type},
    {"fallback", &cfg.fallback, nullptr},
    {"flags", &cfg.flags, &PyDict_Type},
    {"meta_cache", &cfg.meta_cache, &PyDict_Type},
    {"memo_entry", &cfg.memo_entry, nullptr},
    {"dtype_type", &cfg.dtype_type, &PyType_Type},
    {"dtype_names", &cfg.dtype_names, &PyDict_Type},
    {"dtype_name", &cfg.dtype_name, nullptr},
    {"device_type", &cfg.device_type, &PyType_Type},
    {"generator_type", &cfg.generator_type, &PyType_Type},
    {"symint_type", &cfg.symint_type, &PyType_Type},
    {"str_types", &cfg.str_types, &PyTuple_Type},
    {"scalar_leaf", &cfg.scalar_leaf, nullptr},
    {"constant", &cfg.constant, nullptr},
    {"storage", &cfg.storage, nullptr},
    {"operands", &cfg.operands, &PyTuple_Type},
    {"view_cache", &cfg.view_cache, &PyDict_Type},
    {"make_wrapper", &cfg.make_wrapper, nullptr},
    {"devices", &cfg.devices, &PyTuple_Type},
    {"getitem_op", &cfg.getitem_op, &PyUnicode_Type},
};

PyObject* configure(PyObject*, PyObject* args, PyObject* kw) {
    if (PyTuple_GET_SIZE(args) != 0 || kw == nullptr) {
        PyErr_SetString(PyExc_TypeError, "configure() takes its fields by keyword");
        return nullptr;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(kw, &pos, &k, &v)) {  // all checked before any is set
        const Field* field = nullptr;
        for (const Field& f : fields)
            if (PyUnicode_CompareWithASCIIString(k, f.name) == 0) field = &f;
        if (field == nullptr) {
            PyErr_Format(PyExc_TypeError, "configure(): no field %R", k);
            return nullptr;
        }
        if (field->type != nullptr && !PyObject_TypeCheck(v, field->type)) {
            PyErr_Format(PyExc_TypeError, "configure(): %s must be a %s", field->name,
                         field->type->tp_name);
            return nullptr;
        }
    }
    for (const Field& f : fields) {
        PyObject* value = PyDict_GetItemString(kw, f.name);  // borrowed
        if (value != nullptr) Py_XSETREF(*f.slot, Py_NewRef(value));
    }
    Py_RETURN_NONE;
}

PyObject* stats(PyObject*, PyObject*) {
    return Py_BuildValue("{sKsK}", "native", handled, "python", handed);
}

// ----------------------------------------------------------------------------------------------
// Plan(kind, func, name, mask=(), scalar_names=frozenset(), precision=None,
//      storage_relative=False)

PyObject* plan_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    static const char* names[] = {"kind",      "func",      "name", "mask", "scalar_names",
                                  "precision", "storage_relative", nullptr};
    long kind;
    PyObject *func, *name, *mask = nullptr, *scalar_names = nullptr, *precision = Py_None;
    int storage_relative = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "lOU|O!O!Op", (char**)names, &kind, &func,
                                     &name, &PyTuple_Type, &mask, &PyFrozenSet_Type,
                                     &scalar_names, &precision, &storage_relative))
        return nullptr;
    if (kind < RECORD || kind > SHARE) {
        PyErr_SetString(PyExc_ValueError, "Plan: kind is RECORD, VIEW or SHARE");
        return nullptr;
    }
    Ref empty_mask(mask ? Py_NewRef(mask) : PyTuple_New(0));
    Ref empty_names(scalar_names ? Py_NewRef(scalar_names) : PyFrozenSet_New(nullptr));
    if (!empty_mask || !empty_names) return nullptr;
    PlanObject* self = (PlanObject*)type->tp_alloc(type, 0);
    if (self == nullptr) return nullptr;
    self->kind = kind;
    self->func = Py_NewRef(func);
    self->name = Py_NewRef(name);
    self->mask = empty_mask.release();
    self->scalar_names = empty_names.release();
    self->precision = Py_NewRef(precision);
    self->storage_relative = storage_relative;
    return (PyObject*)self;
}

void plan_dealloc(PlanObject* self) {
    Py_XDECREF(self->func);
    Py_XDECREF(self->name);
    Py_XDECREF(self->mask);
    Py_XDECREF(self->scalar_names);
    Py_XDECREF(self->precision);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

PyObject* plan_repr(PlanObject* self) {
    static const char* kinds[] = {"RECORD", "VIEW", "SHARE"};
    return PyUnicode_FromFormat("Plan(%s, %U)", kinds[self->kind], self->name);
}

PyMemberDef plan_members[] = {
    {"kind", T_LONG, offsetof(PlanObject, kind), READONLY, "RECORD, VIEW or SHARE."},
    {"func", T_OBJECT, offsetof(PlanObject, func), READONLY, "The op."},
    {"name", T_OBJECT, offsetof(PlanObject, name), READONLY, "str(func)."},
    {"mask", T_OBJECT, offsetof(PlanObject, mask), READONLY,
     "RECORD: per positional slot, whether a number there is an operand."},
    {"scalar_names", T_OBJECT, offsetof(PlanObject, scalar_names), READONLY,
     "RECORD: keyword slots whose numbers are operands."},
    {"precision", T_OBJECT, offsetof(PlanObject, precision), READONLY,
     "RECORD: None, or a matmul's float32-precision callable."},
    {"storage_relative", T_BOOL, offsetof(PlanObject, storage_relative), READONLY,
     "VIEW: its steps start at the storage."},
    {nullptr, 0, 0, 0, nullptr}};

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef dispatch_methods[] = {
    {"stats", (PyCFunction)stats, METH_NOARGS,
     "Ops dispatch() did in C and ops it handed to their Python handlers, since import."},
    {"dispatch", FASTCALL(dispatch),
     "__torch_dispatch__ body: the op's plan in C where it can, else its Python handler."},
    {"register", FASTCALL(register_plan), "register(func, plan): func's Plan for dispatch()."},
    {"value_check", FASTCALL(register_value_check),
     "value_check(func, (check, positions, names)): run check(args, kwargs) before recording "
     "func in C when a number or CPU tensor fills one of those arguments."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Give the recording path the front end's classes, caches and callbacks."},
    {"configure_cuts", FASTCALL(configure_cuts),
     "configure_cuts(every, hook): call hook() before the op that follows `every` new nodes "
     "since the last barrier (0: never)."},
    {"cut_reset", (PyCFunction)cut_reset, METH_NOARGS, "A barrier ran: count nodes from here."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "lazy_torch._native",
                      "The per-op recording path of lazy tensors (see lazy_torch/csrc).", -1,
                      nullptr};

bool intern_names() {
    PyObject** names[] = {&s_lazy,      &s_meta, &s_device,  &s_node, &s_recording,
                          &s_precision, &s_then, &s_storage, &s_is_floating_point,
                          &s_dim,       &s_item, &s_dtype,   &s_type, &s_index, &s_cpu};
    const char* texts[] = {"_lazy",      "_meta", "device",  "node", "recording",
                           "_precision", "then",  "storage", "is_floating_point",
                           "dim",        "item",  "dtype",   "type", "index", "cpu"};
    static_assert(sizeof(names) / sizeof(names[0]) == sizeof(texts) / sizeof(texts[0]));
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == nullptr) return false;
    const char* dtypes[4] = {"bool", "int64", "float64", "complex128"};
    for (int i = 0; i < 4; i++)
        if ((scalar_dtypes[i] = PyUnicode_InternFromString(dtypes[i])) == nullptr) return false;
    return true;
}

bool add_plans(PyObject* module) {
    PlanType.tp_name = "lazy_torch._native.Plan";
    PlanType.tp_basicsize = sizeof(PlanObject);
    PlanType.tp_flags = Py_TPFLAGS_DEFAULT;
    PlanType.tp_doc =
        "Plan(kind, func, name, mask=(), scalar_names=frozenset(), precision=None, "
        "storage_relative=False): how dispatch() handles an op (see lazy_torch/csrc/native.h).";
    PlanType.tp_new = plan_new;
    PlanType.tp_dealloc = (destructor)plan_dealloc;
    PlanType.tp_repr = (reprfunc)plan_repr;
    PlanType.tp_members = plan_members;
    if (!core->add_type(module, &PlanType, "Plan")) return false;
    Ref numbers(Py_BuildValue("{OOOOOOOO}", &PyBool_Type, scalar_dtypes[0], &PyLong_Type,
                              scalar_dtypes[1], &PyFloat_Type, scalar_dtypes[2], &PyComplex_Type,
                              scalar_dtypes[3]));
    if (!numbers || PyModule_AddObject(module, "SCALAR_DTYPES", numbers.p) < 0) return false;
    numbers.release();
    return PyModule_AddIntConstant(module, "RECORD", RECORD) == 0 &&
           PyModule_AddIntConstant(module, "VIEW", VIEW) == 0 &&
           PyModule_AddIntConstant(module, "SHARE", SHARE) == 0;
}

}  // namespace

PyTypeObject PlanType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace lazy_native

PyMODINIT_FUNC PyInit__native(void) {
    using namespace lazy_native;
    core = (const CoreApi*)PyCapsule_Import(CORE_API_CAPSULE, 0);
    if (core == nullptr || !intern_names()) return nullptr;
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    if (PyModule_AddFunctions(m, dispatch_methods) < 0 || !add_plans(m) || !add_recording(m) ||
        !add_multi(m) || !add_autocast(m)) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
