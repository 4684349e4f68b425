"""aten dispatch: record each op as an IR node, derive in-place/out= variants, decompose or fall back.

Every op resolves once to a handler: a special handler (ops.py), a recorded lowering, an in-place or
out= variant of a recorded op, a ``torch._decomp`` decomposition, or the CPU fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._decomp import decomposition_table

import runtime
from lazy_core import (
    Node,
    NotWritable,
    Storage,
    constant,
    digest,
    getitem,
    scalar_leaf,
)
from lazy_core.ir import GETITEM, OPERANDS, Elements, operand, operands
from lazy_torch import fallback as _fallback
from lazy_torch import sites as _sites
from lazy_torch import tensor as _tensor
from lazy_torch._dtypes import DTYPE_NAMES, dtype_name
from lazy_torch.eager_checks import check_inplace_overlap
from lazy_torch.foreach import foreach_handler
from lazy_torch.resize import become, fallback_out_variant, out_variant
from lazy_torch.shapes import FALLBACK_EXCEPTIONS as _FALLBACK_EXCEPTIONS
from lazy_torch.shapes import MATMUL_OPS as _MATMUL_OPS
from lazy_torch.shapes import (
    check_like_eager,
    infer,
    memo_entry,
    memo_key,
    meta_cache,
)
from lazy_torch.tensor import DEVICES, LazyTensor, _native, fresh, wrap
from lazy_torch.views import STORAGE_RELATIVE, STORAGE_STEP, VIEWS, write

Handler = Callable[[Any, tuple, dict], Any]
# The IR op of a foreach call recorded whole: arguments (element op, per-element templates).
FOREACH = "foreach"

# Keyed by id(func): OpOverloads live for the whole process, and their __hash__ is Python code.
_handlers: dict[int, Handler] = {}


def special(*funcs: Any, native: tuple | None = None) -> Callable[[Handler], Handler]:
    """Register a hand-written handler for ``funcs`` (copy_, _to_copy, sync points, ...);
    ``native``: the C fast path's plan that does the same (see ``NATIVE_RECORD``);
    ``(NATIVE_RECORD,)`` stands for each func's own record plan."""

    def register(fn: Handler) -> Handler:
        for f in funcs:
            _handlers[id(f)] = fn
            if native is not None and _native is not None:
                _native.register(f, _plan(f).native if native == (NATIVE_RECORD,) else native)
        return fn

    return register


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    handler = _handlers.get(id(func))
    if handler is None:
        handler = _handlers[id(func)] = _resolve(func)
        if _native is not None:
            plan = _plan(func).native if handler is recorded else getattr(handler, "native", None)
            if plan is not None:
                _native.register(func, plan)
    if _sites.recording:
        return _sites.call_attributed(handler, func, args, kwargs)
    return handler(func, args, kwargs)


# ----------------------------------------------------------------------------------------------
# Per-op plans: which argument slots are Scalars (graph operands) and which are attributes.


# Kinds of plan for the C fast path (lazy_core/csrc): ``record`` an op, make a view from
# the view memo, or share the argument's view (detach, alias). Other handlers have no plan.
NATIVE_RECORD, NATIVE_VIEW, NATIVE_SHARE = 0, 1, 2


class _Plan:
    __slots__ = ("matmul", "name", "native", "scalar_names", "scalar_pos", "scalars_are_operands")

    def __init__(self, func: Any):
        schema = func._schema
        self.name = str(func)
        # Python numbers arrive in Scalar slots and, wrapped, in Tensor slots (``x * 2``).
        numeric = [_is_numeric(a.type) for a in schema.arguments]
        self.scalar_pos: frozenset[int] = frozenset(
            i for i, a in enumerate(schema.arguments) if numeric[i] and not a.kwarg_only
        )
        self.scalar_names: frozenset[str] = frozenset(
            a.name for i, a in enumerate(schema.arguments) if numeric[i] and a.kwarg_only
        )
        # Factories (no tensor argument) bake their Scalars in: they decide the output shape.
        self.scalars_are_operands = any("Tensor" in str(a.type) for a in schema.arguments)
        self.matmul = self.name in _MATMUL_OPS
        # What the C fast path needs to record ``func`` as ``record`` does.
        operands = self.scalars_are_operands
        mask = tuple(operands and i in self.scalar_pos for i in range(len(schema.arguments)))
        names = self.scalar_names if operands else frozenset()
        precision = _matmul_precision if self.matmul else None
        self.native = (NATIVE_RECORD, self.name, mask, names, precision)


