// Declarations shared by the translation units of lazy_core's C extension lazy_core._native:
// node.cpp (the IR Node type and the graph walk), digest.cpp (type-exact digests), storage.cpp
// (the Storage and View types, the registry of live storages and a barrier's bookkeeping) and
// module.cpp (the module, and the capsule of core.h's CoreApi for front ends' extensions).
#pragma once

#include "core.h"

namespace lazy_native {

// ---------------------------------------------------------------------------------------------
// digest.cpp

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

extern PyTypeObject NodeType;
PyObject* node_new(PyTypeObject* type, PyObject* const* argv, size_t nargsf, PyObject* kwnames);
// A Node of (op, src, arg, dtype, shape) whose ``arg`` has digest ``arg_digest`` (the caller has
// it already); nullptr with an error.
PyObject* node_of(PyObject* const* argv, const Digest& arg_digest);
extern unsigned long long nodes_made;  // every Node made so far
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

// Interned attribute names (module.cpp makes them).
extern PyObject* s_assign;

}  // namespace lazy_native
