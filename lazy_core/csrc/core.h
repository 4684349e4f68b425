// What lazy_core's C extension (lazy_core._native) shares with the extensions of front ends
// built on it (lazy_torch/csrc): owned references, digests, the Node object's layout, and the
// table of functions it exports as the capsule lazy_core._native.CORE_API (``import_core``).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cstdint>

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
// digest.cpp: type-exact 128-bit digests (lazy_core/digest.py says why).

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
    // The node's number in the order nodes are made: a node's sources are all made before it,
    // so a node made before another cannot read it (lazy_core/rebase.py stops its walks there).
    unsigned long long seq;
};

// ---------------------------------------------------------------------------------------------
// The functions lazy_core._native exports to front ends' extensions.

struct CoreApi {
    // The Node type (instances are NodeObject).
    PyTypeObject* node_type;
    // Node(op, src, arg, dtype, shape) from argv[0:5] (more positional arguments: payload).
    PyObject* (*node_new)(PyTypeObject* type, PyObject* const* argv, size_t nargsf,
                          PyObject* kwnames);
    // The same Node where ``arg``'s digest is known already.
    PyObject* (*node_of)(PyObject* const* argv, const Digest& arg_digest);
    // ``value.assign(node)`` for a Storage or View ``value``.
    PyObject* (*assign)(PyObject* value, PyObject* node);
    // Feed ``v``'s type-exact serialization to ``h`` (false with a TypeError for a value the
    // serialization does not know).
    bool (*absorb)(Hasher& h, PyObject* v);
    // A digest as a non-negative Python int below 2**128.
    PyObject* (*digest_int)(const Digest& d);
    // Ready ``type`` and add it to ``module`` as ``name``.
    bool (*add_type)(PyObject* module, PyTypeObject* type, const char* name);
    // How many nodes this process has made (a front end's automatic graph cuts read it).
    const unsigned long long* nodes_made;
};

constexpr const char* CORE_API_CAPSULE = "lazy_core._native.CORE_API";

}  // namespace lazy_native
