// Recording ops as IR, in C: the only implementation of the rules that turn an aten call into a
// node (lazy_torch/dispatch.py's record, record_elements, record_update and record_op call these).
//
// A call's arguments become a template (its ``arg``) and operands (its ``src``): lazy tensors
// become operands through their views' current nodes; Python numbers in Scalar slots become
// operands too, as baked-in constants (0 and 1; a negative zero is not 0 here, its sign matters to
// division) or as graph-parameter leaves (anything else, so changing them never recompiles); a
// 0-dim CPU tensor is a scalar operand the same way (eager CUDA takes one); other CPU tensors are
// a device mismatch, PyTorch's error. Each operand's place in the template is its marker, counted
// from the call's first operand. The shapes come from the shape memo, keyed by the digest of the
// template and the operands' Metas and number types; on a miss the front end's memo_entry runs
// shape inference (which raises eager's errors) and fills it.
//
// dispatch() (dispatch.cpp) records with ``fast`` set: where the op's Python handler must decide
// (a memo miss, an argument that is not lazy, a device keyword naming another device, any error)
// it declines without a trace, and the handler does the op, recording it here again in full.
//
// Written against the CPython C API (METH_FASTCALL, vectorcall): a binding layer's per-call
// argument conversion would cost as much as the work itself.

#include "native.h"

#include <cmath>
#include <initializer_list>

namespace lazy_native {

namespace {
PyObject* constants = nullptr;  // (number type, value) -> constant leaf: made once per value
}  // namespace

PyObject* marker(Py_ssize_t i) {
    if (i >= PyTuple_GET_SIZE(cfg.operands)) {  // a foreach op over many tensors
        Ref index(PyLong_FromSsize_t(i));
        if (!index) return nullptr;
        return PyObject_CallOneArg((PyObject*)Py_TYPE(PyTuple_GET_ITEM(cfg.operands, 0)), index.p);
    }
    return Py_NewRef(PyTuple_GET_ITEM(cfg.operands, i));
}

// The marker of the last operand.
PyObject* operand_marker(Operands& ops) {
    return marker(PyList_GET_SIZE(ops.srcs.p) - 1 - ops.base);
}

bool append(PyObject* list, PyObject* item) {  // steals item
    if (item == nullptr) return false;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc == 0;
}

// PyTorch's error for operands on two devices (``a`` and ``b`` are their names).
PyObject* device_mismatch(PyObject* a, PyObject* b) {
    if (a != nullptr && b != nullptr)
        PyErr_Format(PyExc_RuntimeError,
                     "Expected all tensors to be on the same device, but found at least two "
                     "devices, %U and %U!",
                     a, b);
    return nullptr;
}

PyObject* lazy_device_name(PyObject* index) {
    return index ? PyUnicode_FromFormat("lazy:%S", index) : PyUnicode_FromString("lazy:0");
}

PyObject* lazy_operand(Operands& ops, PyObject* t) {
    Ref view(PyObject_GetAttr(t, s_lazy));
    if (!view) return nullptr;
    Ref device(PyObject_GetAttr(view.p, s_device));
    if (!device) return nullptr;
    if (!ops.device) {
        ops.device.p = device.release();
    } else if (device.p != ops.device.p) {
        int same = PyObject_RichCompareBool(device.p, ops.device.p, Py_EQ);
        if (same < 0) return nullptr;
        if (!same) {
            Ref a(lazy_device_name(ops.device.p)), b(lazy_device_name(device.p));
            return device_mismatch(a.p, b.p);
        }
    }
    if (!append(ops.srcs.p, PyObject_GetAttr(view.p, s_node))) return nullptr;
    if (!append(ops.keys.p, PyObject_GetAttr(t, s_meta))) return nullptr;
    return operand_marker(ops);
}

// 0 for bool, 1 int, 2 float, 3 complex (exact types only); -1 otherwise.
int number_kind(PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyBool_Type) return 0;
    if (t == &PyLong_Type) return 1;
    if (t == &PyFloat_Type) return 2;
    if (t == &PyComplex_Type) return 3;
    return -1;
}

