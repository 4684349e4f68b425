// The per-op recording fast path, in C: one call from __torch_dispatch__ records a common op
// (arguments that are lazy tensors, Python numbers and plain attributes; a memoized single-output
// shape) as one IR node and returns its new tensor.
//
// It mirrors the front end's Python path (lazy_torch/dispatch.py: _template, record) step by step
// and knows nothing of torch: the front end configures it with its tensor class, node and storage
// constructors, caches and callbacks. Anything it does not handle exactly like the Python path
// (an op without a registered plan, an uncached shape, a multi-output op, an unusual argument, an
// error) makes it call the Python path instead, which does the whole op again. So it never
// raises an error of its own and never leaves a half-recorded op.
//
// Written against the CPython C API (METH_FASTCALL, vectorcall): a binding layer's per-call
// argument conversion would cost as much as the Python work this replaces.

#include "native.h"

#include <cmath>
#include <initializer_list>

namespace lazy_native {

// The marker of operand ``i``: from the table, past it a new one of the table's type (a foreach
// op over many tensors has thousands of operands).
PyObject* marker(Py_ssize_t i) {
    if (i >= PyTuple_GET_SIZE(cfg.operands)) {
        Ref index(PyLong_FromSsize_t(i));
        if (!index) return nullptr;
        return PyObject_CallOneArg((PyObject*)Py_TYPE(PyTuple_GET_ITEM(cfg.operands, 0)), index.p);
    }
    PyObject* m = PyTuple_GET_ITEM(cfg.operands, i);
    Py_INCREF(m);
    return m;
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

PyObject* lazy_operand(Operands& ops, PyObject* t) {
    Ref view(PyObject_GetAttr(t, s_lazy));
    if (!view) return nullptr;
    Ref device(PyObject_GetAttr(view.p, s_device));
    if (!device) return nullptr;
    if (!ops.device) {
        ops.device.p = device.release();
    } else if (device.p != ops.device.p &&
               PyObject_RichCompareBool(device.p, ops.device.p, Py_EQ) != 1) {
        return nullptr;  // the Python path raises PyTorch's device-mismatch error
    }
    if (!append(ops.srcs.p, PyObject_GetAttr(view.p, s_node))) return nullptr;
    if (!append(ops.keys.p, PyObject_GetAttr(t, s_meta))) return nullptr;
    return operand_marker(ops);
}

PyObject* foreign_operand(Operands& ops, PyObject* t) {
    Ref pair(PyObject_CallOneArg(cfg.foreign, t));
    if (!pair || !PyTuple_Check(pair.p) || PyTuple_GET_SIZE(pair.p) != 2) return nullptr;
    PyObject* node = PyTuple_GET_ITEM(pair.p, 0);
    PyObject* key = PyTuple_GET_ITEM(pair.p, 1);
    Py_INCREF(node);
    Py_INCREF(key);
    if (!append(ops.srcs.p, node) || !append(ops.keys.p, key)) return nullptr;
    return operand_marker(ops);
}

// 0 for bool, 1 int, 2 float, 3 complex (exact types only, as the Python path); -1 otherwise.
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

// A Python number's operand; ``share``: the same number object again is the same operand.
PyObject* scalar_operand(Operands& ops, PyObject* v, int kind, bool share = true) {
    PyObject* type = (PyObject*)Py_TYPE(v);
    Py_INCREF(type);
    if (!append(ops.keys.p, type)) return nullptr;
    auto seen = share ? ops.scalars.find(v) : ops.scalars.end();
    PyObject* node;
    if (seen != ops.scalars.end()) {  // the same number again: the same operand
        if (seen->second >= ops.base) return marker(seen->second - ops.base);
        node = PyList_GET_ITEM(ops.srcs.p, seen->second);  // an earlier element's: this one's too
        Py_INCREF(node);
        seen->second = PyList_GET_SIZE(ops.srcs.p);
    } else {
        ops.scalars.emplace(v, PyList_GET_SIZE(ops.srcs.p));
        if (is_constant(v, kind)) {
            Ref key(PyTuple_Pack(2, type, v));
            if (!key) return nullptr;
            node = PyDict_GetItemWithError(cfg.constants, key.p);  // borrowed
            if (node == nullptr) return nullptr;  // made once, by the Python path
            Py_INCREF(node);
        } else {
            PyObject* call[2] = {v, scalar_dtypes[kind]};
            node = PyObject_Vectorcall(cfg.scalar_leaf, call, 2, nullptr);
        }
    }
    if (!append(ops.srcs.p, node)) return nullptr;
    return operand_marker(ops);
}

// A dtype as its IR name, a device, layout or memory format as its str; nullptr for anything
// else (generators, symbolic ints, ...: the Python path's).
PyObject* named(PyObject* v) {
    PyObject* name = PyDict_GetItemWithError(cfg.dtype_names, v);
    if (name != nullptr) {
        Py_INCREF(name);
        return name;
    }
    if (PyErr_Occurred()) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(cfg.str_types); i++) {
        if (Py_TYPE(v) == (PyTypeObject*)PyTuple_GET_ITEM(cfg.str_types, i)) return PyObject_Str(v);
    }
    return nullptr;
}

// A non-Scalar argument as a hashable entry. In a template (``ops`` given; the Python path's
// _attr) a lazy tensor becomes an operand; in a view's memo key (``ops`` null; _view_key) it is
// its Meta. Sequences become tuples, dtypes their names, other plain values stay themselves.
PyObject* attr(Operands* ops, PyObject* v) {
    PyTypeObject* t = Py_TYPE(v);
    if (t == &PyLong_Type || t == &PyUnicode_Type || v == Py_None || t == &PyBool_Type ||
        t == &PyFloat_Type) {
        Py_INCREF(v);
        return v;
    }
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
    if (ops && PyObject_TypeCheck(v, (PyTypeObject*)cfg.foreign_type))
        return foreign_operand(*ops, v);
    return named(v);
}

PyObject* entry(Operands& ops, PyObject* v, bool scalar_slot) {
    if (Py_TYPE(v) == (PyTypeObject*)cfg.tensor_type) return lazy_operand(ops, v);
    if (scalar_slot) {
        int kind = number_kind(v);
        if (kind >= 0) return scalar_operand(ops, v, kind);
    }
    return attr(&ops, v);
}

bool is_single_meta(PyObject* meta, PyObject** dtype_name) {
    if (!PyTuple_CheckExact(meta) || PyTuple_GET_SIZE(meta) != 4) return false;
    *dtype_name = PyDict_GetItemWithError(cfg.dtype_names, PyTuple_GET_ITEM(meta, 3));
    return *dtype_name != nullptr;
}

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

// A new tensor holding ``view`` on device ``device`` (the Python path's wrap). A dense tensor at
// offset 0 passes only what it must: keyword arguments cost their parsing.
PyObject* make_tensor(PyObject* view, PyObject* meta, PyObject* device) {
    PyObject* shape = PyTuple_GET_ITEM(meta, 0);
    PyObject* stride = PyTuple_GET_ITEM(meta, 1);
    PyObject* offset = PyTuple_GET_ITEM(meta, 2);
    Py_ssize_t index = PyLong_Check(device) ? PyLong_AsSsize_t(device) : -1;
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices) || !PyLong_Check(offset)) {
        PyErr_Clear();
        PyObject* wrap_args[2] = {view, meta};
        return PyObject_Vectorcall(cfg.wrap, wrap_args, 2, nullptr);
    }
    // Interned, as a call's keyword names in Python code are: the callee can match them by
    // identity.
    static PyObject* dense_kwnames = interned_names({"dtype", "device"});
    static PyObject* strided_kwnames =
        interned_names({"strides", "storage_offset", "dtype", "device"});
    PyObject* dtype = PyTuple_GET_ITEM(meta, 3);
    PyObject* dev = PyTuple_GET_ITEM(cfg.devices, index);
    bool dense = PyLong_AsLong(offset) == 0 && is_dense(shape, stride);
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

