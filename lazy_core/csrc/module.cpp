// The module lazy_core._native: the IR's types and functions, and the capsule CORE_API through
// which front ends' extensions (lazy_torch/csrc) make nodes, assign values and digest.
#include "native.h"

namespace lazy_native {

PyObject* s_assign = nullptr;

namespace {

const CoreApi api = {&NodeType, node_new,   node_of,    assign,
                     absorb,    digest_int, add_type,   &nodes_made};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "lazy_core._native",
                      "The IR's types in C: Node, Storage, View, digests (see lazy_core/csrc).", -1,
                      nullptr};

}  // namespace
}  // namespace lazy_native

PyMODINIT_FUNC PyInit__native(void) {
    using namespace lazy_native;
    if (s_assign == nullptr && (s_assign = PyUnicode_InternFromString("assign")) == nullptr)
        return nullptr;
    PyObject* m = PyModule_Create(&module);
    if (m == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New((void*)&api, CORE_API_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "CORE_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    if (!add_nodes(m) || !add_digests(m) || !add_storages(m)) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