// 0 and 1 are baked into graphs; -0.0 is not 0 here (its sign matters to division).
bool is_constant(PyObject* v, int kind) {
    switch (kind) {
        case 0:
            return true;
        case 1: {
            int overflow = 0;
            long x = PyLong_AsLongAndOverflow(v, &overflow);
            return !overflow && (x == 0 || x == 1);
        }
        case 2: {
            double d = PyFloat_AS_DOUBLE(v);
            return (d == 0.0 && !std::signbit(d)) || d == 1.0;
        }
        default: {
            Py_complex c = PyComplex_AsCComplex(v);
            return c.imag == 0.0 && !std::signbit(c.imag) &&
                   ((c.real == 0.0 && !std::signbit(c.real)) || c.real == 1.0);
        }
    }
}

// The IR name of a dtype (new reference); the front end's error for one without a name.
PyObject* dtype_name_of(PyObject* dtype) {
    PyObject* name = PyDict_GetItemWithError(cfg.dtype_names, dtype);
    if (name != nullptr) return Py_NewRef(name);
    if (PyErr_Occurred()) return nullptr;
    return PyObject_CallOneArg(cfg.dtype_name, dtype);
}

// The leaf of number ``v`` (of kind ``kind``) in IR dtype ``dtype``: a constant for 0 and 1, else
// a graph parameter (always one with ``parameter``). ``wrapped``: a Python number, whose constants
// are shared; a 0-dim tensor's keeps its dtype in type promotion (its parameter is made a 0-dim
// tensor by the front end's scalar_leaf).
PyObject* scalar_node(PyObject* v, int kind, PyObject* dtype, bool wrapped,
                      bool parameter = false) {
    if (kind < 0 || parameter || !is_constant(v, kind)) {
        PyObject* call[3] = {v, dtype, wrapped ? Py_True : Py_False};
        return PyObject_Vectorcall(cfg.scalar_leaf, call, 3, nullptr);
    }
    Ref key;
    if (wrapped) {
        key.p = PyTuple_Pack(2, (PyObject*)Py_TYPE(v), v);
        if (!key) return nullptr;
        PyObject* known = PyDict_GetItemWithError(constants, key.p);
        if (known != nullptr) return Py_NewRef(known);
        if (PyErr_Occurred()) return nullptr;
    }
    PyObject* call[3] = {v, dtype, wrapped ? Py_True : Py_False};
    PyObject* node = PyObject_Vectorcall(cfg.constant, call, 3, nullptr);
    if (node != nullptr && wrapped && PyDict_SetItem(constants, key.p, node) < 0) Py_CLEAR(node);
    return node;
}

// A tensor that is not lazy: a 0-dim CPU tensor is a scalar operand (its memo key: its dtype);
// any other is PyTorch's device-mismatch error.
PyObject* foreign_operand(Operands& ops, PyObject* t) {
    Ref dim(PyObject_CallMethodNoArgs(t, s_dim));
    Ref device(dim ? PyObject_GetAttr(t, s_device) : nullptr);
    Ref type(device ? PyObject_GetAttr(device.p, s_type) : nullptr);
    if (!type) return nullptr;
    int cpu = PyObject_RichCompareBool(type.p, s_cpu, Py_EQ);
    if (cpu < 0) return nullptr;
    if (!cpu || !PyLong_CheckExact(dim.p) || PyLong_AsLong(dim.p) != 0) {
        Ref a(lazy_device_name(ops.device.p)), b(PyObject_Str(device.p));
        return device_mismatch(a.p, b.p);
    }
    Ref value(PyObject_CallMethodNoArgs(t, s_item));
    Ref dtype(value ? PyObject_GetAttr(t, s_dtype) : nullptr);
    Ref name(dtype ? dtype_name_of(dtype.p) : nullptr);
    if (!name) return nullptr;
    if (!append(ops.srcs.p, scalar_node(value.p, number_kind(value.p), name.p, false)))
        return nullptr;
    static PyObject* s_cpu_scalar = PyUnicode_InternFromString("cpu_scalar");
    if (!append(ops.keys.p, PyTuple_Pack(2, s_cpu_scalar, dtype.p))) return nullptr;
    return operand_marker(ops);
}