// A new tensor with its own storage holding ``node`` (the Python path's fresh).
PyObject* fresh(PyObject* node, PyObject* meta, PyObject* device) {
    PyObject* storage_args[2] = {node, device};
    Ref storage(PyObject_Vectorcall(cfg.storage, storage_args, 2, nullptr));
    return storage ? make_tensor(storage.p, meta, device) : nullptr;
}

// The template of one call of a RECORD plan's op (the Python path's _template).
bool template_of(PyObject* plan, PyObject* args, PyObject* kwargs, Operands& ops, Ref& args_t,
                 Ref& kwargs_t) {
    PyObject* mask = PyTuple_GET_ITEM(plan, 2);
    PyObject* scalar_names = PyTuple_GET_ITEM(plan, 3);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    args_t.p = PyTuple_New(n);
    if (!args_t) return false;
    Py_ssize_t slots = PyTuple_GET_SIZE(mask);
    for (Py_ssize_t i = 0; i < n; i++) {
        bool scalar_slot = i < slots && PyTuple_GET_ITEM(mask, i) == Py_True;
        PyObject* e = entry(ops, PyTuple_GET_ITEM(args, i), scalar_slot);
        if (e == nullptr) return false;
        PyTuple_SET_ITEM(args_t.p, i, e);
    }
    Py_ssize_t nk = kwargs ? PyDict_GET_SIZE(kwargs) : 0;
    kwargs_t.p = PyTuple_New(nk);
    if (!kwargs_t) return false;
    if (nk) {
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(kwargs, &pos, &k, &v)) {
            int scalar_slot = PySet_Contains(scalar_names, k);
            if (scalar_slot < 0) return false;
            PyObject* e = entry(ops, v, scalar_slot == 1);
            if (e == nullptr) return false;
            PyObject* pair = PyTuple_Pack(2, k, e);
            Py_DECREF(e);
            if (pair == nullptr) return false;
            PyTuple_SET_ITEM(kwargs_t.p, i++, pair);
        }
    }
    return true;
}

