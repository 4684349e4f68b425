// Autocast's casting kernels in C (lazy_torch/amp.py): the kernel of an op whose policy runs it
// in one floating-point dtype, the autocast dtype or float32, casting its lazy operands.
//
// The dispatcher calls such a kernel for each handled op (a hundred in a transformer's forward),
// with the op's arguments. The kernel excludes the autocast key while the op runs (so the ops it
// decomposes into are not cast again), casts every lazy floating-point operand of another
// castable dtype through the front end's cast function (which keeps its weight cache), and calls
// the op. It does exactly what amp.py's Python kernel does for these policies, without that
// kernel's frames: the scan of the arguments and the key's exclusion are its per-call cost.

#include "native.h"

namespace lazy_native {
namespace {

PyObject* s_stack = nullptr;

// What every kernel shares, given by the front end: (state, cast, set_excluded, key, float32,
// castable). ``state.stack`` is the thread's autocast stack of (enabled, dtype, cache_enabled),
// innermost last; ``cast(t, dtype, cache)`` casts a tensor, or each tensor of a list or tuple;
// ``set_excluded(key, flag)`` sets the key's exclusion in this thread; ``castable`` holds the
// dtypes autocast may cast.
enum { STATE, CAST, SET_EXCLUDED, KEY, FLOAT32, CASTABLE, SHARED_SIZE };

struct CastKernel {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject* call;    // the op
    PyObject* shared;  // see above
    bool lower;        // cast to the autocast dtype (with its cache); else to float32, uncached
};

// Whether ``v`` is a lazy tensor that autocast casts to ``dtype``; -1 on an error.
int tensor_needs_cast(PyObject* v, PyObject* dtype, PyObject* castable) {
    if (!PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type)) return 0;
    Ref meta(PyObject_GetAttr(v, s_meta));
    if (!meta) return -1;
    if (!Py_IS_TYPE(meta.p, (PyTypeObject*)cfg.meta_type)) return 1;  // cast decides
    PyObject* have = PyTuple_GET_ITEM(meta.p, 3);
    return have == dtype ? 0 : PySequence_Contains(castable, have);
}

// The same for an argument: a tensor, or a list or tuple with such a tensor in it.
int needs_cast(PyObject* v, PyObject* dtype, PyObject* castable) {
    if (!PyList_Check(v) && !PyTuple_Check(v)) return tensor_needs_cast(v, dtype, castable);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); i++) {
        int r = tensor_needs_cast(PySequence_Fast_ITEMS(v)[i], dtype, castable);
        if (r != 0) return r;
    }
    return 0;
}

bool set_excluded(PyObject* shared, PyObject* flag) {
    PyObject* args[2] = {PyTuple_GET_ITEM(shared, KEY), flag};
    Ref done(PyObject_Vectorcall(PyTuple_GET_ITEM(shared, SET_EXCLUDED), args, 2, nullptr));
    return bool(done);
}