// A Python number's operand; ``share``: the same number object again is the same operand.
PyObject* scalar_operand(Operands& ops, PyObject* v, int kind, bool share, bool parameter) {
    PyObject* type = (PyObject*)Py_TYPE(v);
    if (!append(ops.keys.p, Py_NewRef(type))) return nullptr;
    auto seen = share ? ops.scalars.find(v) : ops.scalars.end();
    PyObject* node;
    if (seen != ops.scalars.end()) {  // the same number again: the same operand
        if (seen->second >= ops.base) return marker(seen->second - ops.base);
        node = Py_NewRef(PyList_GET_ITEM(ops.srcs.p, seen->second));  // an earlier element's
        seen->second = PyList_GET_SIZE(ops.srcs.p);
    } else {
        ops.scalars.emplace(v, PyList_GET_SIZE(ops.srcs.p));
        node = scalar_node(v, kind, scalar_dtypes[kind], true, parameter);
    }
    if (!append(ops.srcs.p, node)) return nullptr;
    return operand_marker(ops);
}

// ``slot``: 0 for an attribute, 1 where a number is an operand, 2 where it is one and a bool is a
// graph parameter (a fill's value: a flag that changes must not change the graph; 0 and 1 stay
// constants there, as ``torch.zeros`` and ``torch.ones`` fill with them).
PyObject* entry(Operands& ops, PyObject* v, int slot) {
    if (Py_TYPE(v) == (PyTypeObject*)cfg.tensor_type) return lazy_operand(ops, v);
    if (slot) {
        int kind = number_kind(v);
        if (kind >= 0) return scalar_operand(ops, v, kind, true, slot == 2 && kind == 0);
    }
    return attr(&ops, v);
}

// The template of one call (its args and kwargs entries), its operands into ``ops``.
bool template_of(PlanObject* plan, PyObject* args, PyObject* kwargs, Operands& ops, Ref& args_t,
                 Ref& kwargs_t) {
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    args_t.p = PyTuple_New(n);
    if (!args_t) return false;
    Py_ssize_t slots = PyTuple_GET_SIZE(plan->mask);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* m = i < slots ? PyTuple_GET_ITEM(plan->mask, i) : Py_False;
        int slot = m == Py_True ? 1 : PyLong_CheckExact(m) ? (int)PyLong_AsLong(m) : 0;
        PyObject* e = entry(ops, PyTuple_GET_ITEM(args, i), slot);
        if (e == nullptr) return false;
        PyTuple_SET_ITEM(args_t.p, i, e);
    }
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    kwargs_t.p = PyTuple_New(nk);
    if (!kwargs_t) return false;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    while (nk && PyDict_Next(kwargs, &pos, &k, &v)) {
        int scalar_slot = PySet_Contains(plan->scalar_names, k);
        if (scalar_slot < 0) return false;
        Ref e(entry(ops, v, scalar_slot == 1 ? 1 : 0));
        PyObject* pair = e ? PyTuple_Pack(2, k, e.p) : nullptr;
        if (pair == nullptr) return false;
        PyTuple_SET_ITEM(kwargs_t.p, i++, pair);
    }
    return true;
}

// The digest of a call's template, digest((args_t, kwargs_t)), and its memo digest with the
// operands' keys from ops.keys[first:]: digest_with(template digest, keys).
bool memo_digest(PyObject* args_t, PyObject* kwargs_t, Operands& ops, Py_ssize_t first,
                 Digest& template_digest, Digest& out) {
    Hasher t;
    t.add(TAG_TUPLE);
    t.add(2);
    if (!absorb(t, args_t) || !absorb(t, kwargs_t)) return false;
    template_digest = t.done();
    Py_ssize_t nkeys = PyList_GET_SIZE(ops.keys.p) - first;
    Hasher h;
    h.add(TAG_DIGEST);
    h.add(template_digest.lo);
    h.add(template_digest.hi);
    h.add(TAG_TUPLE);
    h.add((uint64_t)nkeys);
    for (Py_ssize_t i = 0; i < nkeys; i++)
        if (!absorb(h, PyList_GET_ITEM(ops.keys.p, first + i))) return false;
    out = h.done();
    return true;
}

