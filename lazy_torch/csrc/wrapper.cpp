// Wrapper tensors of device 'lazy', made in C++ (lazy_torch/_wrapper.py builds and loads this).
//
// make_wrapper(cls, shape, *, strides=None, storage_offset=None, dtype, device,
//              requires_grad=False)
// makes what torch.Tensor._make_wrapper_subclass makes for those arguments: a storage-less
// TensorImpl of the device's dispatch key with the Python keys, wrapped as an instance of ``cls``.
// PyTorch's version goes through its general argument parser, most of its time per call; every
// op on a lazy tensor makes one or more of these, so this one reads exactly what lazy_torch
// passes and nothing else.
//
// set_detach(dispatch, func): the TensorImpl is LazyImpl, whose shallow_copy_and_detach (what
// autograd calls to save an output, to unpack it in the backward, and for .data) calls
// ``dispatch(func, (cls,), (self,), {})``: the class's __torch_dispatch__ with aten.detach.
// PyTorch's own route there imports torch and looks up torch.ops.aten.detach.default for each
// call, most of what a saved output cost (figures: benchmarks/RESULTS.md, "Host time per op");
// under a TorchDispatchMode, with the Python key excluded or before set_detach, LazyImpl does what
// TensorImpl does.

#include <Python.h>

#include <ATen/core/PythonFallbackKernel.h>
#include <ATen/core/TensorBase.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

using Ints = c10::SmallVector<int64_t, 6>;

PyObject *s_strides, *s_storage_offset, *s_dtype, *s_device, *s_requires_grad;

PyObject *s_dispatch, *s_detach;  // set_detach's arguments (owned; null until then)

struct LazyImpl final : c10::TensorImpl {
    using c10::TensorImpl::TensorImpl;

    c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
        const c10::VariableVersion& version, bool allow_metadata_change) const override {
        return detach(version, allow_metadata_change);
    }

    c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
        c10::VariableVersion&& version, bool allow_metadata_change) const override {
        return detach(std::move(version), allow_metadata_change);
    }

  private:
    // Both overloads: TensorImpl's own, or the tensor __torch_dispatch__ gives for aten.detach.
    template <typename Version>
    c10::intrusive_ptr<c10::TensorImpl> detach(Version&& version,
                                               bool allow_metadata_change) const {
        auto r = detached();
        if (!r)
            return c10::TensorImpl::shallow_copy_and_detach(std::forward<Version>(version),
                                                            allow_metadata_change);
        r->set_version_counter(std::forward<Version>(version));
        r->set_allow_tensor_metadata_change(allow_metadata_change);
        return r;
    }

    // The detached tensor's impl, from __torch_dispatch__; null where TensorImpl's own applies.
    c10::intrusive_ptr<c10::TensorImpl> detached() const {
        if (s_dispatch == nullptr || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
            c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python))
            return {};
        pybind11::gil_scoped_acquire gil;
        at::impl::MaybeSetTLSOnEntryGuard guard;
        auto self = c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(
            const_cast<LazyImpl*>(this));
        PyObject* tensor = THPVariable_Wrap(at::TensorBase(std::move(self)));
        PyObject* out = nullptr;
        if (tensor != nullptr) {
            PyObject* types = PyTuple_Pack(1, reinterpret_cast<PyObject*>(Py_TYPE(tensor)));
            PyObject* args = PyTuple_Pack(1, tensor);
            PyObject* kwargs = PyDict_New();
            if (types && args && kwargs) {
                PyObject* argv[] = {s_detach, types, args, kwargs};
                out = PyObject_Vectorcall(s_dispatch, argv, 4, nullptr);
            }
            Py_XDECREF(types);
            Py_XDECREF(args);
            Py_XDECREF(kwargs);
            Py_DECREF(tensor);
        }
        if (out == nullptr) {
            python_error e;
            e.persist();
            throw e;
        }
        if (!THPVariable_Check(out)) {
            Py_DECREF(out);
            TORCH_CHECK(false, "detach of a lazy tensor returned no tensor");
        }
        auto r = THPVariable_Unpack(out).getIntrusivePtr();
        Py_DECREF(out);  // the impl keeps the Python object, as after PyTorch's own detach
        return r;
    }
};

bool ints(PyObject* seq, Ints& out, const char* what) {
    if (!PyTuple_Check(seq) && !PyList_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "make_wrapper(): %s must be a tuple of ints, not %s", what,
                     Py_TYPE(seq)->tp_name);
        return false;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    out.resize(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "make_wrapper(): %s must be a tuple of ints, not %s",
                         what, Py_TYPE(items[i])->tp_name);
            return false;
        }
        out[i] = PyLong_AsLongLong(items[i]);
        if (out[i] == -1 && PyErr_Occurred()) return false;
    }
    return true;
}