def _is_numeric(t: Any) -> bool:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, (torch._C.NumberType, torch._C.TensorType))


_plans: dict[int, _Plan] = {}


def _plan(func: Any) -> _Plan:
    plan = _plans.get(id(func))
    if plan is None:
        plan = _plans[id(func)] = _Plan(func)
    return plan


# ----------------------------------------------------------------------------------------------
# Operand collection: one walk over the arguments builds the node template, the operand list,
# the shape-inference memo key and the device of the op.


class _Operands:
    __slots__ = ("base", "device", "keys", "scalars", "srcs")

    def __init__(self) -> None:
        self.srcs: list[Node] = []
        self.keys: list[Any] = []
        self.device: int | None = None
        # Python numbers already made operands, by identity, and their positions in srcs: a
        # number used again (a foreach op's one scalar for every element) is the same operand.
        self.scalars: dict[int, int] = {}
        # Where the current call's operands start: markers count from there (a foreach op's
        # elements each count from their own first operand).
        self.base = 0

    def _added(self) -> Any:
        return operand(len(self.srcs) - 1 - self.base)

    def tensor(self, t: torch.Tensor) -> Any:
        if isinstance(t, LazyTensor):
            view = t._lazy
            device = view.device  # a slot on a Storage, the common case
            if self.device is None:
                self.device = device
            elif device != self.device:
                _device_mismatch(f"lazy:{self.device}", f"lazy:{device}")
            self.srcs.append(view.node)
            self.keys.append(t._meta)
            return self._added()
        scalar = _cpu_scalar(t)
        if scalar is None:
            _device_mismatch(f"lazy:{self.device or 0}", str(t.device))
        self.srcs.append(scalar[0])
        self.keys.append(scalar[1])
        return self._added()

    def node(self, n: Node) -> Any:
        self.srcs.append(n)
        return self._added()

    def scalar(self, v: Any, share: bool = True) -> Any:
        """``v``'s operand; ``share``: the same number object again is the same operand."""
        kind = type(v)
        self.keys.append(kind)
        seen = self.scalars.get(id(v)) if share else None
        if seen is not None:
            if seen >= self.base:
                return operand(seen - self.base)
            node = self.srcs[seen]  # an earlier element's: this element's operand too
        else:
            dtype = _SCALAR_DTYPES[kind]
            if _is_constant(v):
                node = _constants.get((kind, v))
                if node is None:
                    node = _constants[(kind, v)] = constant(v, dtype)
            else:
                node = scalar_leaf(v, dtype)
        self.srcs.append(node)
        self.scalars[id(v)] = len(self.srcs) - 1
        return self._added()


def _cpu_scalar(t: torch.Tensor) -> tuple[Node, Any] | None:
    """A 0-dim CPU tensor (a wrapped Python number, ``x * 2``) as a scalar operand: its node
    and memo key. None for any other non-lazy tensor (a device mismatch)."""
    if t.dim() != 0 or t.device.type != "cpu":
        return None
    value = t.item()
    dtype = dtype_name(t.dtype)
    node = (
        constant(value, dtype, wrapped=False) if _is_constant(value) else scalar_leaf(value, dtype)
    )
    return node, ("cpu_scalar", t.dtype)


_SCALAR_DTYPES = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}
# Constant leaves carry no payload, so one node per value serves every graph.
_constants: dict[tuple, Node] = {}


def _is_constant(v: Any) -> bool:
    """0 and 1 (of any number type) are baked into graphs; a negative zero is not 0 here (its sign
    matters to division)."""
    if type(v) is complex:
        return v.imag == 0.0 and math.copysign(1.0, v.imag) > 0 and _is_constant(v.real)
    if v == 0:
        return not (type(v) is float and math.copysign(1.0, v) < 0)
    return v == 1


def _device_mismatch(a: str, b: str) -> None:
    raise RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and "
        f"{b}!"
    )


_PLAIN = (int, str, type(None), bool, float)
# Argument types that enter templates as their str.
_STR_TYPES = (torch.device, torch.layout, torch.memory_format)