// The digest of a call's template, digest((args_t, kwargs_t)), and its memo digest with the
// operands' keys from ops.keys[first:]: the Python path's memo_key, digest_with(template digest,
// keys). False on an error.
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

// The memo entry (borrowed) of a call of ``plan``'s op with this memo digest: (Meta, the template
// as first recorded, which equal calls' nodes share), the Python path's _memo; nullptr when there
// is none.
PyObject* memoized(PyObject* plan, const Digest& digest) {
    Ref d(digest_int(digest));
    Ref key(d ? PyTuple_Pack(2, PyTuple_GET_ITEM(plan, 1), d.p) : nullptr);
    if (!key) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(cfg.meta_cache, key.p);
    if (entry == nullptr || (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2))
        return entry;
    PyErr_SetString(PyExc_TypeError, "shape memo entries are (meta, template)");
    return nullptr;
}

// A node with one output per Meta of ``metas`` (None where the op produces none): its dtypes and
// shapes are tuples (the Python path's _multi_node).
PyObject* multi_node(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* metas) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    Ref dtypes(PyTuple_New(n)), shapes(PyTuple_New(n));
    if (!dtypes || !shapes) return nullptr;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *dtype = Py_None, *shape = Py_None;
        if (items[i] != Py_None) {
            if (!is_single_meta(items[i], &dtype)) return nullptr;
            shape = PyTuple_GET_ITEM(items[i], 0);
        }
        Py_INCREF(dtype);
        Py_INCREF(shape);
        PyTuple_SET_ITEM(dtypes.p, i, dtype);
        PyTuple_SET_ITEM(shapes.p, i, shape);
    }
    PyObject* node_args[5] = {name, srcs, arg, dtypes.p, shapes.p};
    return node_new(&NodeType, node_args, 5, nullptr);
}

