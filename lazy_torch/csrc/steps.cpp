// Adam's step counts, counted in C++ (lazy_torch/fused.py's _steps).
//
// count_steps(steps) adds 1 to each of ``steps`` (a list or tuple) in place and returns their
// new values as Python floats, or returns None, having changed nothing, unless every one is a
// plain 0-dim CPU tensor of one floating dtype (float32 or float64, as the optimizers make them)
// that autograd does not track and the call is outside any TorchDispatchMode or
// TorchFunctionMode (which would observe the adds). It computes what
// ``torch._foreach_add_(steps, 1)`` and ``[s.item() for s in steps]`` compute, bumping each
// tensor's version as ``add_`` does. PyTorch's foreach add has no CPU kernel: it dispatches
// ``add_`` once a tensor and ``item`` another, a measurable part of a step's host time for
// GPT-2's 148 parameters (figures: benchmarks/RESULTS.md, "Optimizer steps").

#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/core/Tensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

namespace {

// Keys of tensors that are not plain dense CPU data, whose adds must go through the dispatcher.
const c10::DispatchKeySet kNotPlain({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                     c10::DispatchKey::Conjugate, c10::DispatchKey::Negative,
                                     c10::DispatchKey::ZeroTensor});

bool countable(const at::Tensor& t, c10::ScalarType dtype) {
    return t.defined() && t.device().is_cpu() && t.layout() == c10::kStrided && t.dim() == 0 &&
           t.scalar_type() == dtype && !t.requires_grad() && !t.is_inference() &&
           !t.key_set().has_any(kNotPlain) && t.has_storage() && t.const_data_ptr() != nullptr;
}

// Adds 1 to each of steps, then puts their values in out (a new list of their length); false
// (with a Python error) where a float could not be made.
template <class T>
bool count(const std::vector<at::Tensor>& steps, PyObject* out) {
    for (const at::Tensor& t : steps) {
        T* p = t.mutable_data_ptr<T>();
        *p = *p + T(1);
        t.unsafeGetTensorImpl()->bump_version();
    }
    for (size_t i = 0; i < steps.size(); i++) {
        PyObject* value = PyFloat_FromDouble(double(*steps[i].const_data_ptr<T>()));
        if (value == nullptr) return false;
        PyList_SET_ITEM(out, i, value);
    }
    return true;
}

PyObject* count_steps(PyObject*, PyObject* list) {  // a list or tuple; else None
    HANDLE_TH_ERRORS
    if (!PyList_Check(list) && !PyTuple_Check(list)) Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(list);
    if (n == 0 || c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
        at::impl::torch_function_mode_enabled()) {
        Py_RETURN_NONE;
    }
    std::vector<at::Tensor> steps;
    steps.reserve(n);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* item = PySequence_Fast_GET_ITEM(list, i);
        if (!THPVariable_CheckExact(item)) Py_RETURN_NONE;
        steps.push_back(THPVariable_Unpack(item));
    }
    c10::ScalarType dtype = steps[0].scalar_type();
    if (dtype != c10::kFloat && dtype != c10::kDouble) Py_RETURN_NONE;
    for (const at::Tensor& t : steps) {
        if (!countable(t, dtype)) Py_RETURN_NONE;
    }
    PyObject* out = PyList_New(n);
    if (out == nullptr) return nullptr;
    if (!(dtype == c10::kFloat ? count<float>(steps, out) : count<double>(steps, out))) {
        Py_DECREF(out);
        return nullptr;
    }
    return out;
    END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef steps_methods[] = {
    {"count_steps", count_steps, METH_O,
     "count_steps(steps): add 1 to each 0-dim CPU step tensor and return their values, or None "
     "(nothing changed) where that is not what torch._foreach_add_(steps, 1) would do alone"},
    {nullptr, nullptr, 0, nullptr},
};
