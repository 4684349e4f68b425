"""Eager CPU's checks that meta kernels skip, replayed on stand-ins at the user's line.

Shape inference (dispatch.py's ``_memo``) runs each op on meta tensors. For a few ops the meta
kernel accepts a call eager CPU PyTorch refuses (a max over an empty dimension), which would be
recorded and then fail to compile at the next barrier, or gives another dtype (a bool tensor to a
bool power). For those ops eager is replayed on stand-ins of the arguments' shapes and dtypes that
cost no memory of their size, once per shape-memo signature (``MEMO_RULES``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

# ----------------------------------------------------------------------------------------------
# Replays on stand-ins of meta arguments.


def _replay(func: Any, margs: Any, mkwargs: dict, standin: Callable) -> Any:
    """``func`` run by eager CPU PyTorch on ``standin(t)`` for each meta tensor ``t``: its result,
    or the exception it raised."""

    def cpu(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.device.type == "meta":
            return standin(v)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        return torch.device("cpu") if isinstance(v, torch.device) else v

    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return func(*cpu(margs), **{k: cpu(v) for k, v in mkwargs.items()})
    except Exception as e:  # noqa: BLE001 (whatever eager raises is the answer)
        return e


def _is_empty_meta(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.numel() == 0


def _empty_standin(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor as itself (it costs nothing); any other as zeros taking no memory."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    return torch.zeros((), dtype=t.dtype).expand(t.shape)


def _empty_reduction(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """Reductions with no identity: eager refuses an empty reduced dimension (``max(): Expected
    reduction dim 0 to have non-zero size``), their meta kernels do not."""
    if any(_is_empty_meta(a) for a in margs):
        error = _replay(func, margs, mkwargs, _empty_standin)
        if isinstance(error, Exception):
            raise error.with_traceback(None) from None
    return result


def _tiny_standin(t: torch.Tensor) -> torch.Tensor:
    """A one-element tensor of ``t``'s dtype and number of dimensions (which type promotion
    looks at: a 0-dim tensor promotes as a number would)."""
    return torch.zeros((1,) * t.dim(), dtype=t.dtype)


def _is_bool(v: Any) -> bool:
    return type(v) is bool or (isinstance(v, torch.Tensor) and v.dtype == torch.bool)


def _bool_pow(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """pow of bools: eager's result for a bool exponent is a bool tensor (exponents 0 and 1 need
    no kernel: a fill or a copy), the meta kernel's is int64. Every value of a bool argument
    behaves alike, so the replay stands for every call of this signature. (Eager has no kernel
    for a bool tensor exponent: dtype_checks.py raises its error.)"""
    if not all(_is_bool(a) for a in margs):
        return result
    eager = _replay(func, margs, mkwargs, _tiny_standin)
    if isinstance(eager, Exception) or eager.dtype == result.dtype:
        return result
    return torch.empty_strided(result.shape, result.stride(), dtype=eager.dtype, device="meta")


# id(op) -> rule(func, meta args, meta kwargs, meta result) -> the result eager's checks leave
# (or raise eager's error).
MEMO_RULES: dict[int, Callable[[Any, tuple, dict, Any], Any]] = {
    id(op): _empty_reduction
    for op in (
        aten.max.default,
        aten.min.default,
        aten.max.dim,
        aten.min.dim,
        aten.amax.default,
        aten.amin.default,
        aten.argmax.default,
        aten.argmin.default,
        aten.aminmax.default,
        aten.kthvalue.default,
        aten.median.default,
        aten.median.dim,
        aten.nanmedian.default,
        aten.nanmedian.dim,
        aten.mode.default,
    )
}
MEMO_RULES.update(
    {id(op): _bool_pow for op in (aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)}
)


def eager_memo_rule(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """The meta kernel's ``result`` of a call on meta arguments, as eager's checks leave it (or
    eager's error raised): applied on a shape-memo miss, so once per signature."""
    rule = MEMO_RULES.get(id(func))
    return result if rule is None else rule(func, margs, mkwargs, result)