// Output ``i`` of a multi-output node (ir.py's getitem); ``source`` is the tuple (node,).
PyObject* output_node(PyObject* source, Py_ssize_t i) {
    NodeObject* node = (NodeObject*)PyTuple_GET_ITEM(source, 0);
    Ref index(PyLong_FromSsize_t(i));
    if (!index) return nullptr;
    PyObject* args[5] = {cfg.getitem_op, source, index.p, PyTuple_GET_ITEM(node->dtype, i),
                         PyTuple_GET_ITEM(node->shape, i)};
    return node_new(&NodeType, args, 5, nullptr);
}

// The outputs of a multi-output op: one node, and a tensor per output on its getitem node (None
// where the op produces none), in a tuple or list as ``metas`` is (the Python path's
// _wrap_outputs).
PyObject* record_outputs(PyObject* name, PyObject* srcs, PyObject* arg, PyObject* metas,
                         PyObject* device) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    Ref node(multi_node(name, srcs, arg, metas));
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
    return PyTuple_CheckExact(metas) ? outs.release() : PySequence_List(outs.p);
}

// Whether the ``device`` keyword is absent, None or the device of index ``device``.
bool on_own_device(PyObject* kwargs, PyObject* device) {
    PyObject* v = PyDict_GetItemWithError(kwargs, s_device);
    if (v == nullptr || v == Py_None) return v == Py_None || !PyErr_Occurred();
    Py_ssize_t index = PyLong_AsSsize_t(device);
    if (index < 0 || index >= PyTuple_GET_SIZE(cfg.devices)) return false;
    return PyObject_RichCompareBool(v, PyTuple_GET_ITEM(cfg.devices, index), Py_EQ) == 1;
}

// Whether an argument is one a value check reads: a Python number or a tensor that is not lazy
// (a CPU scalar); a lazy tensor's value is unknown while tracing.
bool checked_value(PyObject* v) {
    return v != Py_None && !PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type);
}

// A RECORD plan's value check (its element 5, dispatch.cpp's value_checks): (check, positions,
// names). ``check(args, kwargs)`` raises eager's error for numbers eager refuses (a negative
// integer power, an integer division by 0); it runs only when an argument at one of
// ``positions`` or keyword ``names`` holds a number, so calls that pass none (``add`` without
// ``alpha``) pay nothing. False when it raised: the Python path runs the op again and raises it.
bool value_checked(PyObject* spec, PyObject* args, PyObject* kwargs) {
    PyObject* positions = PyTuple_GET_ITEM(spec, 1);
    PyObject* names = PyTuple_GET_ITEM(spec, 2);
    bool reads = false;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    for (Py_ssize_t i = 0; !reads && i < PyTuple_GET_SIZE(positions); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(positions, i));
        reads = at >= 0 && at < n && checked_value(PyTuple_GET_ITEM(args, at));
    }
    for (Py_ssize_t i = 0; !reads && kwargs && i < PyTuple_GET_SIZE(names); i++) {
        PyObject* v = PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(names, i));
        if (v == nullptr && PyErr_Occurred()) return false;
        reads = v != nullptr && checked_value(v);
    }
    if (!reads) return true;
    Ref empty;
    if (kwargs == nullptr) {
        empty.p = PyDict_New();
        if (!empty) return false;
        kwargs = empty.p;
    }
    PyObject* call[2] = {args, kwargs};
    Ref ok(PyObject_Vectorcall(PyTuple_GET_ITEM(spec, 0), call, 2, nullptr));
    return ok.p != nullptr;
}