// The memo entry (a new reference) of a call of ``plan``'s op with this memo digest: (Meta, the
// template as first recorded, which equal calls' nodes share). On a miss: nullptr without an
// error where ``fast``, else the front end's memo_entry, which infers and fills it.
PyObject* memo(PlanObject* plan, const Digest& digest, PyObject* args, PyObject* kwargs,
               PyObject* args_t, PyObject* kwargs_t, bool fast) {
    Ref d(digest_int(digest));
    Ref key(d ? PyTuple_Pack(2, plan->name, d.p) : nullptr);
    if (!key) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(cfg.meta_cache, key.p);
    if (entry != nullptr) {
        Py_INCREF(entry);
    } else {
        if (PyErr_Occurred() || fast) return nullptr;
        Ref template_(PyTuple_Pack(2, args_t, kwargs_t));
        Ref kw(kwargs ? Py_NewRef(kwargs) : PyDict_New());
        if (!template_ || !kw) return nullptr;
        PyObject* call[5] = {plan->func, args, kw.p, key.p, template_.p};
        entry = PyObject_Vectorcall(cfg.memo_entry, call, 5, nullptr);
        if (entry == nullptr) return nullptr;
    }
    if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2) return entry;
    Py_DECREF(entry);
    PyErr_SetString(PyExc_TypeError, "shape memo entries are (meta, template)");
    return nullptr;
}

// A node with one output per Meta of ``metas`` (None where the op produces none): its dtypes and
// shapes are tuples.
PyObject* multi_node(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* metas) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    Ref dtypes(PyTuple_New(n)), shapes(PyTuple_New(n));
    if (!dtypes || !shapes) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *dtype = Py_None, *shape = Py_None;
        if (items[i] != Py_None) {
            int single = single_meta(items[i], &dtype);
            if (single <= 0) {
                if (single == 0)
                    PyErr_Format(PyExc_TypeError, "%U: output %zd is not a Meta", name, i);
                return nullptr;
            }
            shape = PyTuple_GET_ITEM(items[i], 0);
        }
        PyTuple_SET_ITEM(dtypes.p, i, Py_NewRef(dtype));
        PyTuple_SET_ITEM(shapes.p, i, Py_NewRef(shape));
    }
    PyObject* node_args[5] = {name, srcs, arg, dtypes.p, shapes.p};
    return new_node(node_args);
}

// Output ``i`` of a multi-output node; ``source`` is the tuple (node,).
PyObject* output_node(PyObject* source, Py_ssize_t i) {
    NodeObject* node = (NodeObject*)PyTuple_GET_ITEM(source, 0);
    Ref index(PyLong_FromSsize_t(i));
    if (!index) return nullptr;
    PyObject* args[5] = {cfg.getitem_op, source, index.p, PyTuple_GET_ITEM(node->dtype, i),
                         PyTuple_GET_ITEM(node->shape, i)};
    return new_node(args);
}

// A new tensor with its own storage holding ``node``.
PyObject* fresh(PyObject* node, PyObject* meta, PyObject* device) {
    PyObject* storage_args[2] = {node, device};
    Ref storage(PyObject_Vectorcall(cfg.storage, storage_args, 2, nullptr));
    return storage ? make_tensor(storage.p, meta, device) : nullptr;
}

