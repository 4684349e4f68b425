// Recording several calls or outputs as one node, in C: a foreach op's element calls
// (lazy_torch/recording.py's record_elements), a fused update whose outputs become tensors' new
// values (record_update), and an op of the front end's own over given operands (record_op). The
// rules of operands, templates and the shape memo are record.cpp's.
#include "native.h"

namespace lazy_native {

namespace {

// A template and Meta seen earlier in one foreach call (borrowed: the call's templates and Metas
// hold them), and its memo digest.
struct SeenElement {
    PyObject* pair;
    PyObject* meta;
    Digest digest;
};

// elements(plan, calls): the operands, per-call templates, Metas, device and per-call operand
// counts of a foreach op's element calls ``[(args, kwargs), ...]`` sharing one operand list
// (each call's markers count from its own first operand, so its memo key is the single op's). A
// call like an earlier one (an optimizer's lists repeat a few shapes) shares its template and
// takes its Meta without a memo lookup.
PyObject* elements(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 2 || !Py_IS_TYPE(argv[0], &PlanType) || !PyList_CheckExact(argv[1])) {
        PyErr_SetString(PyExc_TypeError, "elements(plan, [(args, kwargs), ...])");
        return nullptr;
    }
    PlanObject* plan = (PlanObject*)argv[0];
    PyObject* calls = argv[1];
    Operands ops;
    Py_ssize_t n = PyList_GET_SIZE(calls);
    Ref templates(PyTuple_New(n)), metas(PyList_New(n)), counts(PyTuple_New(n));
    if (!ops.srcs || !ops.keys || !templates || !metas || !counts) return nullptr;
    SeenElement seen[8];
    int nseen = 0;
    for (Py_ssize_t e = 0; e < n; e++) {
        PyObject* call = PyList_GET_ITEM(calls, e);
        if (!PyTuple_CheckExact(call) || PyTuple_GET_SIZE(call) != 2 ||
            !call_arguments(PyTuple_GET_ITEM(call, 0), PyTuple_GET_ITEM(call, 1), "elements"))
            return PyErr_Occurred() ? nullptr : PyErr_Format(PyExc_TypeError, "elements: calls");
        PyObject* args = PyTuple_GET_ITEM(call, 0);
        PyObject* kwargs = kwargs_or_null(PyTuple_GET_ITEM(call, 1));
        Py_ssize_t first = PyList_GET_SIZE(ops.keys.p);
        ops.base = PyList_GET_SIZE(ops.srcs.p);
        Ref args_t, kwargs_t;
        Digest template_digest, digest;
        if (!template_of(plan, args, kwargs, ops, args_t, kwargs_t) ||
            !memo_digest(args_t.p, kwargs_t.p, ops, first, template_digest, digest))
            return nullptr;
        PyObject *pair = nullptr, *meta = nullptr;
        for (int k = 0; k < nseen; k++) {
            if (seen[k].digest == digest) {
                pair = Py_NewRef(seen[k].pair);
                meta = seen[k].meta;
                break;
            }
        }
        if (pair == nullptr) {
            Ref entry(memo(plan, digest, args, kwargs, args_t.p, kwargs_t.p, false));
            if (!entry) return nullptr;
            meta = PyTuple_GET_ITEM(entry.p, 0);
            pair = Py_NewRef(PyTuple_GET_ITEM(entry.p, 1));
            if (nseen < 8) seen[nseen++] = {pair, meta, digest};
        }
        PyTuple_SET_ITEM(templates.p, e, pair);
        PyList_SET_ITEM(metas.p, e, Py_NewRef(meta));
        PyObject* count = PyLong_FromSsize_t(PyList_GET_SIZE(ops.srcs.p) - ops.base);
        if (count == nullptr) return nullptr;
        PyTuple_SET_ITEM(counts.p, e, count);
    }
    Ref device(ops.device ? Py_NewRef(ops.device.p) : PyLong_FromLong(0));
    Ref srcs(device ? PyList_AsTuple(ops.srcs.p) : nullptr);
    if (!srcs) return nullptr;
    return PyTuple_Pack(5, srcs.p, templates.p, metas.p, device.p, counts.p);
}

// One ``op`` node with an output per Meta of ``metas``; output k becomes the value of
// targets[k] (``target._lazy.assign``).
bool assign_outputs(PyObject* op, PyObject* srcs, PyObject* arg, PyObject* metas,
                    PyObject* targets) {
    Ref node(multi_node(op, srcs, arg, metas));
    Ref source(node ? PyTuple_Pack(1, node.p) : nullptr);
    if (!source) return false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++) {
        Ref output(output_node(source.p, i));
        Ref value(output ? PyObject_GetAttr(PyList_GET_ITEM(targets, i), s_lazy) : nullptr);
        Ref done(value ? core->assign(value.p, output.p) : nullptr);
        if (!done) return false;
    }
    return true;
}

// Whether every element result fits one foreach node: one floating-point tensor each, of its
// target's shape and dtype when there are targets. -1 on an error.
int elements_fit(PyObject* metas, PyObject* targets) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(metas);
    PyObject** items = PySequence_Fast_ITEMS(metas);
    PyObject* floating_dtype = nullptr;  // the last dtype found floating-point
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* dtype_name;
        int single = single_meta(items[i], &dtype_name);
        if (single <= 0) return single;
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
        if (!Py_IS_TYPE(meta.p, (PyTypeObject*)cfg.meta_type) ||
            PyTuple_GET_ITEM(meta.p, 3) != dtype)
            return 0;
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(meta.p, 0),
                                            PyTuple_GET_ITEM(items[i], 0), Py_EQ);
        if (same != 1) return same;
    }
    return 1;
}