// The whole op, or nullptr to hand it to the Python path.
PyObject* record(PyObject* plan, PyObject* args, PyObject* kwargs) {
    if (PyTuple_GET_SIZE(plan) > 5 && !value_checked(PyTuple_GET_ITEM(plan, 5), args, kwargs))
        return nullptr;
    PyObject* name = PyTuple_GET_ITEM(plan, 1);
    PyObject* precision = PyTuple_GET_ITEM(plan, 4);
    Operands ops;
    if (!ops.srcs || !ops.keys) return nullptr;
    Ref args_t, kwargs_t;
    if (!template_of(plan, args, kwargs, ops, args_t, kwargs_t)) return nullptr;
    Digest template_digest, digest;
    if (!memo_digest(args_t.p, kwargs_t.p, ops, 0, template_digest, digest)) return nullptr;
    PyObject* entry = memoized(plan, digest);
    if (entry == nullptr) return nullptr;
    PyObject* meta = PyTuple_GET_ITEM(entry, 0);
    PyObject* dtype_name;
    if (!ops.device) return nullptr;  // factories take their device from keywords
    if (kwargs && !on_own_device(kwargs, ops.device.p)) return nullptr;  // e.g. _to_copy to CPU
    bool single = is_single_meta(meta, &dtype_name);
    if (!single && (PyErr_Occurred() || !(PyTuple_CheckExact(meta) || PyList_CheckExact(meta))))
        return nullptr;

    if (precision != Py_None) {  // matmuls record the float32 precision in force
        Ref p(PyObject_CallNoArgs(precision));
        if (!p) return nullptr;
        Ref extra(Py_BuildValue("((OO))", s_precision, p.p));
        if (!extra) return nullptr;
        PyObject* joined = PySequence_Concat(kwargs_t.p, extra.p);
        if (joined == nullptr) return nullptr;
        Py_SETREF(kwargs_t.p, joined);
    }
    // Equal calls' nodes share the memo's template; a matmul's carries the precision too.
    Ref arg(precision == Py_None ? Py_NewRef(PyTuple_GET_ITEM(entry, 1))
                                 : PyTuple_Pack(2, args_t.p, kwargs_t.p));
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!arg || !srcs) return nullptr;
    if (!single) return record_outputs(name, srcs.p, arg.p, meta, ops.device.p);
    PyObject* node_args[5] = {name, srcs.p, arg.p, dtype_name, PyTuple_GET_ITEM(meta, 0)};
    Ref node(precision == Py_None ? node_of(node_args, template_digest)
                                  : node_new(&NodeType, node_args, 5, nullptr));
    return node ? fresh(node.p, meta, ops.device.p) : nullptr;
}

// A template and Meta seen earlier in one foreach call (borrowed: the call's templates and Metas
// hold them), and its memo digest.
struct SeenElement {
    PyObject* pair;
    PyObject* meta;
    Digest digest;
};