// The outputs of an op: for a single Meta its tensor; else one node and a tensor per output on
// its getitem node (None where the op produces none), in a tuple or list as ``meta`` is.
PyObject* wrap_outputs(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* meta,
                       PyObject* device) {
    PyObject* dtype_name;
    int single = single_meta(meta, &dtype_name);
    if (single < 0) return nullptr;
    if (single) {
        PyObject* node_args[5] = {name, srcs, arg, dtype_name, PyTuple_GET_ITEM(meta, 0)};
        Ref node(new_node(node_args));
        return node ? fresh(node.p, meta, device) : nullptr;
    }
    if (!PyTuple_CheckExact(meta) && !PyList_CheckExact(meta)) {
        PyErr_Format(PyExc_TypeError, "%U: its output metadata is neither a Meta nor a sequence",
                     name);
        return nullptr;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(meta);
    PyObject** items = PySequence_Fast_ITEMS(meta);
    Ref node(multi_node(name, srcs, arg, meta));
    Ref source(node ? PyTuple_Pack(1, node.p) : nullptr);
    Ref outs(PyTuple_New(n));
    if (!source || !outs) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* out = Py_None;
        if (items[i] == Py_None) {
            Py_INCREF(out);
        } else {
            Ref output(output_node(source.p, i));
            out = output ? fresh(output.p, items[i], device) : nullptr;
            if (out == nullptr) return nullptr;
        }
        PyTuple_SET_ITEM(outs.p, i, out);
    }
    return PyTuple_CheckExact(meta) ? outs.release() : PySequence_List(outs.p);
}

// The device index of a call without lazy operands (a factory): its ``device`` keyword's index,
// else 0.
PyObject* device_of(PyObject* kwargs) {
    PyObject* d = kwargs ? PyDict_GetItemWithError(kwargs, s_device) : nullptr;
    if (d == nullptr && PyErr_Occurred()) return nullptr;
    if (d == nullptr || d == Py_None) return PyLong_FromLong(0);
    Ref device(PyObject_TypeCheck(d, (PyTypeObject*)cfg.device_type)
                   ? Py_NewRef(d)
                   : PyObject_CallOneArg(cfg.device_type, d));
    Ref index(device ? PyObject_GetAttr(device.p, s_index) : nullptr);
    if (!index) return nullptr;
    return index.p == Py_None ? PyLong_FromLong(0) : index.release();
}

// Whether the ``device`` keyword is absent, None or the device of index ``device``.
bool on_own_device(PyObject* kwargs, PyObject* device) {
    PyObject* v = PyDict_GetItemWithError(kwargs, s_device);
    if (v == nullptr || v == Py_None) return v == Py_None || !PyErr_Occurred();
    Py_ssize_t index = PyLong_AsSsize_t(device);
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices)) return false;
    return PyObject_RichCompareBool(v, PyTuple_GET_ITEM(cfg.devices, index), Py_EQ) == 1;
}

// ``kwargs_t`` extended by runtime keyword entries (new reference): the matmul precision in
// force, then ``extra(device)``'s (key, value) pairs, a Node value becoming an operand.
PyObject* runtime_kwargs(PlanObject* plan, PyObject* extra, PyObject* kwargs_t, PyObject* device,
                         Operands& ops) {
    Ref out(Py_NewRef(kwargs_t));
    if (plan->precision != Py_None) {
        Ref p(PyObject_CallNoArgs(plan->precision));
        Ref added(p ? Py_BuildValue("((OO))", s_precision, p.p) : nullptr);
        if (!added) return nullptr;
        Py_SETREF(out.p, PySequence_Concat(out.p, added.p));
        if (!out) return nullptr;
    }
    if (extra == nullptr || extra == Py_None) return out.release();
    Ref pairs(PyObject_CallOneArg(extra, device));
    if (!pairs) return nullptr;
    if (!PyTuple_CheckExact(pairs.p)) {
        PyErr_SetString(PyExc_TypeError, "record's extra(device) returns a tuple of pairs");
        return nullptr;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(pairs.p);
    Ref added(PyTuple_New(n));
    if (!added) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* pair = PyTuple_GET_ITEM(pairs.p, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "record's extra(device) returns a tuple of pairs");
            return nullptr;
        }
        PyObject* v = PyTuple_GET_ITEM(pair, 1);
        Ref value;
        if (is_node(v)) {
            if (!append(ops.srcs.p, Py_NewRef(v))) return nullptr;
            value.p = operand_marker(ops);
        } else {
            value.p = Py_NewRef(v);
        }
        PyObject* entry = value ? PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), value.p) : nullptr;
        if (entry == nullptr) return nullptr;
        PyTuple_SET_ITEM(added.p, i, entry);
    }
    Py_SETREF(out.p, PySequence_Concat(out.p, added.p));
    return out.release();
}