def _attr(v: Any, ops: _Operands) -> Any:
    """A non-Scalar argument as a hashable template entry."""
    if type(v) in _PLAIN:
        return v
    if isinstance(v, torch.Tensor):
        return ops.tensor(v)
    if isinstance(v, (list, tuple)):
        return tuple(_attr(x, ops) for x in v)
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    if isinstance(v, _STR_TYPES):
        return str(v)
    if isinstance(v, torch.Generator):
        return None
    if isinstance(v, torch.SymInt):
        return int(v)
    return v


_NUMBER = (bool, int, float, complex)


def _template(plan: _Plan, args: tuple, kwargs: dict, ops: _Operands) -> tuple[tuple, tuple]:
    scalar_pos = plan.scalar_pos if plan.scalars_are_operands else ()
    scalar_names = plan.scalar_names if plan.scalars_are_operands else ()
    args_t = tuple(
        [
            ops.tensor(a)
            if type(a) is LazyTensor
            else ops.scalar(a)
            if i in scalar_pos and type(a) in _NUMBER
            else _attr(a, ops)
            for i, a in enumerate(args)
        ]
    )
    if not kwargs:
        return args_t, ()
    kwargs_t = tuple(
        [
            (k, ops.scalar(v) if k in scalar_names and type(v) in _NUMBER else _attr(v, ops))
            for k, v in kwargs.items()
        ]
    )
    return args_t, kwargs_t


# ----------------------------------------------------------------------------------------------
# Recording.


def record(
    func: Any,
    args: tuple,
    kwargs: dict,
    name: str | None = None,
    extra: Callable[[_Operands], tuple] | None = None,
) -> Any:
    """Record ``func(*args, **kwargs)`` as one IR node and wrap its outputs as lazy tensors.

    ``name`` overrides the node's op (to record an op as another); ``extra`` adds runtime keyword
    arguments (RNG state, precision) to the template.
    """
    plan = _plan(func)
    ops = _Operands()
    args_t, kwargs_t = _template(plan, args, kwargs, ops)
    key = memo_key(plan.name, args_t, kwargs_t, ops.keys)
    meta, arg = memo_entry(func, args, kwargs, key, (args_t, kwargs_t))
    runtime_kwargs = (("_precision", _matmul_precision()),) if plan.matmul else ()
    if extra is not None:
        runtime_kwargs += extra(ops)
    if runtime_kwargs:  # this node's own template: the memo's plus what the runtime needs
        arg = (args_t, kwargs_t + runtime_kwargs)
    device = ops.device if ops.device is not None else _device_of(kwargs)
    return _wrap_outputs(name or plan.name, tuple(ops.srcs), arg, meta, device)


def record_elements(func: Any, calls: list[tuple[tuple, dict]], targets: list | None) -> Any:
    """Record ``func`` on each ``(args, kwargs)`` of ``calls`` as one node (a foreach op); with
    ``targets``, each result becomes the value of its target (in place). Returns the outputs, or
    None when an element does not fit: a result that is not one floating-point tensor (integer
    division has runtime checks), or one whose shape or dtype differs from its target's.
    """
    plan = _plan(func)
    if plan.matmul:
        return None
    found = None if _native is None else _native.elements(plan.native, calls)
    if found is None:
        found = _elements(func, plan, calls)
    srcs, templates, metas, device, counts = found
    arg = foreach_arg(plan.name, srcs, templates, counts)
    outputs = _foreach_outputs if _native is None else _native.foreach_outputs
    try:
        return outputs(FOREACH, srcs, arg, metas, device, targets)
    except NotWritable as e:
        raise RuntimeError(str(e)) from None


def foreach_arg(name: str, srcs: tuple, templates: tuple, counts: tuple[int, ...]) -> tuple:
    """A foreach node's ``arg``: see lowerings/foreach.py."""
    return ((name, operands(len(srcs)), Elements(templates), counts), ())