// elements(plan, calls): the operands, per-call templates, Metas, device and per-call operand
// counts of a foreach op's element calls ``[(args, kwargs), ...]`` sharing one operand list
// (lazy_torch's _elements: each call's markers count from its own first operand), or None where
// the Python path must do it. A call like an earlier one (an optimizer's lists repeat a few
// shapes) shares its template and takes its Meta without a memo lookup.
PyObject* elements(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_CheckExact(argv[0]) || PyTuple_GET_SIZE(argv[0]) != 5 ||
        !PyList_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "elements(record plan, [(args, kwargs), ...])");
        return nullptr;
    }
    PyObject* plan = argv[0];
    PyObject* calls = argv[1];
    Operands ops;
    Py_ssize_t n = PyList_GET_SIZE(calls);
    Ref templates(PyTuple_New(n)), metas(PyList_New(n)), counts(PyTuple_New(n));
    SeenElement seen[8];
    int nseen = 0;
    bool ok = ops.srcs && ops.keys && templates && metas && counts;
    for (Py_ssize_t e = 0; ok && e < n; e++) {
        PyObject* call = PyList_GET_ITEM(calls, e);
        if (!PyTuple_CheckExact(call) || PyTuple_GET_SIZE(call) != 2 ||
            !PyTuple_CheckExact(PyTuple_GET_ITEM(call, 0)) ||
            !PyDict_CheckExact(PyTuple_GET_ITEM(call, 1))) {
            ok = false;
            break;
        }
        PyObject* kwargs = PyTuple_GET_ITEM(call, 1);
        Py_ssize_t first = PyList_GET_SIZE(ops.keys.p);
        ops.base = PyList_GET_SIZE(ops.srcs.p);
        Ref args_t, kwargs_t;
        ok = template_of(plan, PyTuple_GET_ITEM(call, 0), PyDict_GET_SIZE(kwargs) ? kwargs : nullptr,
                         ops, args_t, kwargs_t);
        if (!ok) break;
        Digest template_digest, digest;
        ok = memo_digest(args_t.p, kwargs_t.p, ops, first, template_digest, digest);
        if (!ok) break;
        PyObject *pair = nullptr, *meta = nullptr;
        for (int k = 0; k < nseen; k++) {
            if (seen[k].digest == digest) {
                pair = Py_NewRef(seen[k].pair);
                meta = seen[k].meta;
                break;
            }
        }
        if (pair == nullptr) {
            PyObject* entry = memoized(plan, digest);
            ok = entry != nullptr;
            if (!ok) break;
            meta = PyTuple_GET_ITEM(entry, 0);
            pair = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            if (nseen < 8) seen[nseen++] = {pair, meta, digest};
        }
        PyTuple_SET_ITEM(templates.p, e, pair);
        PyList_SET_ITEM(metas.p, e, Py_NewRef(meta));
        PyObject* count = PyLong_FromSsize_t(PyList_GET_SIZE(ops.srcs.p) - ops.base);
        ok = count != nullptr;
        if (ok) PyTuple_SET_ITEM(counts.p, e, count);
    }
    if (!ok || !ops.device) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!srcs) return nullptr;
    return PyTuple_Pack(5, srcs.p, templates.p, metas.p, ops.device.p, counts.p);
}

// One ``op`` node with an output per Meta of ``metas``; output k becomes the value of
// targets[k] (``target._lazy.assign``). False on an error.
bool assign_outputs(PyObject* op, PyObject* srcs, PyObject* arg, PyObject* metas,
                    PyObject* targets) {
    Ref node(multi_node(op, srcs, arg, metas));
    Ref source(node ? PyTuple_Pack(1, node.p) : nullptr);
    if (!source) return false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++) {
        Ref output(output_node(source.p, i));
        Ref value(output ? PyObject_GetAttr(PyList_GET_ITEM(targets, i), s_lazy) : nullptr);
        Ref done(value ? assign(value.p, output.p) : nullptr);
        if (!done) return false;
    }
    return true;
}

// Whether every element result fits one foreach node: one floating-point tensor each, of its
// target's shape and dtype when there are targets (the Python path's record_elements checks).
// -1 on an error.
int elements_fit(PyObject* metas, PyObject* targets) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    PyObject* floating_dtype = nullptr;  // the last dtype found floating-point
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* dtype_name;
        if (!is_single_meta(items[i], &dtype_name)) return PyErr_Occurred() ? -1 : 0;
        PyObject* dtype = PyTuple_GET_ITEM(items[i], 3);
        if (dtype != floating_dtype) {
            Ref floating(PyObject_GetAttr(dtype, s_is_floating_point));
            if (!floating) return -1;
            if (floating.p != Py_True) return 0;
            floating_dtype = dtype;
        }
        if (targets == Py_None) continue;
        PyObject* target = PyList_GET_ITEM(targets, i);
        if (Py_TYPE(target) != (PyTypeObject*)cfg.tensor_type) return 0;
        Ref meta(PyObject_GetAttr(target, s_meta));
        if (!meta) return -1;
        if (!PyTuple_CheckExact(meta.p) || PyTuple_GET_SIZE(meta.p) != 4 ||
            PyTuple_GET_ITEM(meta.p, 3) != dtype)
            return 0;
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(meta.p, 0),
                                            PyTuple_GET_ITEM(items[i], 0), Py_EQ);
        if (same != 1) return same;
    }
    return 1;
}