PyObject* attr(Operands* ops, PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || v == Py_None || t == &PyBool_Type ||
        t == &PyFloat_Type)
        return Py_NewRef(v);
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type))
        return ops ? lazy_operand(*ops, v) : PyObject_GetAttr(v, s_meta);
    if (PyTuple_Check(v) || PyList_Check(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject** items = PySequence_Fast_ITEMS(v);
        Ref out(PyTuple_New(n));
        if (!out) return nullptr;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject* e = attr(ops, items[i]);
            if (e == nullptr) return nullptr;
            PyTuple_SET_ITEM(out.p, i, e);
        }
        return out.release();
    }
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.foreign_type)) {
        if (ops) return foreign_operand(*ops, v);
        PyErr_SetString(PyExc_TypeError, "a view's arguments cannot hold a tensor off device lazy");
        return nullptr;
    }
    if (t == (PyTypeObject*)cfg.dtype_type) return dtype_name_of(v);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cfg.str_types); i++)
        if (t == (PyTypeObject*)PyTuple_GET_ITEM(cfg.str_types, i)) return PyObject_Str(v);
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.generator_type)) Py_RETURN_NONE;
    if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.symint_type)) return PyNumber_Long(v);
    return Py_NewRef(v);  // the digest refuses what cannot be part of a key
}

int single_meta(PyObject* meta, PyObject** dtype_name) {
    if (!Py_IS_TYPE(meta, (PyTypeObject*)cfg.meta_type)) return 0;
    PyObject* dtype = PyTuple_GET_ITEM(meta, 3);
    *dtype_name = PyDict_GetItemWithError(cfg.dtype_names, dtype);
    if (*dtype_name != nullptr) return 1;
    if (!PyErr_Occurred()) Py_XDECREF(PyObject_CallOneArg(cfg.dtype_name, dtype));  // its error
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError, "dtype %R has no IR name", dtype);
    return -1;
}

namespace {

bool is_dense(PyObject* shape, PyObject* stride) {
    if (!PyTuple_Check(shape) || !PyTuple_Check(stride)) return false;
    Py_ssize_t n = PyTuple_GET_SIZE(shape);
    if (PyTuple_GET_SIZE(stride) != n) return false;
    long long expected = 1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        long long st = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
        if (PyErr_Occurred() || st != expected) return false;
        expected *= size > 1 ? size : 1;
    }
    return true;
}

PyObject* interned_names(std::initializer_list<const char*> names) {
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(names.size()));
    Py_ssize_t i = 0;
    for (const char* name : names) PyTuple_SET_ITEM(t, i++, PyUnicode_InternFromString(name));
    return t;
}

}  // namespace

PyObject* make_tensor(PyObject* view, PyObject* meta, PyObject* device) {
    if (cfg.tensor_type == nullptr || cfg.meta_type == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "lazy_torch._native: configure() was not called");
        return nullptr;
    }
    if (!Py_IS_TYPE(meta, (PyTypeObject*)cfg.meta_type)) {
        PyErr_Format(PyExc_TypeError, "a lazy tensor's metadata is a Meta, not %R", meta);
        return nullptr;
    }
    Py_ssize_t index = PyLong_Check(device) ? PyLong_AsSsize_t(device) : -1;
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "lazy device index %R out of range", device);
        return nullptr;
    }
    PyObject* shape = PyTuple_GET_ITEM(meta, 0);
    PyObject* stride = PyTuple_GET_ITEM(meta, 1);
    PyObject* offset = PyTuple_GET_ITEM(meta, 2);
    PyObject* dtype = PyTuple_GET_ITEM(meta, 3);
    PyObject* dev = PyTuple_GET_ITEM(cfg.devices, index);
    // A dense tensor at offset 0 passes only what it must: keyword arguments cost their parsing.
    // Interned, as a call's keyword names in Python code are: the callee matches them by identity.
    static PyObject* dense_kwnames = interned_names({"dtype", "device"});
    static PyObject* strided_kwnames =
        interned_names({"strides", "storage_offset", "dtype", "device"});
    long at = PyLong_Check(offset) ? PyLong_AsLong(offset) : -1;
    bool dense = at == 0 && is_dense(shape, stride);
    PyErr_Clear();
    Ref t;
    if (dense) {
        PyObject* call[4] = {cfg.tensor_type, shape, dtype, dev};
        t.p = PyObject_Vectorcall(cfg.make_wrapper, call, 2, dense_kwnames);
    } else {
        PyObject* call[6] = {cfg.tensor_type, shape, stride, offset, dtype, dev};
        t.p = PyObject_Vectorcall(cfg.make_wrapper, call, 2, strided_kwnames);
    }
    if (!t || PyObject_SetAttr(t.p, s_lazy, view) < 0 || PyObject_SetAttr(t.p, s_meta, meta) < 0)
        return nullptr;
    return t.release();
}