def _foreach_outputs(
    op: str, srcs: tuple, arg: Any, metas: list, device: int, targets: list | None
) -> Any:
    """The element results as one ``op`` node: new tensors, or each its target's new value; None
    when an element does not fit (in C when built: ``_native.foreach_outputs``)."""
    for i, meta in enumerate(metas):
        if not _is_single(meta) or not meta[3].is_floating_point:
            return None
        if targets is not None:
            target = targets[i]
            if type(target) is not LazyTensor or (meta[0], meta[3]) != target._meta[::3]:
                return None
    if targets is None:
        return _wrap_outputs(op, srcs, arg, metas, device)
    node = _multi_node(op, srcs, arg, metas)
    for i, target in enumerate(targets):
        target._lazy.assign(getitem(node, i))
    return targets


def _elements(func: Any, plan: _Plan, calls: list[tuple[tuple, dict]]) -> tuple:
    """The operands, per-call templates and Metas of ``calls`` of ``func`` sharing one operand
    list, their device and each call's operand count (in C when built: ``_native.elements``).
    Each call's template counts its markers from its own first operand, so its shape memo key is
    the single op's."""
    ops = _Operands()
    templates, metas, counts = [], [], []
    for args, kwargs in calls:
        start, ops.base = len(ops.keys), len(ops.srcs)
        args_t, kwargs_t = _template(plan, args, kwargs, ops)
        key = memo_key(plan.name, args_t, kwargs_t, ops.keys[start:])
        meta, template = memo_entry(func, args, kwargs, key, (args_t, kwargs_t))
        metas.append(meta)
        templates.append(template)
        counts.append(len(ops.srcs) - ops.base)
    return tuple(ops.srcs), tuple(templates), metas, ops.device, tuple(counts)


_SCHEMA_ARGUMENTS: dict[Any, tuple[tuple[str, Any], ...]] = {}  # op -> (name, default) each


