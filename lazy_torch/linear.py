"""A linear layer as one node forward and one backward: ``F.linear`` on lazy tensors, and under
``lazy_torch.amp.autocast`` also ``addmm`` (GPT-2's Conv1D).

Through the ordinary kernels a linear layer is several aten ops a step: a transpose and
``addmm`` (and views around a batch's rows); then ``addmm``'s backward: two transposes, two
products, a sum, views, and the gradients' detaches; under autocast also the casts of input,
weight and bias and their casts back. Each costs a trip through PyTorch's Python key and the
autograd engine, which is most of what a lazy step costs the host. So a layer records one
``lazy.linear`` node, with a ``LazyLinearBackward`` grad_fn whose backward records one
``lazy.linear_backward`` node (lowerings/linalg.py computes both as addmm and mm compute them:
operands in the output's dtype, accumulation in float32 or wider rounded once, gradients cast to
each input's dtype). That grad_fn is a C++ autograd node (csrc/linear.cpp). A double
backward (``create_graph=True``) runs the same products as differentiable aten ops.

Two entry points:
- ``F.linear`` (``aten::linear``, composite in PyTorch) has a kernel at the AutogradLazy key, where
  the composite would decompose, for inputs, weight and bias of one floating dtype.
- Under autocast, amp's kernels of ``addmm`` and ``linear`` call ``addmm``/``linear`` here with
  the autocast dtype (the operands may be float32 or already in the autocast dtype).

Only calls eager computes the same way are fused: ``addmm`` with a 1-d bias and
``beta = alpha = 1``, ``linear`` without a bias, on a matrix, or on a contiguous input (otherwise
PyTorch adds the bias after rounding the product). Anything else, and shape and dtype errors,
take the ordinary kernels; so does an input with a forward-mode gradient. In inference mode the
autograd keys are skipped and the Python key decomposes ``linear`` as before.
``LAZY_FUSE_LINEAR=0`` turns all of it off.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import runtime
from lazy_torch.recording import record_op
from lazy_torch.tensor import LazyTensor, dense_meta, extension

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _forward(x: Any, weight: Any, bias: Any, transposed: bool, dtype: torch.dtype) -> Any:
    """The layer's one node, in ``dtype``."""
    out = weight._meta.shape[0 if transposed else 1]
    values = [x, weight] if bias is None else [x, weight, bias]
    meta = dense_meta((*x._meta.shape[:-1], out), dtype)
    return record_op("lazy.linear", values, (transposed,), meta, matmul=True)


def _backward(
    grad: Any, x: Any, weight: Any, transposed: bool, dtype: torch.dtype,
    bias_dtype: torch.dtype | None, need_x: bool, need_w: bool, need_b: bool,
) -> tuple:  # fmt: skip
    """The gradients of x, weight and bias (None where not needed): one node, or differentiable
    ops when the backward itself is recorded (``create_graph=True``)."""
    if torch.is_grad_enabled():
        rows = _rows(grad)
        w = weight.to(dtype)
        w = w.t() if transposed else w  # (in, out)
        grad_x = (rows @ w.t()).reshape(x.shape).to(x.dtype) if need_x else None
        grad_w = None
        if need_w:
            grad_w = _rows(x.to(dtype)).t() @ rows
            grad_w = (grad_w.t() if transposed else grad_w).to(weight.dtype)
        grad_b = rows.sum(0).to(bias_dtype) if need_b else None
        return grad_x, grad_w, grad_b
    w_shape = weight._meta.shape
    metas = (
        dense_meta(x._meta.shape, x._meta.dtype) if need_x else None,
        dense_meta(w_shape, weight._meta.dtype) if need_w else None,
        dense_meta((w_shape[0 if transposed else 1],), bias_dtype) if need_b else None,
    )
    values = [grad, x, weight]
    return tuple(record_op("lazy.linear_backward", values, (transposed,), metas, matmul=True))


def _rows(t: Any) -> Any:
    """``t`` as a matrix of its last dimension's rows (``-1`` is ambiguous when that is empty)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


extension.set_linear_backward(_backward)


def _apply(x: Any, weight: Any, bias: Any, transposed: bool, dtype: torch.dtype) -> Any:
    return extension.linear(_forward, x, weight, bias, transposed, dtype)


def addmm(dtype: torch.dtype, self: Any, mat1: Any, mat2: Any, *, beta=1, alpha=1) -> Any:
    """``torch.addmm`` in ``dtype`` as one node, or NotImplemented where eager computes it
    otherwise (the caller has checked its operands are lazy and floating)."""
    if beta != 1 or alpha != 1:
        return NotImplemented
    bias, rows, weight = self._meta.shape, mat1._meta.shape, mat2._meta.shape
    if len(rows) != 2 or len(weight) != 2 or bias != (weight[1],) or rows[1] != weight[0]:
        return NotImplemented
    return _apply(mat1, mat2, self, False, dtype)


def linear(dtype: torch.dtype, input: Any, weight: Any, bias: Any = None) -> Any:
    """``F.linear`` in ``dtype`` as one node, or NotImplemented where eager computes it
    otherwise (the caller has checked its operands are lazy and floating)."""
    shape, w = input._meta.shape, weight._meta.shape
    if len(shape) < 2 or len(w) != 2 or shape[-1] != w[1]:
        return NotImplemented
    if bias is not None and (
        bias._meta.shape != (w[0],) or not (len(shape) == 2 or input.is_contiguous())
    ):
        return NotImplemented
    return _apply(input, weight, bias, True, dtype)


_composite = torch.ops.aten.linear.default.decompose


def _linear_kernel(input: Any, weight: Any, bias: Any = None) -> Any:
    """``aten::linear`` at AutogradLazy: one node where its tensors are lazy and of one floating
    dtype, else PyTorch's composite (which raises eager's errors)."""
    if (
        runtime.config.FUSE_LINEAR
        and isinstance(input, LazyTensor)
        and isinstance(weight, LazyTensor)
        and (dtype := input._meta.dtype) in _FLOATS
        and weight._meta.dtype is dtype
        and (bias is None or (isinstance(bias, LazyTensor) and bias._meta.dtype is dtype))
    ):
        out = linear(dtype, input, weight, bias)
        if out is not NotImplemented:
            return out
    return _composite(input, weight, bias)


_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (a kernel for an existing aten op)
_lib.impl("linear", _linear_kernel, "AutogradLazy")