PyObject* record_call(PlanObject* plan, PyObject* args, PyObject* kwargs, PyObject* name,
                      PyObject* extra, bool fast) {
    Operands ops;
    if (!ops.srcs || !ops.keys) return nullptr;
    Ref args_t, kwargs_t;
    if (!template_of(plan, args, kwargs, ops, args_t, kwargs_t)) return nullptr;
    Digest template_digest, digest;
    if (!memo_digest(args_t.p, kwargs_t.p, ops, 0, template_digest, digest)) return nullptr;
    Ref entry(memo(plan, digest, args, kwargs, args_t.p, kwargs_t.p, fast));
    if (!entry) return nullptr;
    PyObject* meta = PyTuple_GET_ITEM(entry.p, 0);
    Ref device;
    if (ops.device) {
        device.p = Py_NewRef(ops.device.p);
    } else {
        if (fast) return nullptr;  // factories take their device from keywords
        device.p = device_of(kwargs);
        if (!device) return nullptr;
    }
    if (fast && kwargs && !on_own_device(kwargs, device.p)) return nullptr;  // _to_copy to CPU
    Ref kw(runtime_kwargs(plan, extra, kwargs_t.p, device.p, ops));
    if (!kw) return nullptr;
    bool own = kw.p != kwargs_t.p;  // this node's own template: the memo's plus runtime entries
    // Equal calls' nodes share the memo's template (and its digest).
    Ref arg(own ? PyTuple_Pack(2, args_t.p, kw.p) : Py_NewRef(PyTuple_GET_ITEM(entry.p, 1)));
    Ref srcs(arg ? PyList_AsTuple(ops.srcs.p) : nullptr);
    if (!srcs) return nullptr;
    PyObject* op = name != nullptr && name != Py_None ? name : plan->name;
    PyObject* dtype_name;
    int single = single_meta(meta, &dtype_name);
    if (single < 0) return nullptr;
    if (!single) return wrap_outputs(op, srcs.p, arg.p, meta, device.p);
    PyObject* node_args[5] = {op, srcs.p, arg.p, dtype_name, PyTuple_GET_ITEM(meta, 0)};
    Ref node(own ? new_node(node_args) : core->node_of(node_args, template_digest));
    return node ? fresh(node.p, meta, device.p) : nullptr;
}

PyObject* view_key(PyObject* name, PyObject* args, PyObject* kwargs) {
    Ref args_k(attr(nullptr, args));
    if (!args_k) return nullptr;
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    Ref kwargs_k(PyTuple_New(nk));
    if (!kwargs_k) return nullptr;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    while (nk && PyDict_Next(kwargs, &pos, &k, &v)) {
        Ref e(attr(nullptr, v));
        PyObject* pair = e ? PyTuple_Pack(2, k, e.p) : nullptr;
        if (pair == nullptr) return nullptr;
        PyTuple_SET_ITEM(kwargs_k.p, i++, pair);
    }
    Hasher h;
    h.add(TAG_TUPLE);
    h.add(2);
    if (!absorb(h, args_k.p) || !absorb(h, kwargs_k.p)) return nullptr;
    Ref digest(digest_int(h.done()));
    return digest ? PyTuple_Pack(2, name, digest.p) : nullptr;
}

