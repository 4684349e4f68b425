"""aten dispatch: every op resolves once to a handler, which records it as IR, derives it from
another op, decomposes it or runs it on the CPU fallback.

A handler is a special one (ops.py and the modules beside it register theirs with ``special``),
a recorded lowering (``recorded``), an in-place or out= variant of a functional op, a view, a
``torch._decomp`` decomposition, a CompositeImplicitAutograd decomposition or the fallback. An
op whose handler has a plan (recording.py) is handled by the C dispatch (lazy_torch/csrc) first;
it calls the handler where the plan declines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._decomp import decomposition_table

import runtime
from lazy_torch import fallback as _fallback
from lazy_torch import recording, variants
from lazy_torch import sites as _sites
from lazy_torch import tensor as _tensor
from lazy_torch.backend import BACKEND
from lazy_torch.foreach import foreach_handler
from lazy_torch.recording import RECORD, SHARE, plan_of, record, record_elements, share_plan
from lazy_torch.resize import fallback_out_variant, out_variant
from lazy_torch.shapes import FALLBACK_EXCEPTIONS
from lazy_torch.tensor import _native
from lazy_torch.views import STORAGE_RELATIVE, VIEWS

Handler = Callable[[Any, tuple, dict], Any]

_handlers = BACKEND.handlers  # id(op) -> handler (backend.py)


def special(*funcs: Any, plan: int | None = None) -> Callable[[Handler], Handler]:
    """Register a hand-written handler for ``funcs`` (copy_, _to_copy, sync points, ...);
    ``plan``: RECORD where the C dispatch may record a call as ``record`` would (declining where
    the handler must decide), SHARE where it shares the argument's view as the handler does."""

    def register(fn: Handler) -> Handler:
        for f in funcs:
            _handlers[id(f)] = fn
            if plan is not None:
                _native.register(f, plan_of(f) if plan == RECORD else share_plan(f))
        return fn

    if plan not in (None, RECORD, SHARE):
        raise ValueError(f"special(plan=...) is RECORD or SHARE, not {plan!r}")
    return register


def handler_of(func: Any) -> Handler:
    """``func``'s handler, resolved at its first call."""
    handler = _handlers.get(id(func))
    if handler is None:
        handler = _handlers[id(func)] = _resolve(func)
        plan = plan_of(func) if handler is recorded else getattr(handler, "plan", None)
        if plan is not None:
            _native.register(func, plan)
    return handler


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    handler = _handlers.get(id(func)) or handler_of(func)
    if _sites.recording:
        return _sites.call_attributed(handler, func, args, kwargs)
    return handler(func, args, kwargs)


def recorded(func: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``func`` as a node, or run it on the CPU fallback when it cannot be recorded."""
    try:
        return record(func, args, kwargs)
    except FALLBACK_EXCEPTIONS as e:
        if getattr(e, "eager_dtype_error", False):  # not a missing lowering
            raise
        return _fallback.run(func, args, kwargs)


def check_values(checks: Iterable[Any]) -> None:
    """Make every call of each op of ``checks`` (scalar_checks.py's ValueChecks) run its check
    first: wrap the op's handler, and hand the check to the C dispatch, which runs it before
    recording the op itself. Run once, after every module has registered its handlers."""
    for check in checks:
        op = check.op
        handler = handler_of(op)
        special(op, plan=RECORD if handler is recorded else None)(_checked(check, handler))
        if check.positions:
            _native.value_check(op, (check, check.positions, check.names))


def _checked(check: Callable, handler: Handler) -> Handler:
    @functools.wraps(handler)  # it is the same handler, its check first
    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        check(args, kwargs)
        return handler(func, args, kwargs)

    return handle


def _resolve(func: Any) -> Handler:
    name = str(func)
    if name.startswith("aten._foreach_"):
        handler = foreach_handler(func, dispatch, record_elements)
        if handler is not None:
            return handler
    if func in VIEWS:
        storage_relative = func in STORAGE_RELATIVE
        handler = variants.view(VIEWS[func], storage_relative)
        # C makes views whose steps start at the tensor's view.
        handler.plan = None if storage_relative else recording.view_plan(func, False)
        return handler
    if runtime.has_lowering(name):
        return recorded
    functional = variants.functional_of(func)
    if functional is not None and not variants.is_inplace(func):
        # An out= op is its functional op, then eager's rules for filling out tensors.
        return out_variant(functional, dispatch)
    if functional is not None and (
        runtime.has_lowering(str(functional)) or functional in decomposition_table
    ):
        if functional in VIEWS:
            return variants.inplace_view(functional, dispatch)
        return variants.inplace(functional, dispatch)
    decomp = decomposition_table.get(func)
    if decomp is not None:
        return variants.decomposed(decomp)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        # Composite ops called from inside a handler or decomposition arrive undecomposed.
        return variants.decomposed(func.decompose)
    if any(a.is_out for a in func._schema.arguments):
        return fallback_out_variant(_fallback.run)
    return _fallback.run


def use_wrapper(make: Callable) -> None:
    """Make lazy tensors' wrappers with ``make``, a function with the signature of
    ``torch.Tensor._make_wrapper_subclass`` (``host_step.py --torch-wrapper`` compares the C++ one
    with PyTorch's)."""
    _tensor.make_wrapper = make
    recording.configure(dispatch)


recording.configure(dispatch)