bool is(PyObject* name, PyObject* interned) {
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

// Bytes a tensor of these sizes and strides spans from the start of its storage.
int64_t span(const Ints& sizes, const Ints& strides, int64_t offset, int64_t itemsize) {
    int64_t last = offset;
    for (size_t i = 0; i < sizes.size(); i++) {
        if (sizes[i] == 0) return 0;
        last += (sizes[i] - 1) * strides[i];
    }
    return (last + 1) * itemsize;
}

PyObject* make(PyTypeObject* cls, const Ints& sizes, const Ints* strides, int64_t offset,
               c10::ScalarType dtype, c10::Device device, bool requires_grad) {
    Ints dense;
    if (strides == nullptr) {
        dense.resize(sizes.size());
        int64_t acc = 1;
        for (size_t i = sizes.size(); i-- > 0;) {
            dense[i] = acc;
            acc *= sizes[i] > 1 ? sizes[i] : 1;
        }
    }
    const Ints& st = strides ? *strides : dense;
    auto meta = c10::scalarTypeToTypeMeta(dtype);
    c10::Storage storage(c10::Storage::use_byte_size_t{},
                         span(sizes, st, offset, static_cast<int64_t>(meta.itemsize())),
                         c10::DataPtr(nullptr, device), c10::GetAllocator(c10::kMeta),
                         /*resizable=*/true);
    auto key = c10::computeDispatchKey(dtype, c10::kStrided, device);
    auto impl = c10::make_intrusive<LazyImpl>(std::move(storage), c10::DispatchKeySet(key), meta);
    if (strides == nullptr && offset == 0)
        impl->set_sizes_contiguous(sizes);
    else
        impl->set_sizes_and_strides(sizes, st, offset);
    impl->set_python_dispatch(true);  // ops reach the class's __torch_dispatch__
    at::TensorBase tensor(std::move(impl));
    if (requires_grad) tensor.set_requires_grad(true);
    return THPVariable_Wrap(tensor, cls);
}

PyObject* make_wrapper(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "make_wrapper() takes 2 positional arguments (%zd given)",
                     nargs);
        return nullptr;
    }
    PyObject *strides = Py_None, *offset = Py_None, *dtype = nullptr, *device = nullptr;
    PyObject* requires_grad = Py_False;
    Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nk; k++) {
        PyObject* name = PyTuple_GET_ITEM(kwnames, k);
        PyObject* value = args[nargs + k];
        if (is(name, s_dtype)) dtype = value;
        else if (is(name, s_device)) device = value;
        else if (is(name, s_strides)) strides = value;
        else if (is(name, s_storage_offset)) offset = value;
        else if (is(name, s_requires_grad)) requires_grad = value;
        else {
            PyErr_Format(PyExc_TypeError, "make_wrapper() got an unexpected keyword argument '%U'",
                         name);
            return nullptr;
        }
    }
    PyObject* cls = args[0];
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject*)cls,
                                                (PyTypeObject*)THPVariableClass)) {
        PyErr_SetString(PyExc_TypeError, "make_wrapper(): cls must be a torch.Tensor subclass");
        return nullptr;
    }
    if (dtype == nullptr || !THPDtype_Check(dtype) || device == nullptr ||
        !THPDevice_Check(device)) {
        PyErr_SetString(PyExc_TypeError,
                        "make_wrapper(): dtype (a torch.dtype) and device (a torch.device) are "
                        "required");
        return nullptr;
    }
    Ints sizes, given;
    if (!ints(args[1], sizes, "shape")) return nullptr;
    for (int64_t n : sizes) {
        if (n < 0) {
            PyErr_Format(PyExc_ValueError, "make_wrapper(): negative dimension %lld",
                         static_cast<long long>(n));
            return nullptr;
        }
    }
    if (strides != Py_None && !ints(strides, given, "strides")) return nullptr;
    if (strides != Py_None && given.size() != sizes.size()) {
        PyErr_SetString(PyExc_ValueError, "make_wrapper(): shape and strides differ in length");
        return nullptr;
    }
    int64_t start = offset == Py_None ? 0 : PyLong_AsLongLong(offset);
    if (start == -1 && PyErr_Occurred()) return nullptr;
    int grad = PyObject_IsTrue(requires_grad);
    if (grad < 0) return nullptr;
    try {
        return make((PyTypeObject*)cls, sizes, strides == Py_None ? nullptr : &given, start,
                    reinterpret_cast<THPDtype*>(dtype)->scalar_type,
                    reinterpret_cast<THPDevice*>(device)->device, grad != 0);
    } catch (const c10::Error& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
    }
    return nullptr;
}

PyObject* set_detach(PyObject*, PyObject* args) {
    PyObject *dispatch, *func;
    if (!PyArg_ParseTuple(args, "OO:set_detach", &dispatch, &func)) return nullptr;
    if (dispatch == Py_None) {  // back to TensorImpl's own
        Py_CLEAR(s_dispatch);
        Py_CLEAR(s_detach);
        Py_RETURN_NONE;
    }
    Py_INCREF(dispatch);
    Py_INCREF(func);
    Py_XSETREF(s_dispatch, dispatch);
    Py_XSETREF(s_detach, func);
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"make_wrapper", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(make_wrapper)),
     METH_FASTCALL | METH_KEYWORDS,
     "make_wrapper(cls, shape, *, strides=None, storage_offset=None, dtype, device, "
     "requires_grad=False): torch.Tensor._make_wrapper_subclass for these arguments"},
    {"set_detach", set_detach, METH_VARARGS,
     "set_detach(dispatch, func): lazy tensors' shallow_copy_and_detach calls "
     "dispatch(func, (cls,), (self,), {}); set_detach(None, None) undoes it"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "lazy_torch_wrapper", nullptr, -1, methods};

}  // namespace

extern PyMethodDef linear_methods[];  // linear.cpp
extern PyMethodDef steps_methods[];   // steps.cpp
extern PyMethodDef guards_methods[];  // guards.cpp
void init_guards();                   // guards.cpp

PyMODINIT_FUNC PyInit_lazy_torch_wrapper() {
    s_strides = PyUnicode_InternFromString("strides");
    s_storage_offset = PyUnicode_InternFromString("storage_offset");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_device = PyUnicode_InternFromString("device");
    s_requires_grad = PyUnicode_InternFromString("requires_grad");
    init_guards();
    PyObject* m = PyModule_Create(&module);
    for (PyMethodDef* more : {linear_methods, steps_methods, guards_methods}) {
        if (m != nullptr && PyModule_AddFunctions(m, more) < 0) Py_CLEAR(m);
    }
    return m;
}