bool call_arguments(PyObject* args, PyObject* kwargs, const char* what) {
    if (PyTuple_Check(args) && (kwargs == Py_None || PyDict_Check(kwargs))) return true;
    PyErr_Format(PyExc_TypeError, "%s: args must be a tuple and kwargs a dict or None", what);
    return false;
}

PyObject* kwargs_or_null(PyObject* kwargs) {
    return kwargs == Py_None || PyDict_GET_SIZE(kwargs) == 0 ? nullptr : kwargs;
}

namespace {

// record(plan, args, kwargs, name=None, extra=None): one node for a call of plan's op, and its
// new tensor(s). ``name`` records it as another op; ``extra(device)`` gives runtime keyword
// entries, (key, value) pairs whose Node values become operands (RNG state).
PyObject* py_record(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs < 3 || nargs > 5 || !Py_IS_TYPE(argv[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "record(plan, args, kwargs, name=None, extra=None)");
        return nullptr;
    }
    if (!call_arguments(argv[1], argv[2], "record")) return nullptr;
    return record_call((PlanObject*)argv[0], argv[1], kwargs_or_null(argv[2]),
                       nargs > 3 ? argv[3] : nullptr, nargs > 4 ? argv[4] : nullptr, false);
}

// memo_key(plan, args, kwargs): the shape memo's key of this call.
PyObject* py_memo_key(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 3 || !Py_IS_TYPE(argv[0], &PlanType)) {
        PyErr_SetString(PyExc_TypeError, "memo_key(plan, args, kwargs)");
        return nullptr;
    }
    if (!call_arguments(argv[1], argv[2], "memo_key")) return nullptr;
    PlanObject* plan = (PlanObject*)argv[0];
    Operands ops;
    Ref args_t, kwargs_t;
    Digest template_digest, digest;
    if (!ops.srcs || !ops.keys ||
        !template_of(plan, argv[1], kwargs_or_null(argv[2]), ops, args_t, kwargs_t) ||
        !memo_digest(args_t.p, kwargs_t.p, ops, 0, template_digest, digest))
        return nullptr;
    Ref d(digest_int(digest));
    return d ? PyTuple_Pack(2, plan->name, d.p) : nullptr;
}

// view_key(name, args, kwargs): the view memo's key of a call of view op ``name``.
PyObject* py_view_key(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(argv[0])) {
        PyErr_SetString(PyExc_TypeError, "view_key(name, args, kwargs)");
        return nullptr;
    }
    if (!call_arguments(argv[1], argv[2], "view_key")) return nullptr;
    return view_key(argv[0], argv[1], kwargs_or_null(argv[2]));
}

// wrap(view, meta): a new lazy tensor holding ``view`` (a Storage or View).
PyObject* py_wrap(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wrap(view, meta)");
        return nullptr;
    }
    Ref device(PyObject_GetAttr(argv[0], s_device));
    return device ? make_tensor(argv[0], argv[1], device.p) : nullptr;
}

// fresh(node, device, meta): a new lazy tensor with its own storage holding ``node``.
PyObject* py_fresh(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "fresh(node, device, meta)");
        return nullptr;
    }
    return fresh(argv[0], argv[2], argv[1]);
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef recording_methods[] = {
    {"record", FASTCALL(py_record),
     "record(plan, args, kwargs, name=None, extra=None): one node for a call, and its tensor(s)."},
    {"memo_key", FASTCALL(py_memo_key), "memo_key(plan, args, kwargs): the shape memo's key."},
    {"view_key", FASTCALL(py_view_key), "view_key(name, args, kwargs): the view memo's key."},
    {"wrap", FASTCALL(py_wrap), "wrap(view, meta): a lazy tensor holding view."},
    {"fresh", FASTCALL(py_fresh), "fresh(node, device, meta): a lazy tensor with its own storage."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_recording(PyObject* module) {
    constants = PyDict_New();
    return constants != nullptr && PyModule_AddFunctions(module, recording_methods) == 0;
}

}  // namespace lazy_native
