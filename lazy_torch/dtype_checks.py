"""Dtype checks of eager's CPU kernels, which meta kernels do not make: an op is replayed once per
shape-memo entry on 1-element CPU stand-ins of its tensors, and eager's error is raised when it
depends only on dtypes and on the types of Scalar arguments.

A stand-in keeps its tensor's dtype and shape (zeros); for large pointwise ops (and the losses of
``_ONE_PER_DIM``), its dtype and number of dims only (type promotion and the kernel eager picks
depend on both). Only errors that no shape or tensor value decides count (``_TRUSTED``). Only aten
ops are replayed, and not those that draw random numbers: they would advance eager's CPU generator.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from lazy_torch.eager_checks import replay

# RuntimeErrors eager's kernels raise for a dtype, or for the type of a Scalar argument.
_DTYPE_MESSAGES = (
    "Boolean alpha only supported for Boolean results",
    "For integral input tensors, argument alpha must not be a floating point",
    "Subtraction, the `-` operator, with (a bool tensor|two bool tensors) is not",
    "std and var only support floating point and complex dtypes",
    r"\w+\(\): does not support bool input",
    "Boolean inputs not supported for",
    "expected target dtype to be Long or Byte, but got",  # nll_loss's class targets
)
# Errors that eager's kernels raise for dtypes alone, by type: kernels without a case for a dtype.
_TRUSTED = {
    NotImplementedError: re.compile(r'^"\w+" not implemented for \''),
    RuntimeError: re.compile("|".join(_DTYPE_MESSAGES)),
}


# Arguments of at most this many elements in all are replayed at their own shapes (as zeros, as
# _raise_eager_error in dispatch.py does); larger ones only for pointwise ops, at 1 element each:
# a kernel of another kind may read past a stand-in smaller than its other arguments say.
_FULL_SIZE_MAX = 1 << 16
# Non-pointwise ops whose arguments' sizes all shrink together at 1 element per dim (input, target,
# a weight of one class, grad_output): a batch of one sample of one class, which target 0 picks.
_ONE_PER_DIM = {
    id(op)
    for op in (
        torch.ops.aten.nll_loss_forward.default,
        torch.ops.aten.nll_loss2d_forward.default,
        torch.ops.aten.nll_loss_backward.default,
        torch.ops.aten.nll_loss2d_backward.default,
    )
}


def _numel(v: Any) -> int:
    if isinstance(v, torch.Tensor) and v.device.type == "meta":
        return v.numel()
    if isinstance(v, (list, tuple)):
        return sum(_numel(x) for x in v)
    return 0


def _standin(t: torch.Tensor, full: bool) -> torch.Tensor:
    if full or t.numel() == 0:  # eager may skip an empty tensor's kernel: keep it empty
        return torch.zeros(t.shape, dtype=t.dtype)
    return torch.zeros((1,) * t.dim(), dtype=t.dtype)


def _has_tensor(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    return isinstance(v, (list, tuple)) and any(_has_tensor(x) for x in v)


def check(func: Any, margs: tuple, mkwargs: dict) -> None:
    """Raise eager CPU's error for a call of ``func`` on arguments of these dtypes (lazy tensors
    and CPU scalars as meta tensors in ``margs`` / ``mkwargs``), if it is a trusted one."""
    if func.namespace != "aten" or torch.Tag.nondeterministic_seeded in func.tags:
        return  # another library's op (a collective) may wait for peers; a random one draws
    if not (_has_tensor(margs) or _has_tensor(tuple(mkwargs.values()))):
        return  # a factory: its size is what its arguments say, and dtypes rarely fail
    full = _numel((margs, tuple(mkwargs.values()))) <= _FULL_SIZE_MAX
    if not full and torch.Tag.pointwise not in func.tags and id(func) not in _ONE_PER_DIM:
        return
    e = replay(func, margs, mkwargs, lambda t: _standin(t, full))
    pattern = _TRUSTED.get(type(e))
    if pattern is not None and pattern.search(str(e)):
        e.eager_dtype_error = True  # not a missing lowering: no CPU fallback
        raise e.with_traceback(None) from None