// foreach_outputs(op, srcs, arg, metas, device, targets): record a foreach op's element results
// as one ``op`` node. Without targets (None), returns a new tensor per result; with a list of
// targets, each result becomes its target's value (``target._lazy.assign``) and the targets are
// returned. None when an element does not fit (see elements_fit): nothing is recorded then.
PyObject* foreach_outputs(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 6 || !PyTuple_CheckExact(argv[1]) || !PyList_CheckExact(argv[3]) ||
        (argv[5] != Py_None &&
         (!PyList_CheckExact(argv[5]) || PyList_GET_SIZE(argv[5]) != PyList_GET_SIZE(argv[3])))) {
        PyErr_SetString(PyExc_TypeError,
                        "foreach_outputs(op, srcs: tuple, arg, metas: list, device, targets)");
        return nullptr;
    }
    PyObject *op = argv[0], *srcs = argv[1], *arg = argv[2], *metas = argv[3];
    PyObject *device = argv[4], *targets = argv[5];
    int fit = elements_fit(metas, targets);
    if (fit < 0) return nullptr;
    if (fit == 0) Py_RETURN_NONE;
    if (targets == Py_None) return record_outputs(op, srcs, arg, metas, device);
    if (!assign_outputs(op, srcs, arg, metas, targets)) return nullptr;
    Py_INCREF(targets);
    return targets;
}

// The operands of ``values`` (lazy tensors, other tensors as foreign operands, nodes, Python
// numbers; one operand each, equal numbers too) into ``ops``, and the node argument
// ((markers, *attrs), kwargs) of an op over them: the Python path's _operands_of. nullptr, with
// no error set, where the Python path must do it (it raises the errors).
PyObject* value_operands(Operands& ops, PyObject* values, PyObject* attrs, PyObject* kwargs) {
    bool ok = ops.srcs && ops.keys;
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(values); i++) {
        PyObject* v = PyList_GET_ITEM(values, i);
        if (Py_TYPE(v) == &NodeType) {
            Py_INCREF(v);
            ok = append(ops.srcs.p, v);
            continue;
        }
        int kind = number_kind(v);
        Ref added;
        if (kind >= 0) {
            added.p = scalar_operand(ops, v, kind, false);
        } else if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.tensor_type)) {
            added.p = lazy_operand(ops, v);
        } else if (PyObject_TypeCheck(v, (PyTypeObject*)cfg.foreign_type)) {
            added.p = foreign_operand(ops, v);
        }
        ok = (bool)added;
    }
    Py_ssize_t n = ok ? PyList_GET_SIZE(ops.srcs.p) : 0;
    Ref markers(ok && n <= PyTuple_GET_SIZE(cfg.operands) ? PyTuple_GetSlice(cfg.operands, 0, n)
                                                          : nullptr);
    Ref head(markers ? PyTuple_Pack(1, markers.p) : nullptr);
    Ref joined(head ? PySequence_Concat(head.p, attrs) : nullptr);
    if (!joined) {
        PyErr_Clear();
        return nullptr;
    }
    return PyTuple_Pack(2, joined.p, kwargs);
}