def bound_arguments(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every argument of a call of ``func`` by its schema name, in schema order, defaults filled
    in."""
    schema = _SCHEMA_ARGUMENTS.get(func)
    if schema is None:  # reading a schema makes Python objects of all of it: once per op
        schema = tuple((a.name, a.default_value) for a in func._schema.arguments)
        _SCHEMA_ARGUMENTS[func] = schema
    n = len(args)
    return {
        name: args[i] if i < n else kwargs.get(name, default)
        for i, (name, default) in enumerate(schema)
    }


def record_update(op: str, values: list, attrs: tuple, targets: list) -> None:
    """Record ``op`` as one node whose output ``k`` becomes the new value of ``targets[k]`` (in
    place; each keeps its shape and dtype): a fused optimizer step. Its operands are ``values``
    (tensors, nodes such as scalar leaves, and Python numbers as graph scalars; one operand each);
    its lowering gets them as one tuple, then ``attrs``."""
    try:
        if _native is not None and _native.update(op, values, attrs, targets):
            return
        srcs = tuple(_operands_of(values).srcs)
        node = _multi_node(
            op, srcs, ((operands(len(srcs)), *attrs), ()), [t._meta for t in targets]
        )
        for k, target in enumerate(targets):
            target._lazy.assign(getitem(node, k))
    except NotWritable as e:
        raise RuntimeError(str(e)) from None


def record_op(op: str, values: list, attrs: tuple, meta: Any, matmul: bool = False) -> Any:
    """Record ``op`` as one node over ``values`` (as record_update's) and return its output: a
    tensor of Meta ``meta``, or a tuple of them for a tuple of Metas (None: an output the op does
    not produce). Its lowering gets each value, then ``attrs``; a ``matmul`` at PyTorch's float32
    matmul precision."""
    kwargs = (("_precision", _matmul_precision()),) if matmul else ()
    if _native is not None:
        out = _native.outputs(op, values, attrs, kwargs, meta)
        if out is not None:
            return out
    ops = _operands_of(values)
    srcs = tuple(ops.srcs)
    return _wrap_outputs(op, srcs, ((operands(len(srcs)), *attrs), kwargs), meta, ops.device)


def _operands_of(values: list) -> _Operands:
    ops = _Operands()
    for v in values:
        if isinstance(v, torch.Tensor):
            ops.tensor(v)
        elif isinstance(v, Node):
            ops.node(v)
        else:
            ops.scalar(v, share=False)
    return ops


def _multi_node(op: str, srcs: tuple, arg: Any, metas: Any) -> Node:
    """A node with one output per Meta of ``metas`` (None: an output the op does not produce)."""
    dtypes = tuple(None if m is None else dtype_name(m[3]) for m in metas)
    shapes = tuple(None if m is None else m[0] for m in metas)
    return Node(op, srcs, arg, dtypes, shapes)


def _wrap_outputs(op: str, srcs: tuple, arg: Any, meta: Any, device: int) -> Any:
    if _is_single(meta):
        return fresh(Node(op, srcs, arg, dtype_name(meta[3]), meta[0]), device, meta)
    node = _multi_node(op, srcs, arg, meta)
    outs = [None if m is None else fresh(getitem(node, i), device, m) for i, m in enumerate(meta)]
    return tuple(outs) if isinstance(meta, tuple) else outs


def _is_single(meta: Any) -> bool:
    # A Meta is (shape tuple, stride tuple, offset int, dtype); a multi-output entry is a sequence
    # of Metas or Nones.
    return type(meta) is tuple and len(meta) == 4 and isinstance(meta[3], torch.dtype)


def _device_of(kwargs: dict) -> int:
    device = kwargs.get("device")
    if device is None:
        return 0
    device = torch.device(device)
    return device.index or 0


def _matmul_precision() -> str:
    # ``allow_tf32 = True`` sets this to "high" too.
    return torch.get_float32_matmul_precision()


# ----------------------------------------------------------------------------------------------
# Derived variants: in-place and out= ops are their functional op plus a substitution.


def assign(target: LazyTensor, value: LazyTensor) -> None:
    """Give ``target`` the value of ``value`` (same shape), cast to ``target``'s dtype; a write
    through a view updates its storage, and so every view of it."""
    if value.dtype != target.dtype:
        value = record(torch.ops.aten._to_copy.default, (value,), {"dtype": target.dtype})
    assign_node(target, value._lazy.node)


assign_node = write  # through its view steps, or by address where one has no inverse


_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _functional_of(func: Any) -> Any:
    """The functional overload matching in-place or out= ``func``, or None.

    Matched by schema, not by overload name (``pow_.Scalar`` is ``pow.Tensor_Scalar``). An out=
    factory (``arange.start_out``) matches a functional overload that takes tensor options
    instead of ``out`` (``arange.start_step``); the out tensor supplies them.
    """
    packet = func._schema.name.split("::")[1]
    arguments = func._schema.arguments
    if packet.endswith("_"):
        packet, wanted = packet[:-1], [(a.name, str(a.type)) for a in arguments]
    elif any(a.is_out for a in arguments):
        wanted = [(a.name, str(a.type)) for a in arguments if not a.is_out]
    else:
        return None
    base = getattr(torch.ops.aten, packet, None)
    if base is None:
        return None
    names = {name for name, _ in wanted}  # ``sum.IntList_out`` has a dtype of its own
    for name in base.overloads():
        cand = getattr(base, name)
        args = cand._schema.arguments
        if any(a.is_out or (a.alias_info and a.alias_info.is_write) for a in args):
            continue
        kept = [(a.name, str(a.type)) for a in args if a.name in names or a.name not in _OPTIONS]
        if kept == wanted:
            return cand
    return None


def _inplace(functional: Any) -> Handler:
    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        self = args[0]
        plan = _plan(func)
        ops = _Operands()
        args_t, kwargs_t = _template(plan, args, kwargs, ops)
        eager_resizes = False
        try:
            infer(func, args, kwargs, memo_key(plan.name, args_t, kwargs_t, ops.keys))  # errors
        except RuntimeError:
            # Meta kernels refuse some resizes eager makes (``addbmm_`` on a 1-element self).
            check_like_eager(func, args, kwargs)
            eager_resizes = True
        check_inplace_overlap(func, args, kwargs)  # meta kernels never look at memory
        result = dispatch(functional, args, kwargs)
        if eager_resizes and result.shape != self.shape:
            return become(self, result.to(self.dtype))
        if result.shape != self.shape or not torch.can_cast(result.dtype, self.dtype):
            # Meta kernels resize or cast where eager refuses to: raise eager's own error.
            check_like_eager(func, args, kwargs)
        assign(self, result)
        return self

    return handle


def _inplace_view(functional: Any) -> Handler:
    """``squeeze_``, ``transpose_``, ``as_strided_``, ...: self becomes the view."""

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        return become(args[0], dispatch(functional, args, kwargs))

    return handle


def _decomposed(decomp: Callable) -> Handler:
    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        return decomp(*args, **kwargs)

    return handle


def recorded(func: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``func`` as a node, or run it on the CPU fallback when it cannot be recorded."""
    try:
        return record(func, args, kwargs)
    except _FALLBACK_EXCEPTIONS as e:
        if getattr(e, "eager_dtype_error", False):  # not a missing lowering
            raise
        return _fallback.run(func, args, kwargs)


def _view_key(func: Any, args: tuple, kwargs: dict) -> tuple[str, int]:
    """Shape-inference memo key of a view op: its name and the type-exact digest of its input's
    metadata and its plain arguments (the C fast path makes the same: dispatch.cpp's view)."""

    def plain(v: Any) -> Any:
        if isinstance(v, LazyTensor):
            return v._meta
        if isinstance(v, (list, tuple)):
            return tuple(plain(x) for x in v)
        return _attr(v, None)

    return (str(func), digest((plain(args), tuple((k, plain(v)) for k, v in kwargs.items()))))


# View key -> (output Meta or Metas, view steps): a view's steps depend only on its arguments'
# metadata, so one lookup replaces shape inference and building them.
_view_cache: dict[tuple, tuple] = {}


def _view(func: Any, build: Callable, storage_relative: bool) -> Handler:
    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        self = args[0]
        key = _view_key(func, args, kwargs)
        entry = _view_cache.get(key)
        if entry is None:
            meta = infer(func, args, kwargs, key)
            steps = build(args, kwargs, meta if _is_single(meta) else list(meta), self._meta)
            entry = _view_cache[key] = (meta, tuple(steps))
        meta, steps = entry
        parent = self._lazy
        if storage_relative and steps[0].op == STORAGE_STEP:
            parent = parent.storage
        if _is_single(meta):
            return wrap(parent.then(steps[0]), meta)
        return type(meta)(wrap(parent.then(step), m) for step, m in zip(steps, meta))

    handle.native = None if storage_relative else (NATIVE_VIEW, str(func), False)
    return handle


def _resolve(func: Any) -> Handler:
    name = str(func)
    if name.startswith("aten._foreach_"):
        handler = foreach_handler(func, dispatch, record_elements)
        if handler is not None:
            return handler
    if func in VIEWS:
        return _view(func, VIEWS[func], func in STORAGE_RELATIVE)
    if runtime.has_lowering(name):
        return recorded
    functional = _functional_of(func)
    if functional is not None and not func._schema.name.endswith("_"):
        # An out= op is its functional op, then eager's rules for filling out tensors.
        return out_variant(functional, dispatch)
    if functional is not None and (
        runtime.has_lowering(str(functional)) or functional in decomposition_table
    ):
        return _inplace_view(functional) if functional in VIEWS else _inplace(functional)
    decomp = decomposition_table.get(func)
    if decomp is not None:
        return _decomposed(decomp)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # Composite ops called from inside a handler or decomposition arrive undecomposed.
        return _decomposed(func.decompose)
    if any(a.is_out for a in func._schema.arguments):
        return fallback_out_variant(_fallback.run)
    return _fallback.run


def use_wrapper(make: Callable) -> None:
    """Make lazy tensors' wrappers with ``make``, a function with the signature of
    ``torch.Tensor._make_wrapper_subclass`` (``host_step.py --torch-wrapper`` compares the C++ one
    with PyTorch's)."""
    _tensor.make_wrapper = make
    _configure_native()


def _configure_native() -> None:
    """Hand the C fast path what it calls back into; ``tensor.make_wrapper`` makes its tensors."""
    if _native is not None:
        _native.configure(
            tensor_type=LazyTensor,
            foreign_type=torch.Tensor,
            fallback=dispatch,
            flags=vars(_sites),
            meta_cache=meta_cache,
            constants=_constants,
            dtype_names=DTYPE_NAMES,
            scalar_leaf=scalar_leaf,
            storage=Storage,
            wrap=wrap,
            foreign=_cpu_scalar,
            operands=OPERANDS,
            view_cache=_view_cache,
            make_wrapper=_tensor.make_wrapper,
            devices=tuple(DEVICES),
            str_types=_STR_TYPES,
            getitem_op=GETITEM,
        )


_configure_native()
