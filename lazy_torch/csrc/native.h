// Declarations shared by the translation units of lazy_torch's C extension lazy_torch._native,
// the per-op recording path of lazy tensors: dispatch.cpp (__torch_dispatch__, the plans'
// registry, views, configuration, the module), record.cpp (recording an op as IR: operands,
// templates, the shape memo), multi.cpp (a foreach op's elements, fused updates and the front
// end's own ops as one node each) and amp.cpp (autocast's casting kernels).
//
// It is built by pip install against the CPython API only (no torch headers) and reaches torch
// through the objects the front end configures (lazy_torch/dispatch.py). Nodes, storages and
// digests are lazy_core's, through lazy_core._native's capsule (lazy_core/csrc/core.h).
//
// (The other sources in this directory are the torch-linked extension that lazy_torch/_wrapper.py
// builds at first import.)
#pragma once

#include "core.h"

#include <unordered_map>

namespace lazy_native {

// lazy_core._native's functions (set when the module initializes).
extern const CoreApi* core;
inline bool is_node(PyObject* v) { return Py_IS_TYPE(v, core->node_type); }
inline PyObject* new_node(PyObject* const* argv) {  // Node(op, src, arg, dtype, shape)
    return core->node_new(core->node_type, argv, 5, nullptr);
}
inline bool absorb(Hasher& h, PyObject* v) { return core->absorb(h, v); }
inline PyObject* digest_int(const Digest& d) { return core->digest_int(d); }

// What the front end configures (dispatch.py's configure call names each field).
struct Config {
    PyObject* tensor_type = nullptr;   // the lazy tensor class (instances hold _lazy and _meta)
    PyObject* meta_type = nullptr;     // Meta (shape, stride, offset, dtype): a tuple subclass
    PyObject* foreign_type = nullptr;  // torch.Tensor: other tensors (0-dim CPU ones are scalars)
    PyObject* fallback = nullptr;      // dispatch(func, args, kwargs): the op's Python handler
    PyObject* flags = nullptr;         // a dict; a true "recording" entry sends every op to Python
    PyObject* meta_cache = nullptr;    // shape-inference memo: key -> (Meta, template)
    PyObject* memo_entry = nullptr;    // memo_entry(func, args, kwargs, key, template): on a miss
    PyObject* dtype_type = nullptr;    // torch.dtype
    PyObject* dtype_names = nullptr;   // dtype object -> IR dtype name
    PyObject* dtype_name = nullptr;    // dtype_name(dtype): the name, or the error for no name
    PyObject* device_type = nullptr;   // torch.device
    PyObject* generator_type = nullptr;  // torch.Generator: enters templates as None
    PyObject* symint_type = nullptr;   // torch.SymInt: enters templates as its int
    PyObject* str_types = nullptr;     // argument types that enter templates as str(value)
    PyObject* scalar_leaf = nullptr;   // scalar_leaf(value, dtype, wrapped): a graph parameter
    PyObject* constant = nullptr;      // constant(value, dtype, wrapped): a baked-in leaf
    PyObject* storage = nullptr;       // Storage(node, device)
    PyObject* operands = nullptr;      // tuple: Operand(i) for small i
    PyObject* view_cache = nullptr;    // view key -> (Meta or Metas, view steps)
    PyObject* make_wrapper = nullptr;  // make_wrapper(cls, shape, dtype=, device=): a new tensor
    PyObject* devices = nullptr;       // device objects by index
    PyObject* getitem_op = nullptr;    // the op name of a multi-output node's output i
};

extern Config cfg;
// Interned attribute names (dispatch.cpp makes them).
extern PyObject *s_lazy, *s_meta, *s_device, *s_node, *s_recording, *s_precision, *s_then,
    *s_storage, *s_is_floating_point, *s_dim, *s_item, *s_dtype, *s_type, *s_index, *s_cpu;
extern PyObject* scalar_dtypes[4];  // IR dtype names of bool, int, float, complex

// How dispatch() handles an op (a Plan's kind).
enum Kind { RECORD = 0, VIEW = 1, SHARE = 2 };

// An op's plan (lazy_torch._native.Plan): what dispatch() does with its calls, and what record()
// needs to record one. Made by the front end per op (dispatch.py's plan_of), read-only after.
struct PlanObject {
    PyObject_HEAD
    long kind;
    PyObject* func;          // the op
    PyObject* name;          // str(func): the node's op and the memo keys' first entry
    PyObject* mask;          // RECORD: per positional slot, whether a number there is an operand
    PyObject* scalar_names;  // RECORD: keyword slots whose numbers are operands (a frozenset)
    PyObject* precision;     // RECORD: None, or a matmul's float32-precision callable
    bool storage_relative;   // VIEW: its steps start at the storage, not at the tensor's view
};
extern PyTypeObject PlanType;

// One op's operands.
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

// record.cpp: the rules of operands and templates, and the shape memo.

// The marker of operand ``i`` (new reference).
PyObject* marker(Py_ssize_t i);
// Append ``item`` to ``list``, stealing it; false (with an error) when it is null or fails.
bool append(PyObject* list, PyObject* item);
// 0 for bool, 1 int, 2 float, 3 complex (exact types only); -1 otherwise.
int number_kind(PyObject* v);
// A lazy tensor's operand (its marker); PyTorch's error for one on another lazy device.
PyObject* lazy_operand(Operands& ops, PyObject* t);
// A tensor that is not lazy: a 0-dim CPU tensor is a scalar operand, any other an error.
PyObject* foreign_operand(Operands& ops, PyObject* t);
// A Python number's operand; ``share``: the same number object again is the same operand;
// ``parameter``: a graph parameter even where it is 0 or 1 (record.cpp: entry).
PyObject* scalar_operand(Operands& ops, PyObject* v, int kind, bool share = true,
                         bool parameter = false);
// A non-Scalar argument as a hashable template entry; with ``ops`` null, a view key's entry
// (a lazy tensor is its Meta).
PyObject* attr(Operands* ops, PyObject* v);
// The template of one call (args and kwargs entries), its operands into ``ops``.
bool template_of(PlanObject* plan, PyObject* args, PyObject* kwargs, Operands& ops, Ref& args_t,
                 Ref& kwargs_t);
// The template's digest and its memo digest with the operands' keys from ops.keys[first:].
bool memo_digest(PyObject* args_t, PyObject* kwargs_t, Operands& ops, Py_ssize_t first,
                 Digest& template_digest, Digest& out);
// The memo entry (Meta, template) of a call (new reference); on a miss, nullptr where ``fast``,
// else the front end's memo_entry fills it.
PyObject* memo(PlanObject* plan, const Digest& digest, PyObject* args, PyObject* kwargs,
               PyObject* args_t, PyObject* kwargs_t, bool fast);
// A node with one output per Meta (None where the op produces none).
PyObject* multi_node(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* metas);
// Output ``i`` of a multi-output node; ``source`` is the tuple (node,).
PyObject* output_node(PyObject* source, Py_ssize_t i);
// An op's new tensor for a single Meta, else a tensor per Meta in a tuple or list as ``meta`` is.
PyObject* wrap_outputs(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* meta,
                       PyObject* device);
// Whether (args, kwargs) are a tuple and a dict or None; else a TypeError naming ``what``.
bool call_arguments(PyObject* args, PyObject* kwargs, const char* what);
// ``kwargs``, or null for None or an empty dict.
PyObject* kwargs_or_null(PyObject* kwargs);
// 1 and the IR dtype name (borrowed) of a Meta; 0 for anything else (a sequence of Metas); -1
// with an error for a Meta whose dtype has no IR name.
int single_meta(PyObject* meta, PyObject** dtype_name);
// A new lazy tensor holding ``view`` (a Storage or View) with ``meta`` on device index ``device``.
PyObject* make_tensor(PyObject* view, PyObject* meta, PyObject* device);
// Record a call of ``plan``'s op (see record.cpp). ``fast``: dispatch()'s attempt, which
// declines (nullptr, no error set) wherever the op's Python handler must decide.
PyObject* record_call(PlanObject* plan, PyObject* args, PyObject* kwargs, PyObject* name,
                      PyObject* extra, bool fast);
// The digest key of a view call: (name, digest of its arguments with tensors as Metas).
PyObject* view_key(PyObject* name, PyObject* args, PyObject* kwargs);
// Add the recording functions (record, memo_key, view_key, wrap, fresh).
bool add_recording(PyObject* module);
// Add multi.cpp's functions (elements, foreach_outputs, update, outputs).
bool add_multi(PyObject* module);
// Add the CastKernel type (amp.cpp: autocast's casting kernels).
bool add_autocast(PyObject* module);

}  // namespace lazy_native
