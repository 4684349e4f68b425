// The autograd side of lazy_torch/linear.py's fused linear layer, in C++.
//
// linear(record, x, weight, bias, transposed, dtype) calls record(x, weight, bias, transposed,
// dtype), which records the layer's one forward node and returns its output, and gives that
// output a LazyLinearBackward node as its grad_fn when autograd needs one. The node's backward
// calls the function set_linear_backward gave (it records the one backward node, or runs
// differentiable ops under create_graph). A torch.autograd.Function does the same from Python,
// at several times the host cost per layer: its context object, its Python forward and backward
// frames, and its handling of saved tensors and outputs. Returns NotImplemented, having recorded
// nothing, where an input carries a forward-mode gradient (the ordinary kernels handle that).

#include <Python.h>

#include <pybind11/pybind11.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <optional>
#include <type_traits>

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

PyObject* backward_fn = nullptr;  // set once (set_linear_backward); held for the process

PyObject* dtype_object(c10::ScalarType t) {
    PyObject* d = reinterpret_cast<PyObject*>(torch::getTHPDtype(t));
    Py_INCREF(d);
    return d;
}

struct LazyLinearBackward : Node {
    SavedVariable x, weight;
    bool transposed = false;
    c10::ScalarType dtype = c10::ScalarType::Float;
    std::optional<c10::ScalarType> bias_dtype;

    std::string name() const override { return "LazyLinearBackward"; }

    void release_variables() override {
        x.reset_data();
        weight.reset_data();
    }

    variable_list apply(variable_list&& grads) override {
        variable_list out(3);
        bool need[3];
        for (size_t i = 0; i < 3; i++) need[i] = task_should_compute_output(i);
        at::Tensor x_value = x.unpack(), w_value = weight.unpack();  // raise if released
        if (!grads[0].defined() || !(need[0] || need[1] || need[2])) return out;
        pybind11::gil_scoped_acquire gil;
        PyObject* args[9] = {
            THPVariable_Wrap(grads[0]), THPVariable_Wrap(x_value), THPVariable_Wrap(w_value),
            PyBool_FromLong(transposed), dtype_object(dtype),
            bias_dtype ? dtype_object(*bias_dtype) : Py_NewRef(Py_None),
            PyBool_FromLong(need[0]), PyBool_FromLong(need[1]), PyBool_FromLong(need[2]),
        };
        PyObject* result = PyObject_Vectorcall(backward_fn, args, 9, nullptr);
        for (PyObject* a : args) Py_XDECREF(a);
        if (result == nullptr) throw python_error();
        if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 3) {
            Py_DECREF(result);
            TORCH_CHECK(false, "lazy linear backward must return three gradients");
        }
        for (Py_ssize_t i = 0; i < 3; i++) {
            PyObject* g = PyTuple_GET_ITEM(result, i);
            if (g != Py_None) out[i] = THPVariable_Unpack(g);
        }
        Py_DECREF(result);
        return out;
    }
};

// The node, owned as torch's Edge owns nodes: c10::intrusive_ptr since torch 2.13, before that
// std::shared_ptr.
using NodePtr = decltype(torch::autograd::Edge::function);

template <class Ptr>
Ptr new_node() {
    if constexpr (std::is_same_v<Ptr, std::shared_ptr<Node>>) {
        return std::make_shared<LazyLinearBackward>();
    } else {
        return c10::make_intrusive<LazyLinearBackward>();
    }
}

bool fw_grad(const at::Tensor& t) { return t.defined() && t._fw_grad(0).defined(); }

bool tensor_args(PyObject* const* args) {
    for (int i = 1; i < 4; i++) {
        if (!THPVariable_Check(args[i]) && (i < 3 || args[i] != Py_None)) {
            PyErr_SetString(PyExc_TypeError, "linear(): x, weight (and bias) must be tensors");
            return false;
        }
    }
    if (!THPDtype_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "linear(): dtype must be a torch.dtype");
        return false;
    }
    return true;
}

PyObject* linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "linear() takes 6 arguments (%zd given)", nargs);
        return nullptr;
    }
    if (!tensor_args(args)) return nullptr;
    const at::Tensor& x = THPVariable_Unpack(args[1]);
    const at::Tensor& w = THPVariable_Unpack(args[2]);
    at::Tensor b = args[3] == Py_None ? at::Tensor() : THPVariable_Unpack(args[3]);
    if (fw_grad(x) || fw_grad(w) || fw_grad(b)) Py_RETURN_NOTIMPLEMENTED;
    PyObject* out = PyObject_Vectorcall(args[0], args + 1, 5, nullptr);
    if (out == nullptr) return nullptr;
    if (!torch::autograd::compute_requires_grad(x, w, b)) return out;
    if (!THPVariable_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "linear(): record must return a tensor");
        return nullptr;
    }
    NodePtr node = new_node<NodePtr>();
    auto* fn = static_cast<LazyLinearBackward*>(node.get());
    fn->set_next_edges(torch::autograd::collect_next_edges(x, w, b));
    fn->x = SavedVariable(x, false);
    fn->weight = SavedVariable(w, false);
    fn->transposed = PyObject_IsTrue(args[4]) == 1;
    fn->dtype = reinterpret_cast<THPDtype*>(args[5])->scalar_type;
    if (b.defined()) fn->bias_dtype = b.scalar_type();
    torch::autograd::set_history(THPVariable_Unpack(out), node);
    return out;
    END_HANDLE_TH_ERRORS
}

PyObject* set_linear_backward(PyObject*, PyObject* fn) {
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "set_linear_backward(): expected a callable");
        return nullptr;
    }
    Py_INCREF(fn);
    Py_XSETREF(backward_fn, fn);
    Py_RETURN_NONE;
}

// The tensors a LazyLinearBackward saved, for the grad_fn object fn (capture.py's check of what
// a call keeps alive); None for any other grad_fn, or one whose tensors a backward released.
PyObject* linear_saved(PyObject*, PyObject* fn) {
    HANDLE_TH_ERRORS
    if (!torch::autograd::THPCppFunction_Check(fn)) Py_RETURN_NONE;
    Node* node = reinterpret_cast<torch::autograd::THPCppFunction*>(fn)->cdata.get();
    auto* linear = dynamic_cast<LazyLinearBackward*>(node);
    if (linear == nullptr) Py_RETURN_NONE;
    at::Tensor x, w;
    try {
        x = linear->x.unpack();
        w = linear->weight.unpack();
    } catch (const c10::Error&) {  // released by a backward
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(NN)", THPVariable_Wrap(x), THPVariable_Wrap(w));
    END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef linear_methods[] = {
    {"linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(linear)),
     METH_FASTCALL,
     "linear(record, x, weight, bias, transposed, dtype): record(x, weight, bias, transposed, "
     "dtype) with a LazyLinearBackward grad_fn"},
    {"linear_saved", linear_saved, METH_O,
     "linear_saved(grad_fn) -> (x, weight) saved by a LazyLinearBackward, else None"},
    {"set_linear_backward", set_linear_backward, METH_O,
     "set_linear_backward(fn): fn(grad, x, weight, transposed, dtype, bias_dtype, need_x, "
     "need_w, need_b) -> (grad_x, grad_w, grad_b) runs each LazyLinearBackward"},
    {nullptr, nullptr, 0, nullptr},
};
