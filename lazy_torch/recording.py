"""Recording aten calls as IR nodes: per-op plans, and the four recorders, all of them C
(lazy_torch/csrc/record.cpp says how a call becomes a node's template and operands).

- ``record``: one call as one node, and its new tensor(s).
- ``record_elements``: a foreach op's element calls as one node.
- ``record_update``: a fused optimizer step, one node whose outputs become tensors' new values.
- ``record_op``: an op of our own (``lazy.linear``) over given operands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lazy_core import NotWritable, Storage, constant, scalar_leaf
from lazy_core.ir import GETITEM, OPERANDS, Elements, operands
from lazy_torch import sites as _sites
from lazy_torch import tensor as _tensor
from lazy_torch._dtypes import DTYPE_NAMES, dtype_name
from lazy_torch.backend import BACKEND
from lazy_torch.shapes import MATMUL_OPS, memo_entry
from lazy_torch.tensor import DEVICES, _native

# The IR op of a foreach call recorded whole: arguments (element op, per-element templates).
FOREACH = "lazy.foreach"
# Argument types that enter templates as their str.
STR_TYPES = (torch.device, torch.layout, torch.memory_format)
Plan = _native.Plan
RECORD, VIEW, SHARE = _native.RECORD, _native.VIEW, _native.SHARE
# The IR dtype of a Python number's graph operand, by its type.
SCALAR_DTYPES: dict[type, str] = _native.SCALAR_DTYPES


def matmul_precision() -> str:
    """PyTorch's float32 matmul precision in force (``allow_tf32 = True`` sets it to "high")."""
    return torch.get_float32_matmul_precision()


def _is_numeric(t: Any) -> bool:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, (torch._C.NumberType, torch._C.TensorType))


# Ops whose number in this slot is the value they fill with: a Python bool there is a graph
# parameter, not a baked-in False or True, so a flag that turns from False to True (transformers'
# stopping criteria fill ``torch.full((batch,), is_done)``) computes with the same executable.
# (0 and 1 stay constants: ``torch.zeros`` and ``torch.ones`` fill with them.)
_VALUE_SLOTS = {
    "aten.fill.Scalar": "value",
    "aten.full_like.default": "fill_value",
    "aten.new_full.default": "fill_value",
}


def plan_of(func: Any) -> Plan:
    """``func``'s RECORD plan: which argument slots take Python numbers as graph operands (Scalar
    slots, and Tensor slots, where ``x * 2`` passes a number), and whether it is a matmul, whose
    node records the float32 precision in force. Factories (no tensor argument) bake their numbers
    in: they decide the output shape."""
    plan = BACKEND.plans.get(id(func))
    if plan is None:
        arguments = func._schema.arguments
        operands = any("Tensor" in str(a.type) for a in arguments)
        numeric = [operands and _is_numeric(a.type) for a in arguments]
        mask = tuple(n and not a.kwarg_only for n, a in zip(numeric, arguments))
        value = _VALUE_SLOTS.get(str(func))
        if value is not None:  # 2: a bool there is a graph parameter (csrc/record.cpp)
            mask = tuple(2 if m and a.name == value else m for m, a in zip(mask, arguments))
        names = frozenset(a.name for n, a in zip(numeric, arguments) if n and a.kwarg_only)
        name = str(func)
        precision = matmul_precision if name in MATMUL_OPS else None
        plan = BACKEND.plans[id(func)] = Plan(RECORD, func, name, mask, names, precision)
    return plan


def view_plan(func: Any, storage_relative: bool) -> Plan:
    """A view op's plan: its tensors from the view memo (``BACKEND.view_cache``)."""
    return Plan(VIEW, func, str(func), storage_relative=storage_relative)


def share_plan(func: Any) -> Plan:
    """detach and alias: a new tensor on the argument's view."""
    return Plan(SHARE, func, str(func))


