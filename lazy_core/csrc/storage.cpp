// The Storage type of lazy_core/value.py as a C type (value.py documents it and keeps a Python
// twin for builds without this extension), and the registry of live storages.
//
// The registry is a list threaded through the storages themselves, in creation order: a storage
// joins it when made and leaves it in its dealloc, so it needs no weak reference and the registry
// no sweeping. A storage refers to a node, a device index and its views cache, none of which can
// lead back to a storage, so storages stay out of the cycle collector: a traced step leaves about
// half as many tracked objects to be promoted into the oldest generation.
#include "native.h"

namespace lazy_native {

struct StorageObject {
    PyObject_HEAD
    PyObject *node, *device, *views;  // views: None or a dict of view steps -> Access node
    void* buffer;                     // the device buffer the value last was (identity only)
    long long id;
    StorageObject *prev, *next;
};

PyTypeObject StorageType = {PyVarObject_HEAD_INIT(nullptr, 0)};
StorageObject *first = nullptr, *last = nullptr;  // live storages, oldest first
long long next_id = 0;
PyObject *s_data = nullptr, *s_op = nullptr, *s_payload = nullptr;
PyObject* view_type = nullptr;  // lazy_core.view.View, looked up at the first then()

// The payload of ``node`` if it is a device-data leaf, else nullptr; -1 on error.
int data_payload(PyObject* node, PyObject** payload) {
    *payload = nullptr;
    PyObject* op;
    Ref owned;
    if (Py_IS_TYPE(node, &NodeType)) {
        op = ((NodeObject*)node)->op;
    } else {
        owned.p = PyObject_GetAttr(node, s_op);
        if (!owned) return -1;
        op = owned.p;
    }
    int data = op == s_data ? 1 : PyObject_RichCompareBool(op, s_data, Py_EQ);
    if (data <= 0) return data;
    if (Py_IS_TYPE(node, &NodeType)) {
        *payload = ((NodeObject*)node)->payload;
        return 1;
    }
    Ref p(PyObject_GetAttr(node, s_payload));
    if (!p) return -1;
    *payload = p.p;  // borrowed from the node, which keeps it
    return 1;
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

PyObject* storage_tp_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    if (kwargs != nullptr && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Storage(node, device)");
        return nullptr;
    }
    return storage_new(type, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args), nullptr);
}

void storage_dealloc(StorageObject* self) {
    (self->prev ? self->prev->next : first) = self->next;
    (self->next ? self->next->prev : last) = self->prev;
    Py_XDECREF(self->node);
    Py_XDECREF(self->device);
    Py_XDECREF(self->views);
    PyObject_Free(self);
}

PyObject* storage_set(StorageObject* self, PyObject* node) {
    if (storage_set_node(self, node) < 0) return nullptr;
    Py_RETURN_NONE;
}

PyObject* storage_then(StorageObject* self, PyObject* step) {
    if (view_type == nullptr) {
        Ref module(PyImport_ImportModule("lazy_core.view"));
        if (!module) return nullptr;
        view_type = PyObject_GetAttrString(module.p, "View");
        if (view_type == nullptr) return nullptr;
    }
    Ref steps(PyTuple_Pack(1, step));
    if (!steps) return nullptr;
    return PyObject_CallFunctionObjArgs(view_type, (PyObject*)self, steps.p, nullptr);
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
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef storage_methods[] = {
    {"set", (PyCFunction)storage_set, METH_O, "Make node the value."},
    {"assign", (PyCFunction)storage_set, METH_O, "Make node the value (as a view with no steps)."},
    {"then", (PyCFunction)storage_then, METH_O, "A view of this storage: View(self, (step,))."},
    {nullptr, nullptr, 0, nullptr}};

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

PyMethodDef registry_methods[] = {
    {"live_storages", (PyCFunction)live_storages, METH_NOARGS, "Live storages, oldest first."},
    {"pending_and_held", (PyCFunction)pending_and_held, METH_NOARGS,
     "(pending storages, ids of the buffers the others hold); lazy_core/value.py."},
    {nullptr, nullptr, 0, nullptr}};

bool add_storages(PyObject* module) {
    s_data = PyUnicode_InternFromString("data");
    s_op = PyUnicode_InternFromString("op");
    s_payload = PyUnicode_InternFromString("payload");
    if (s_data == nullptr || s_op == nullptr || s_payload == nullptr) return false;
    StorageType.tp_name = "lazy_core._native.Storage";
    StorageType.tp_basicsize = sizeof(StorageObject);
    StorageType.tp_flags = Py_TPFLAGS_DEFAULT;
    StorageType.tp_doc = "The current value of one buffer (see lazy_core/value.py).";
    StorageType.tp_new = storage_tp_new;
    StorageType.tp_vectorcall = storage_vectorcall;
    StorageType.tp_dealloc = (destructor)storage_dealloc;
    StorageType.tp_repr = (reprfunc)storage_repr;
    StorageType.tp_getset = storage_getset;
    StorageType.tp_methods = storage_methods;
    if (PyType_Ready(&StorageType) < 0) return false;
    // A storage is the view of itself with no steps.
    Ref steps(PyTuple_New(0));
    if (!steps || PyDict_SetItemString(StorageType.tp_dict, "steps", steps.p) < 0 ||
        PyDict_SetItemString(StorageType.tp_dict, "writable", Py_True) < 0)
        return false;
    PyType_Modified(&StorageType);
    Py_INCREF(&StorageType);
    if (PyModule_AddObject(module, "Storage", (PyObject*)&StorageType) < 0) return false;
    return PyModule_AddFunctions(module, registry_methods) == 0;
}

}  // namespace lazy_native
