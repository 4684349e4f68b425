// The module guards of lazy_torch.compile (capture.py's _Compiled._module_guards), in C++: they
// are read on every call of a compiled module, and in Python their loops over GPT-2's 164
// submodules and 149 parameters took several times as long (figures: benchmarks/RESULTS.md,
// "Capture and replay").
//
// module_guards(tensor_dicts, modules, attributes) returns three tuples:
// - each submodule's ``training`` (``modules``, a list);
// - per tensor of the dicts (``tensor_dicts``: the submodules' _parameters and _buffers, None
//   values skipped): its identity, the identity of its ``_lazy`` attribute (None without one)
//   and its ``requires_grad``;
// - per (dict, names) pair of ``attributes`` (a submodule's __dict__ and the names of its plain
//   attributes): each value and its type, type-exact (1, 1.0 and True differ), floats by their
//   value's bits (0.0 and -0.0 differ; a nan equals itself).
// Raises KeyError where an attribute name is gone (the caller then reads the module again).

#include <Python.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <vector>

namespace {

PyObject* s_lazy = nullptr;
PyObject* s_training = nullptr;

// Appends a new reference; false where it is null (an error is set).
bool push(std::vector<PyObject*>& out, PyObject* item) {
    if (item == nullptr) return false;
    out.push_back(item);
    return true;
}

PyObject* as_tuple(std::vector<PyObject*>& items) {
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    if (t == nullptr) {
        for (PyObject* o : items) Py_DECREF(o);
        return nullptr;
    }
    for (size_t i = 0; i < items.size(); i++) PyTuple_SET_ITEM(t, i, items[i]);
    items.clear();
    return t;
}

void release(std::vector<PyObject*>& items) {
    for (PyObject* o : items) Py_DECREF(o);
    items.clear();
}

bool training(PyObject* modules, std::vector<PyObject*>& out) {
    Py_ssize_t n = PyList_GET_SIZE(modules);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!push(out, PyObject_GetAttr(PyList_GET_ITEM(modules, i), s_training))) return false;
    }
    return true;
}

bool tensors(PyObject* dicts, std::vector<PyObject*>& out) {
    Py_ssize_t n = PyList_GET_SIZE(dicts);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* d = PyList_GET_ITEM(dicts, i);
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(d, &pos, &key, &value)) {
            if (value == Py_None) continue;
            if (!push(out, PyLong_FromVoidPtr(value))) return false;
            PyObject* view = PyObject_GetAttr(value, s_lazy);
            if (view == nullptr) {
                if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return false;
                PyErr_Clear();  // a tensor off the lazy device
                Py_INCREF(Py_None);
                out.push_back(Py_None);
            } else {
                out.push_back(PyLong_FromVoidPtr(view));
                Py_DECREF(view);
                if (out.back() == nullptr) return false;
            }
            bool grad = THPVariable_Check(value) && THPVariable_Unpack(value).requires_grad();
            PyObject* flag = grad ? Py_True : Py_False;
            Py_INCREF(flag);
            out.push_back(flag);
        }
    }
    return true;
}

bool attributes(PyObject* pairs, std::vector<PyObject*>& out) {
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* pair = PyList_GET_ITEM(pairs, i);
        PyObject* d = PyTuple_GET_ITEM(pair, 0);
        PyObject* names = PyTuple_GET_ITEM(pair, 1);
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
            PyObject* name = PyTuple_GET_ITEM(names, k);
            PyObject* v = PyDict_GetItemWithError(d, name);  // borrowed
            if (v == nullptr) {
                if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, name);
                return false;
            }
            PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(v));
            Py_INCREF(type);
            out.push_back(type);
            if (PyFloat_CheckExact(v)) {  // by its bits
                double x = PyFloat_AS_DOUBLE(v);
                long long bits;
                std::memcpy(&bits, &x, sizeof bits);
                if (!push(out, PyLong_FromLongLong(bits))) return false;
            } else {
                Py_INCREF(v);
                out.push_back(v);
            }
        }
    }
    return true;
}

PyObject* module_guards(PyObject*, PyObject* args) {
    HANDLE_TH_ERRORS
    PyObject *dicts, *modules, *pairs;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &dicts, &PyList_Type, &modules,
                          &PyList_Type, &pairs)) {
        return nullptr;
    }
    std::vector<PyObject*> items;
    PyObject *t1 = nullptr, *t2 = nullptr, *t3 = nullptr;
    if (training(modules, items)) t1 = as_tuple(items);
    if (t1 != nullptr && tensors(dicts, items)) t2 = as_tuple(items);
    if (t2 != nullptr && attributes(pairs, items)) t3 = as_tuple(items);
    if (t3 == nullptr) {
        release(items);
        Py_XDECREF(t1);
        Py_XDECREF(t2);
        return nullptr;
    }
    return Py_BuildValue("(NNN)", t1, t2, t3);
    END_HANDLE_TH_ERRORS
}

}  // namespace

PyMethodDef guards_methods[] = {
    {"module_guards", module_guards, METH_VARARGS,
     "module_guards(tensor_dicts, modules, attributes) -> (training, tensors, attributes): the "
     "guards lazy_torch.compile reads from a module on every call"},
    {nullptr, nullptr, 0, nullptr},
};

void init_guards() {
    s_lazy = PyUnicode_InternFromString("_lazy");
    s_training = PyUnicode_InternFromString("training");
}