// foreach_outputs(op, srcs, arg, metas, device, targets): a foreach op's element results as one
// ``op`` node. Without targets (None), a new tensor per result; with a list of targets, each
// result becomes its target's value and the targets are returned. None when an element does not
// fit (see elements_fit): nothing is recorded then.
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
    if (targets == Py_None) return wrap_outputs(op, srcs, arg, metas, device);
    if (!assign_outputs(op, srcs, arg, metas, targets)) return nullptr;
    return Py_NewRef(targets);
}

// The operands of ``values`` (lazy tensors, 0-dim CPU tensors, nodes, Python numbers; one
// operand each, equal numbers too) into ``ops``, and the node argument ((markers, *attrs),
// kwargs) of an op over them.
PyObject* value_operands(Operands& ops, PyObject* values, PyObject* attrs, PyObject* kwargs) {
    if (!ops.srcs || !ops.keys) return nullptr;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(values); i++) {
        PyObject* v = PyList_GET_ITEM(values, i);
        if (is_node(v)) {
            if (!append(ops.srcs.p, Py_NewRef(v))) return nullptr;
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
        } else {
            PyErr_Format(PyExc_TypeError, "an operand is a tensor, a Node or a number, not %R", v);
        }
        if (!added) return nullptr;
    }
    // The markers of operands 0 to n - 1: a slice of the table (lazy_core.ir.operands), past it
    // a tuple of new ones.
    Py_ssize_t n = PyList_GET_SIZE(ops.srcs.p), table = PyTuple_GET_SIZE(cfg.operands);
    Ref markers(n <= table ? PyTuple_GetSlice(cfg.operands, 0, n) : PyTuple_New(n));
    if (!markers) return nullptr;
    for (Py_ssize_t i = 0; n > table && i < n; i++) {
        PyObject* m = marker(i);
        if (m == nullptr) return nullptr;
        PyTuple_SET_ITEM(markers.p, i, m);
    }
    Ref head(PyTuple_Pack(1, markers.p));
    Ref joined(head ? PySequence_Concat(head.p, attrs) : nullptr);  // (markers, *attrs)
    return joined ? PyTuple_Pack(2, joined.p, kwargs) : nullptr;
}

// update(op, values, attrs, targets): one ``op`` node over the operands of ``values`` with ``arg``
// ((markers, *attrs), ()); its output k becomes the value of lazy tensor targets[k], in its shape
// and dtype (a fused optimizer step).
PyObject* update(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(argv[1]) || !PyTuple_CheckExact(argv[2]) ||
        !PyList_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError, "update(op, values: list, attrs: tuple, targets: list)");
        return nullptr;
    }
    PyObject* targets = argv[3];
    Py_ssize_t nt = PyList_GET_SIZE(targets);
    Ref metas(PyList_New(nt));
    if (!metas) return nullptr;
    for (Py_ssize_t k = 0; k < nt; k++) {
        PyObject* t = PyList_GET_ITEM(targets, k);
        if (Py_TYPE(t) != (PyTypeObject*)cfg.tensor_type) {
            PyErr_Format(PyExc_TypeError, "update: target %zd is not a lazy tensor", k);
            return nullptr;
        }
        PyObject* meta = PyObject_GetAttr(t, s_meta);
        if (meta == nullptr) return nullptr;
        PyList_SET_ITEM(metas.p, k, meta);
    }
    Operands ops;
    Ref no_kwargs(PyTuple_New(0));
    Ref arg(no_kwargs ? value_operands(ops, argv[1], argv[2], no_kwargs.p) : nullptr);
    Ref srcs(arg ? PyList_AsTuple(ops.srcs.p) : nullptr);
    if (!srcs || !assign_outputs(argv[0], srcs.p, arg.p, metas.p, targets)) return nullptr;
    Py_RETURN_NONE;
}

// outputs(op, values, attrs, kwargs, meta): one ``op`` node over the operands of ``values`` (as
// update's) with ``arg`` ((markers, *attrs), kwargs); its new tensor for a single Meta, else a
// tensor per Meta (None where the op produces none) in a tuple or list as ``meta`` is.
PyObject* outputs(PyObject*, PyObject* const* argv, Py_ssize_t nargs) {
    if (nargs != 5 || !PyList_CheckExact(argv[1]) || !PyTuple_CheckExact(argv[2]) ||
        !PyTuple_CheckExact(argv[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "outputs(op, values: list, attrs: tuple, kwargs: tuple, meta)");
        return nullptr;
    }
    Operands ops;
    Ref arg(value_operands(ops, argv[1], argv[2], argv[3]));
    Ref device(!arg ? nullptr : ops.device ? Py_NewRef(ops.device.p) : PyLong_FromLong(0));
    Ref srcs(device ? PyList_AsTuple(ops.srcs.p) : nullptr);
    return srcs ? wrap_outputs(argv[0], srcs.p, arg.p, argv[4], device.p) : nullptr;
}

#define FASTCALL(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL

PyMethodDef multi_methods[] = {
    {"elements", FASTCALL(elements),
     "elements(plan, calls) -> (srcs, templates, metas, device, counts): a foreach op's calls."},
    {"foreach_outputs", FASTCALL(foreach_outputs),
     "foreach_outputs(op, srcs, arg, metas, device, targets): a foreach op's results as one node, "
     "or None where one does not fit."},
    {"update", FASTCALL(update),
     "update(op, values, attrs, targets): one node whose outputs become the targets' values."},
    {"outputs", FASTCALL(outputs),
     "outputs(op, values, attrs, kwargs, meta): one node over values, and its tensor(s)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

bool add_multi(PyObject* module) { return PyModule_AddFunctions(module, multi_methods) == 0; }

}  // namespace lazy_native
