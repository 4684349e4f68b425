"""Autocast's linear layers as one node forward and one backward: ``addmm`` (GPT-2's Conv1D) and
``F.linear`` under ``lazy_torch.amp.autocast``.

Under autocast a linear layer is a dozen or more aten ops a step: the casts of its input, weight
and bias, the views around a batch's rows, ``addmm``; then ``addmm``'s backward (two transposes,
two products, a sum), the casts back to each input's dtype and the views again. Each costs a trip
through PyTorch's Python key, which is most of what a lazy step costs the host. So the autocast
kernels of ``addmm`` and ``linear`` record one ``lazy.autocast_linear`` node instead, inside an
autograd Function whose backward records one ``lazy.autocast_linear_backward`` node
(lowerings/linalg.py computes both as autocast's ops do: operands cast to the autocast dtype,
float32 accumulation rounded once, gradients cast to their inputs' dtypes). The layer's output has
this Function's backward as its ``grad_fn`` instead of ``AddmmBackward0``; a double backward
(``create_graph=True``) runs the same products as differentiable aten ops.

Only calls eager computes that way are fused: every tensor lazy and of a dtype autocast casts,
``addmm`` with a 1-d bias and ``beta = alpha = 1``, ``linear`` without a bias, on a matrix, or on
a contiguous input (otherwise PyTorch adds the bias after rounding the product). Anything else, and
shape errors, take the ordinary kernels. ``LAZY_FUSE_LINEAR=0`` turns it off.
"""

from __future__ import annotations

from typing import Any

import torch

from lazy_torch.dispatch import record_op
from lazy_torch.tensor import dense_meta


class _AutocastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Any, weight: Any, bias: Any, dtype: Any, transposed: bool) -> Any:
        ctx.save_for_backward(x, weight)
        ctx.transposed, ctx.dtype = transposed, dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        out = weight._meta[0][0 if transposed else 1]
        values = [x, weight] if bias is None else [x, weight, bias]
        meta = dense_meta((*x._meta[0][:-1], out), dtype)
        return record_op("lazy.autocast_linear", values, (transposed,), meta)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # a double backward: differentiable ops
            return (*_composite_backward(ctx, grad, x, weight), None, None)
        w_shape = weight._meta[0]
        metas = (
            dense_meta(x._meta[0], x._meta[3]) if need_x else None,
            dense_meta(w_shape, weight._meta[3]) if need_w else None,
            dense_meta((w_shape[0 if ctx.transposed else 1],), ctx.bias_dtype) if need_b else None,
        )
        grads = record_op(
            "lazy.autocast_linear_backward", [grad, x, weight], (ctx.transposed,), metas
        )
        return (*grads, None, None)


def _composite_backward(ctx: Any, grad: Any, x: Any, weight: Any) -> tuple:
    """The three gradients as autocast's aten ops compute them (each one only where needed)."""
    low = ctx.dtype
    rows = grad.reshape(-1, grad.shape[-1])
    w = weight.to(low)
    w = w.t() if ctx.transposed else w  # (in, out)
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    grad_x = (rows @ w.t()).reshape(x.shape).to(x.dtype) if need_x else None
    grad_w = None
    if need_w:
        grad_w = x.to(low).reshape(-1, x.shape[-1]).t() @ rows
        grad_w = (grad_w.t() if ctx.transposed else grad_w).to(weight.dtype)
    grad_b = rows.sum(0).to(ctx.bias_dtype) if need_b else None
    return grad_x, grad_w, grad_b


def addmm(dtype: torch.dtype, self: Any, mat1: Any, mat2: Any, *, beta=1, alpha=1) -> Any:
    """``torch.addmm`` under autocast to ``dtype`` as one node, or NotImplemented where eager
    computes it otherwise (the caller has checked its operands are lazy and castable)."""
    if beta != 1 or alpha != 1:
        return NotImplemented
    bias, rows, weight = self._meta[0], mat1._meta[0], mat2._meta[0]
    if len(rows) != 2 or len(weight) != 2 or bias != (weight[1],) or rows[1] != weight[0]:
        return NotImplemented
    return _AutocastLinear.apply(mat1, mat2, self, dtype, False)


def linear(dtype: torch.dtype, input: Any, weight: Any, bias: Any = None) -> Any:
    """``F.linear`` under autocast to ``dtype`` as one node, or NotImplemented where eager
    computes it otherwise (the caller has checked its operands are lazy and castable)."""
    shape, w = input._meta[0], weight._meta[0]
    if len(shape) < 2 or len(w) != 2 or shape[-1] != w[1]:
        return NotImplemented
    if bias is not None and (
        bias._meta[0] != (w[0],) or not (len(shape) == 2 or input.is_contiguous())
    ):
        return NotImplemented
    return _AutocastLinear.apply(input, weight, bias, dtype, True)