// update(op, values, attrs, targets): the Python path's record_update (lazy_torch/dispatch.py).
// One ``op`` node over the operands of ``values`` with ``arg`` ((markers, *attrs), ()); its
// output k becomes the value of lazy tensor targets[k], in its shape and dtype. True once
// recorded; None, with nothing recorded, where the Python path must do it.
PyObject* update(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(argv[1]) || !PyTuple_CheckExact(argv[2]) ||
        !PyList_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "update(op, values: list, attrs: tuple, targets: list)");
        return nullptr;
    }
    PyObject* targets = argv[3];
    Operands ops;
    Py_ssize_t nt = PyList_GET_SIZE(targets);
    Ref metas(PyList_New(nt));
    if (!metas) return nullptr;
    Ref no_kwargs(PyTuple_New(0));
    Ref arg(no_kwargs ? value_operands(ops, argv[1], argv[2], no_kwargs.p) : nullptr);
    if (!arg) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_NONE;
    }
    for (Py_ssize_t k = 0; k < nt; k++) {
        PyObject* t = PyList_GET_ITEM(targets, k);
        PyObject* meta = Py_TYPE(t) == (PyTypeObject*)cfg.tensor_type ? PyObject_GetAttr(t, s_meta)
                                                                       : nullptr;
        if (meta == nullptr) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(metas.p, k, meta);
    }
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!srcs || !assign_outputs(argv[0], srcs.p, arg.p, metas.p, targets)) return nullptr;
    Py_RETURN_TRUE;
}

// outputs(op, values, attrs, kwargs, meta): the Python path's record_op. One ``op`` node over the
// operands of ``values`` (as update's) with ``arg`` ((markers, *attrs), kwargs); returns its new
// tensor for a single Meta, else a tensor per Meta (None where the op produces none) in a tuple
// or list as ``meta`` is. None, with nothing recorded, where the Python path must do it.
PyObject* outputs(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(argv[1]) || !PyTuple_CheckExact(argv[2]) ||
        !PyTuple_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "outputs(op, values: list, attrs: tuple, kwargs: tuple, meta)");
        return nullptr;
    }
    PyObject* meta = argv[4];
    Operands ops;
    Ref arg(value_operands(ops, argv[1], argv[2], argv[3]));
    if (!arg || !ops.device) {
        if (PyErr_Occurred()) return nullptr;
        Py_RETURN_NONE;
    }
    PyObject* dtype_name;
    bool single = is_single_meta(meta, &dtype_name);
    if (PyErr_Occurred()) return nullptr;
    if (!single && !PyTuple_CheckExact(meta) && !PyList_CheckExact(meta)) Py_RETURN_NONE;
    Ref srcs(PyList_AsTuple(ops.srcs.p));
    if (!srcs) return nullptr;
    PyObject* out;
    if (single) {
        PyObject* node_args[5] = {argv[0], srcs.p, arg.p, dtype_name, PyTuple_GET_ITEM(meta, 0)};
        Ref node(node_new(&NodeType, node_args, 5, nullptr));
        out = node ? fresh(node.p, meta, ops.device.p) : nullptr;
    } else {
        out = record_outputs(argv[0], srcs.p, arg.p, meta, ops.device.p);
    }
    // Declined with nothing recorded (multi_node's answer to an entry that is no Meta of a dtype
    // the graph names, such as a float8 Meta): the Python path raises its error.
    if (out == nullptr && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

PyMethodDef recording_methods[] = {
    {"elements", (PyCFunction)(void (*)(void))elements, METH_FASTCALL,
     "elements(plan, calls) -> (srcs, templates, metas, device, counts) or None: a foreach op's "
     "elements."},
    {"foreach_outputs", (PyCFunction)(void (*)(void))foreach_outputs, METH_FASTCALL,
     "foreach_outputs(op, srcs, arg, metas, device, targets): a foreach op's results as one node."},
    {"update", (PyCFunction)(void (*)(void))update, METH_FASTCALL,
     "update(op, values, attrs, targets) -> True, or None for the Python path: record_update."},
    {"outputs", (PyCFunction)(void (*)(void))outputs, METH_FASTCALL,
     "outputs(op, values, attrs, kwargs, meta) -> its tensor(s), or None for the Python path: "
     "record_op."},
    {nullptr, nullptr, 0, nullptr}};

bool add_recording(PyObject* module) {
    return PyModule_AddFunctions(module, recording_methods) == 0;
}

}  // namespace lazy_native
