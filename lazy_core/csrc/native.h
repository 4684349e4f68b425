// Declarations shared by the translation units of the C extension lazy_core._native:
// node.cpp (the IR Node type and the graph walk), storage.cpp (the Storage and View types and
// the registry of live storages), record.cpp (recording one op, or a foreach op's elements, as IR),
// amp.cpp (autocast's casting kernels) and dispatch.cpp (__torch_dispatch__, views, plans and
// configuration).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cstdint>
#include <unordered_map>

namespace lazy_native {

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

// ---------------------------------------------------------------------------------------------
// digest.cpp: type-exact 128-bit digests (lazy_core/digest.py is the twin and says why).

struct Digest {
    uint64_t lo = 0, hi = 0;
    bool operator==(const Digest& o) const { return lo == o.lo && hi == o.hi; }
};

// Two lanes of multiply-rotate rounds over a stream of 64-bit words; ``done`` mixes them.
struct Hasher {
    static constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL,
                              P3 = 0x165667B19E3779F9ULL, P4 = 0x85EBCA77C2B2AE63ULL,
                              P5 = 0x27D4EB2F165667C5ULL;
    uint64_t a = 0x243F6A8885A308D3ULL, b = 0x13198A2E03707344ULL, n = 0;
    static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
    static uint64_t avalanche(uint64_t x) {
        x ^= x >> 33;
        x *= P2;
        x ^= x >> 29;
        x *= P3;
        return x ^ (x >> 32);
    }
    void add(uint64_t w) {
        a = rotl(a + w * P2, 31) * P1;
        b = rotl(b ^ (w * P4), 27) * P3 + P5;
        n++;
    }
    Digest done() const {
        uint64_t x = avalanche(a + rotl(b, 23) + n * P5);
        uint64_t y = avalanche(b ^ x ^ (n * P1));
        return {x, y};
    }
};

// Word tags of the serialization (digest.py has the same).
enum Tag : uint64_t {
    TAG_NONE = 1, TAG_BOOL, TAG_INT, TAG_BIGINT, TAG_FLOAT, TAG_COMPLEX, TAG_STR, TAG_BYTES,
    TAG_TUPLE, TAG_SUBTUPLE, TAG_ATOM, TAG_NODE, TAG_GRAPH, TAG_DIGEST
};

// Feed ``v``'s type-exact serialization to ``h``; false with a TypeError for a value of a type
// the serialization does not know.
bool absorb(Hasher& h, PyObject* v);
// The digest of one value (false with a TypeError, as absorb).
bool digest_of(PyObject* v, Digest& out);
// A digest as a non-negative Python int below 2**128.
PyObject* digest_int(const Digest& d);
// Add digest() and register_atoms() to the module.
bool add_digests(PyObject* module);

// ---------------------------------------------------------------------------------------------
// node.cpp

struct NodeObject {
    PyObject_HEAD
    PyObject *op, *src, *arg, *dtype, *shape, *payload, *site;
    Py_hash_t hash;  // the digest's low 64 bits, for display
    Digest digest;   // type-exact structural digest: op, arg, dtype, shape and the sources'
    PyObject* weakrefs;
    // The graph walk's marks: the walk that last reached this node, and the node's post-order
    // position in it (-1 while on its stack). No map from nodes to positions is needed.
    unsigned long long walk;
    Py_ssize_t position;
};

extern PyTypeObject NodeType;
PyObject* node_new(PyTypeObject* type, PyObject* const* argv, size_t nargsf, PyObject* kwnames);
// A Node of (op, src, arg, dtype, shape) whose ``arg`` has digest ``arg_digest`` (the caller has
// it already); nullptr with an error.
PyObject* node_of(PyObject* const* argv, const Digest& arg_digest);
// Ready ``type`` and add it to the module as ``name``.
bool add_type(PyObject* module, PyTypeObject* type, const char* name);
// Ready the Node type; add it and the node functions (attribute_to, current_site, walk).
bool add_nodes(PyObject* module);

// ---------------------------------------------------------------------------------------------
// storage.cpp

// Ready the Storage and View types; add them and the registry functions (live_storages,
// pending_and_held).
bool add_storages(PyObject* module);
// ``value.assign(node)`` for a Storage or View ``value``, without the method lookup.
PyObject* assign(PyObject* value, PyObject* node);

// ---------------------------------------------------------------------------------------------
// record.cpp and dispatch.cpp

struct Config {
    PyObject* tensor_type = nullptr;   // the lazy tensor class (instances hold _lazy and _meta)
    PyObject* foreign_type = nullptr;  // other tensors: handed to `foreign`
    PyObject* fallback = nullptr;      // Python dispatch(func, args, kwargs)
    PyObject* flags = nullptr;         // a dict; a true "recording" entry sends every op to Python
    PyObject* meta_cache = nullptr;    // shape-inference memo: key -> Meta
    PyObject* constants = nullptr;     // (kind, value) -> constant Node
    PyObject* dtype_names = nullptr;   // dtype object -> IR dtype name
    PyObject* scalar_leaf = nullptr;   // scalar_leaf(value, dtype)
    PyObject* storage = nullptr;       // Storage(node, device)
    PyObject* wrap = nullptr;          // wrap(storage, meta) -> tensor
    PyObject* foreign = nullptr;       // foreign(t) -> (node, key); raises when t cannot be one
    PyObject* operands = nullptr;      // tuple: Operand(i) for small i
    PyObject* view_cache = nullptr;    // view key -> (Meta or Metas, view steps)
    PyObject* make_wrapper = nullptr;  // make_wrapper(cls, shape, dtype=, device=): a new tensor
    PyObject* devices = nullptr;       // device objects by index
    PyObject* str_types = nullptr;     // argument types that enter templates as str(value)
    PyObject* getitem_op = nullptr;    // the op name of a multi-output node's output i
};

extern Config cfg;
// Interned attribute names (dispatch.cpp makes them).
extern PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision, *s_then,
    *s_storage, *s_assign, *s_is_floating_point;
extern PyObject* scalar_dtypes[4];  // IR dtype names of bool, int, float, complex

// One op's operands, as the Python path's _Operands.
struct Operands {
    Ref srcs{PyList_New(0)};
    Ref keys{PyList_New(0)};
    Ref device;
    // Python numbers already made operands, by identity, and their operand positions: a number
    // used again (a foreach op's one scalar for every element) is the same operand.
    std::unordered_map<PyObject*, Py_ssize_t> scalars;
    // Where the current call's operands start in srcs: markers count from there (a foreach op's
    // elements each count from their own first operand).
    Py_ssize_t base = 0;
};

PyObject* attr(Operands* ops, PyObject* v);
bool is_single_meta(PyObject* meta, PyObject** dtype_name);
PyObject* make_tensor(PyObject* view, PyObject* meta, PyObject* device);
PyObject* record(PyObject* plan, PyObject* args, PyObject* kwargs);
// Add the recording functions (elements).
bool add_recording(PyObject* module);
// Add the CastKernel type (amp.cpp: autocast's casting kernels).
bool add_autocast(PyObject* module);
// Intern the attribute names; add dispatch, register, configure and stats.
bool add_dispatch(PyObject* module);

}  // namespace lazy_native
