"""``aten._foreach_*`` ops: the per-tensor op over every list element, recorded as one node.

PyTorch's optimizers take their foreach path (one call per op over all parameters, instead of one
call per parameter and op) on devices and tensor types that declare foreach support; here lazy
tensors do. Each foreach op resolves once, by schema, to the element op with matching argument
types (``_foreach_add_.List`` -> ``add.Tensor``, ``_foreach_lerp.Scalar`` -> ``lerp.Scalar``).
When that op has a lowering and every result is a floating-point tensor (of its target's shape and
dtype, in place), the whole call is one ``foreach`` node (``dispatch.record_elements``); otherwise
the handler dispatches the element op per element (integer lists, ops decomposed or run by a
Python function). Either way nothing goes through the C++ dispatcher per element or falls back.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch

import runtime
from lazy_torch import scalar_checks
from lazy_torch.tensor import LazyTensor

aten = torch.ops.aten


def _powsum(t: torch.Tensor, ord: Any = 2, dtype: torch.dtype | None = None) -> torch.Tensor:
    return (t if dtype is None else t.to(dtype)).abs().pow(ord).sum()


# Foreach ops whose element op has another name or signature (a Python function gets the foreach
# op's arguments by name and runs as torch ops on the element).
_ELEMENT_OPS: dict[str, Callable[..., Any]] = {
    "powsum.Scalar": _powsum,
    "norm.Scalar": aten.linalg_vector_norm.default,
    "maximum.Scalar": aten.clamp_min.default,
    "minimum.Scalar": aten.clamp_max.default,
    "maximum.ScalarList": aten.clamp_min.default,
    "minimum.ScalarList": aten.clamp_max.default,
}


def _is_list(t: Any) -> bool:
    return isinstance(t, torch._C.ListType)


def _kind(t: Any) -> str:
    """An argument type without list and optional wrappers: "Tensor", "number", "int", ..."""
    while isinstance(t, (torch._C.ListType, torch._C.OptionalType)):
        t = t.getElementType()
    return str(t)


def _element_overload(name: str, kinds: list[str]) -> Any:
    """The overload of ``aten.<name>`` whose leading arguments have ``kinds``, with defaults for
    the rest; None when there is none."""
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    for overload in packet.overloads():
        op = getattr(packet, overload)
        args = op._schema.arguments
        if [_kind(a.type) for a in args[: len(kinds)]] == kinds and all(
            a.has_default_value() for a in args[len(kinds) :]
        ):
            return op
    return None


def _roles(arguments: list) -> tuple[list[str], list[str]]:
    """Per foreach argument: its role, "list" (one entry per element), "values" (a 1-d tensor of
    per-element scalars) or "same" (one value for every element); and its element type."""
    roles, kinds = [], []
    for a in arguments:
        if _is_list(a.type):
            roles.append("list")
        elif a.name == "scalars" and _kind(a.type) == "Tensor":
            roles.append("values")
        else:
            roles.append("same")
        kinds.append("number" if roles[-1] == "values" else _kind(a.type))
    return roles, kinds


def foreach_handler(func: Any, dispatch: Callable, record_elements: Callable) -> Any:
    """The handler of ``aten._foreach_<op>[_].<overload>``, or None when no element op fits;
    ``dispatch`` and ``record_elements`` are the backend's (dispatch.py, which imports this).

    An in-place foreach op uses the in-place element op, or the functional one and a copy_."""
    schema = func._schema
    if any(a.is_out for a in schema.arguments):
        return None  # out= variants are the functional foreach op and a copy (dispatch's rule)
    base = schema.name.removeprefix("aten::_foreach_")
    inplace = base.endswith("_")
    name = base.removesuffix("_")
    arguments = schema.arguments
    roles, kinds = _roles(arguments)
    element = _ELEMENT_OPS.get(f"{name}.{func._overloadname}") or _element_overload(name, kinds)
    in_place = _element_overload(name + "_", kinds) if inplace else None
    op = in_place or element
    if op is None:
        return None
    # Each foreach argument goes to the element argument of the same name, else of the same
    # position: a keyword where the element op takes it as one (addcdiv's ``value``).
    if hasattr(op, "_schema"):
        element_args = op._schema.arguments
        by_name = {a.name: a for a in element_args}
        names = []
        for i, a in enumerate(arguments):
            target = by_name.get(a.name, element_args[i])
            names.append(target.name if target.kwarg_only else None)
        call = functools.partial(dispatch, op)
    else:
        names = [None] + [a.name for a in arguments[1:]]
        call = lambda args, kwargs: op(*args, **kwargs)
    positions = {a.name: i for i, a in enumerate(arguments)}
    copy_back = inplace and in_place is None
    # One node for the whole list when the functional element op has a lowering; its elements'
    # numbers are checked as the element op's handler would (the other path calls it).
    fusable = hasattr(element, "_schema") and runtime.has_lowering(str(element))
    value_check = scalar_checks.check_of(element) if fusable else None
    numeric = [i for i, k in enumerate(kinds) if k in ("Scalar", "number")]

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        values = [*args] + [_MISSING] * (len(arguments) - len(args))
        for k, v in kwargs.items():
            values[positions[k]] = v
        # One column per argument (a list, or one value repeated), zipped into per-element calls;
        # a keyword argument with one value for every element goes in one shared dict.
        n = len(values[roles.index("list")])
        positional, keys, keyed, shared = [], [], [], {}
        for v, role, key in zip(values, roles, names):
            if v is _MISSING:
                continue
            if key is not None and role == "same":
                shared[key] = v
                continue
            column = v if role == "list" else v.tolist() if role == "values" else [v] * n
            if key is None:
                positional.append(column)
            else:
                keys.append(key)
                keyed.append(column)
        if keyed:
            calls = [
                (a, {**shared, **dict(zip(keys, k))}) for a, k in zip(zip(*positional), zip(*keyed))
            ]
        else:
            # Every element's kwargs are the shared dict (nothing writes to it); pairs built in C.
            calls = list(zip(zip(*positional), itertools.repeat(shared)))
        if fusable and calls:
            if value_check is not None and not scalar_checks.fit_every_floating_dtype(
                _numbers(values, roles, numeric)
            ):
                for e_args, e_kwargs in calls:
                    value_check(e_args, e_kwargs)
            targets = list(positional[0]) if inplace else None
            out = record_elements(element, calls, targets)
            if out is not None:
                return None if inplace else out
        results = []
        for e_args, e_kwargs in calls:
            out = call(e_args, e_kwargs)
            if copy_back:
                dispatch(aten.copy_.default, (e_args[0], out), {})
            results.append(out)
        return None if inplace else results

    return handle


_MISSING = object()


def _numbers(values: list, roles: list[str], numeric: list[int]) -> list:
    """The numbers among a foreach call's arguments (at the positions ``numeric``)."""
    found = []
    for i in numeric:
        v = values[i]
        if v is _MISSING:
            continue
        if roles[i] == "list":
            found.extend(v)
        elif roles[i] == "values":  # a lazy tensor's are not read twice: None stands for them
            found.extend([None] if isinstance(v, LazyTensor) else v.tolist())
        else:
            found.append(v)
    return found
