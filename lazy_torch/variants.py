"""Handlers derived from other ops: in-place and out= ops are their functional op plus a
substitution, view ops make views from the view memo, decompositions run their rule.

Each maker takes the ``dispatch`` function that runs the ops a handler calls (dispatch.py, which
resolves ops to these handlers, passes its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lazy_torch.backend import BACKEND
from lazy_torch.eager_checks import check_inplace_overlap
from lazy_torch.recording import memo_key, record, view_key
from lazy_torch.resize import become
from lazy_torch.shapes import check_like_eager, infer
from lazy_torch.tensor import LazyTensor, is_meta, wrap
from lazy_torch.views import STORAGE_STEP, write

Handler = Callable[[Any, tuple, dict], Any]


def assign(target: LazyTensor, value: LazyTensor) -> None:
    """Give ``target`` the value of ``value`` (same shape), cast to ``target``'s dtype; a write
    through a view updates its storage, and so every view of it."""
    if value.dtype != target.dtype:
        value = record(torch.ops.aten._to_copy.default, (value,), {"dtype": target.dtype})
    assign_node(target, value._lazy.node)


assign_node = write  # through its view steps, or by address where one has no inverse


_OPTIONS = ("dtype", "layout", "device", "pin_memory")


def _functional_name(packet: str) -> str | None:
    """The functional op's name of an in-place op's name (``add_``, ``__irshift__``), else None."""
    if packet.startswith("__i") and packet.endswith("__"):
        return "__" + packet[3:]
    return packet[:-1] if packet.endswith("_") and not packet.endswith("__") else None


def is_inplace(func: Any) -> bool:
    return _functional_name(func._schema.name.split("::")[1]) is not None


def functional_of(func: Any) -> Any:
    """The functional overload matching in-place or out= ``func``, or None.

    Matched by schema, not by overload name (``pow_.Scalar`` is ``pow.Tensor_Scalar``; the
    in-place operators ``__irshift__`` are ``__rshift__``). An out=
    factory (``arange.start_out``) matches a functional overload that takes tensor options
    instead of ``out`` (``arange.start_step``); the out tensor supplies them.
    """
    packet = func._schema.name.split("::")[1]
    arguments = func._schema.arguments
    functional = _functional_name(packet)
    if functional is not None:
        packet, wanted = functional, [(a.name, str(a.type)) for a in arguments]
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


def inplace(functional: Any, dispatch: Handler) -> Handler:
    """``x.add_(y)``: the functional op's result becomes ``x``'s value, with eager's checks."""

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        self = args[0]
        key = memo_key(func, args, kwargs)  # raises PyTorch's device-mismatch error
        eager_resizes = False
        try:
            infer(func, args, kwargs, key)  # eager's errors
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


def inplace_view(functional: Any, dispatch: Handler) -> Handler:
    """``squeeze_``, ``transpose_``, ``as_strided_``, ...: self becomes the view."""

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        return become(args[0], dispatch(functional, args, kwargs))

    return handle


def decomposed(decomp: Callable) -> Handler:
    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        return decomp(*args, **kwargs)

    return handle


def view(build: Callable, storage_relative: bool) -> Handler:
    """A view op: its Meta(s) and view steps from the view memo (a view's steps depend only on
    its arguments' metadata, so one lookup replaces shape inference and building them; ``build``
    makes the steps on a miss), then tensors on the argument's view, or on its storage for a
    ``storage_relative`` op whose steps start there. dispatch() in C does the same on a hit."""

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        self = args[0]
        key = view_key(func, args, kwargs)
        entry = BACKEND.view_cache.get(key)
        if entry is None:
            meta = infer(func, args, kwargs, key)
            steps = build(args, kwargs, meta if is_meta(meta) else list(meta), self._meta)
            entry = BACKEND.view_cache[key] = (meta, tuple(steps))
        meta, steps = entry
        parent = self._lazy
        if storage_relative and steps[0].op == STORAGE_STEP:
            parent = parent.storage
        if is_meta(meta):
            return wrap(parent.then(steps[0]), meta)
        return type(meta)(wrap(parent.then(step), m) for step, m in zip(steps, meta))

    return handle