def record(
    func: Any,
    args: tuple,
    kwargs: dict,
    name: str | None = None,
    extra: Callable[[int], tuple] | None = None,
) -> Any:
    """Record ``func(*args, **kwargs)`` as one IR node and wrap its outputs as lazy tensors.

    ``name`` records it as another op; ``extra(device)`` gives runtime keyword entries, (key,
    value) pairs whose Node values become operands (the device's RNG state)."""
    return _native.record(plan_of(func), tuple(args), kwargs, name, extra)


def memo_key(func: Any, args: tuple, kwargs: dict) -> tuple[str, int]:
    """The shape memo's key of a call of ``func`` (what ``record`` looks up)."""
    return _native.memo_key(plan_of(func), tuple(args), kwargs)


def view_key(func: Any, args: tuple, kwargs: dict) -> tuple[str, int]:
    """The view memo's key of a call of view op ``func``: its name and the type-exact digest of
    its input's metadata and its plain arguments."""
    return _native.view_key(str(func), tuple(args), kwargs)


def record_elements(func: Any, calls: list[tuple[tuple, dict]], targets: list | None) -> Any:
    """Record ``func`` on each ``(args, kwargs)`` of ``calls`` as one node (a foreach op); with
    ``targets``, each result becomes the value of its target (in place). Returns the outputs, or
    None when an element does not fit: a result that is not one floating-point tensor (integer
    division has runtime checks), or one whose shape or dtype differs from its target's.
    """
    plan = plan_of(func)
    if plan.precision is not None:
        return None
    srcs, templates, metas, device, counts = _native.elements(plan, calls)
    arg = foreach_arg(plan.name, srcs, templates, counts)
    try:
        return _native.foreach_outputs(FOREACH, srcs, arg, metas, device, targets)
    except NotWritable as e:
        raise RuntimeError(str(e)) from None


def foreach_arg(name: str, srcs: tuple, templates: tuple, counts: tuple[int, ...]) -> tuple:
    """A foreach node's ``arg``: see lowerings/foreach.py."""
    return ((name, operands(len(srcs)), Elements(templates), counts), ())


def record_update(op: str, values: list, attrs: tuple, targets: list) -> None:
    """Record ``op`` as one node whose output ``k`` becomes the new value of ``targets[k]`` (in
    place; each keeps its shape and dtype): a fused optimizer step. Its operands are ``values``
    (tensors, nodes such as scalar leaves, and Python numbers as graph scalars; one operand each);
    its lowering gets them as one tuple, then ``attrs``."""
    try:
        _native.update(op, values, attrs, targets)
    except NotWritable as e:
        raise RuntimeError(str(e)) from None


def record_op(op: str, values: list, attrs: tuple, meta: Any, matmul: bool = False) -> Any:
    """Record ``op`` as one node over ``values`` (as record_update's) and return its output: a
    tensor of Meta ``meta``, or a tuple of them for a tuple of Metas (None: an output the op does
    not produce). Its lowering gets each value, then ``attrs``; a ``matmul`` at PyTorch's float32
    matmul precision."""
    kwargs = (("_precision", matmul_precision()),) if matmul else ()
    return _native.outputs(op, values, attrs, kwargs, meta)


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


def configure(fallback: Callable) -> None:
    """Hand the C recording path what it calls back into: ``fallback(func, args, kwargs)`` runs
    an op's handler; ``tensor.make_wrapper`` makes its tensors."""
    _native.configure(
        tensor_type=_tensor.LazyTensor,
        foreign_type=torch.Tensor,
        fallback=fallback,
        flags=vars(_sites),
        meta_cache=BACKEND.meta_cache,
        memo_entry=memo_entry,
        dtype_type=torch.dtype,
        dtype_names=DTYPE_NAMES,
        dtype_name=dtype_name,
        device_type=torch.device,
        generator_type=torch.Generator,
        symint_type=torch.SymInt,
        str_types=STR_TYPES,
        scalar_leaf=scalar_leaf,
        constant=constant,
        storage=Storage,
        operands=OPERANDS,
        view_cache=BACKEND.view_cache,
        make_wrapper=_tensor.make_wrapper,
        devices=tuple(DEVICES),
        getitem_op=GETITEM,
    )