// The op on the arguments, each cast that needs it (the key already excluded).
PyObject* cast_and_call(CastKernel* self, PyObject* const* args, size_t nargsf,
                        PyObject* kwnames) {
    PyObject* shared = self->shared;
    Ref stack(PyObject_GetAttr(PyTuple_GET_ITEM(shared, STATE), s_stack));
    if (!stack) return nullptr;
    if (!PyList_Check(stack.p) || PyList_GET_SIZE(stack.p) == 0)  // a thread autograd started
        return PyObject_Vectorcall(self->call, args, nargsf, kwnames);
    Ref entry(Py_NewRef(PyList_GET_ITEM(stack.p, PyList_GET_SIZE(stack.p) - 1)));
    PyObject* top = entry.p;  // held: the casts run Python code
    if (!PyTuple_Check(top) || PyTuple_GET_SIZE(top) != 3) {
        PyErr_SetString(PyExc_TypeError, "autocast state entries are (enabled, dtype, cache)");
        return nullptr;
    }
    PyObject* dtype = self->lower ? PyTuple_GET_ITEM(top, 1) : PyTuple_GET_ITEM(shared, FLOAT32);
    PyObject* cache = self->lower ? PyTuple_GET_ITEM(top, 2) : Py_False;
    PyObject* castable = PyTuple_GET_ITEM(shared, CASTABLE);
    Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject** cast = nullptr;  // the arguments, owned, once one is cast
    PyObject* result = nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        int r = needs_cast(args[i], dtype, castable);
        if (r < 0) goto done;
        if (r == 0) continue;
        if (cast == nullptr) {
            cast = (PyObject**)PyMem_Calloc(n, sizeof(PyObject*));
            if (cast == nullptr) {
                PyErr_NoMemory();
                goto done;
            }
            for (Py_ssize_t k = 0; k < n; k++) cast[k] = Py_NewRef(args[k]);
        }
        PyObject* call[3] = {args[i], dtype, cache};
        PyObject* out = PyObject_Vectorcall(PyTuple_GET_ITEM(shared, CAST), call, 3, nullptr);
        if (out == nullptr) goto done;
        Py_SETREF(cast[i], out);
    }
    result = PyObject_Vectorcall(self->call, cast ? cast : args, PyVectorcall_NARGS(nargsf),
                                 kwnames);
done:
    if (cast != nullptr) {
        for (Py_ssize_t k = 0; k < n; k++) Py_XDECREF(cast[k]);
        PyMem_Free(cast);
    }
    return result;
}

PyObject* kernel_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf,
                            PyObject* kwnames) {
    CastKernel* self = (CastKernel*)callable;
    if (!set_excluded(self->shared, Py_True)) return nullptr;
    PyObject* result = cast_and_call(self, args, nargsf, kwnames);
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);  // the op's error survives restoring the key
    if (!set_excluded(self->shared, Py_False)) {
        Py_CLEAR(result);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return nullptr;
    }
    PyErr_Restore(type, value, traceback);
    return result;
}

PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    PyObject *call, *shared;
    int lower;
    static const char* names[] = {"call", "lower", "shared", nullptr};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OpO!", (char**)names, &call, &lower,
                                     &PyTuple_Type, &shared))
        return nullptr;
    if (PyTuple_GET_SIZE(shared) != SHARED_SIZE || !PyTuple_Check(PyTuple_GET_ITEM(shared, CASTABLE))) {
        PyErr_SetString(PyExc_TypeError,
                        "shared is (state, cast, set_excluded, key, float32, castable: tuple)");
        return nullptr;
    }
    if (cfg.tensor_type == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "lazy_torch._native: configure() was not called");
        return nullptr;
    }
    CastKernel* self = (CastKernel*)type->tp_alloc(type, 0);
    if (self == nullptr) return nullptr;
    self->vectorcall = kernel_vectorcall;
    self->call = Py_NewRef(call);
    self->shared = Py_NewRef(shared);
    self->lower = lower;
    return (PyObject*)self;
}

void kernel_dealloc(CastKernel* self) {
    Py_XDECREF(self->call);
    Py_XDECREF(self->shared);
    Py_TYPE(self)->tp_free((PyObject*)self);
}

PyTypeObject CastKernelType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

bool add_autocast(PyObject* module) {
    s_stack = PyUnicode_InternFromString("stack");
    if (s_stack == nullptr) return false;
    CastKernelType.tp_name = "lazy_torch._native.CastKernel";
    CastKernelType.tp_basicsize = sizeof(CastKernel);
    CastKernelType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
    CastKernelType.tp_doc =
        "CastKernel(call, lower, shared): an autocast kernel that casts the lazy operands of "
        "``call`` (see lazy_torch/csrc/amp.cpp).";
    CastKernelType.tp_new = kernel_new;
    CastKernelType.tp_dealloc = (destructor)kernel_dealloc;
    CastKernelType.tp_call = PyVectorcall_Call;
    CastKernelType.tp_vectorcall_offset = offsetof(CastKernel, vectorcall);
    return core->add_type(module, &CastKernelType, "CastKernel");
}

}  // namespace lazy_native
