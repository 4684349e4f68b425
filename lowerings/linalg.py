"""Lowerings: matrix products (mm, bmm, addmm and friends) through jax.lax.dot_general."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowerings.dtypes import cast
from lowerings.registry import LoweringContext, lowering

_LOW_PRECISION = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def accumulation_dtype(dtype: Any) -> np.dtype:
    """The dtype a product of ``dtype`` operands accumulates in: float32 for bf16/fp16, as in
    PyTorch's CPU and CUDA kernels, else ``dtype`` itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in _LOW_PRECISION else dtype


def _dot(
    ctx: LoweringContext, a: Any, b: Any, contract: tuple, batch: tuple = ((), ()), dtype=None
) -> Any:
    """``dot_general`` at the node's precision, accumulated in the accumulation dtype of
    ``dtype`` (default: the node's)."""
    return jax.lax.dot_general(
        a,
        b,
        (contract, batch),
        precision=ctx.precision,
        preferred_element_type=accumulation_dtype(ctx.dtype if dtype is None else dtype),
    )


def _add_scaled(ctx: LoweringContext, self: Any, product: Any, beta: Any, alpha: Any) -> Any:
    """``beta * self + alpha * product`` in the accumulation dtype, rounded once to ``ctx.dtype``.

    As in PyTorch, ``beta == 0`` ignores ``self`` entirely, so NaN/inf in it do not propagate.
    """
    acc = product.dtype
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        product = product * cast(alpha, acc)
    if isinstance(beta, (int, float)) and beta == 0:
        return jnp.broadcast_to(product, ctx.shape).astype(ctx.dtype)
    scaled = self.astype(acc)
    if not (isinstance(beta, (int, float)) and beta == 1):
        beta = cast(beta, acc)
        # A traced beta may still be zero at run time; keep PyTorch's "self is ignored" rule.
        scaled = jnp.where(beta == 0, jnp.zeros((), acc), scaled * beta)
    return jnp.broadcast_to(scaled + product, ctx.shape).astype(ctx.dtype)


@lowering("aten.mm.default")
def _mm(ctx, self, mat2):
    return _dot(ctx, self, mat2, ((1,), (0,))).astype(ctx.dtype)


@lowering("aten.bmm.default")
def _bmm(ctx, self, mat2):
    return _dot(ctx, self, mat2, ((2,), (1,)), ((0,), (0,))).astype(ctx.dtype)


@lowering("aten.mv.default")
def _mv(ctx, self, vec):
    return _dot(ctx, self, vec, ((1,), (0,))).astype(ctx.dtype)


@lowering("aten.dot.default")
def _dot_op(ctx, self, tensor):
    return _dot(ctx, self, tensor, ((0,), (0,))).astype(ctx.dtype)


@lowering("aten.vdot.default")
def _vdot(ctx, self, other):
    return _dot(ctx, jnp.conj(self), other, ((0,), (0,))).astype(ctx.dtype)


@lowering("aten.addmm.default")
def _addmm(ctx, self, mat1, mat2, *, beta=1, alpha=1):
    return _add_scaled(ctx, self, _dot(ctx, mat1, mat2, ((1,), (0,))), beta, alpha)


@lowering("aten.baddbmm.default")
def _baddbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    product = _dot(ctx, batch1, batch2, ((2,), (1,)), ((0,), (0,)))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowering("aten.addbmm.default")
def _addbmm(ctx, self, batch1, batch2, *, beta=1, alpha=1):
    product = _dot(ctx, batch1, batch2, ((0, 2), (0, 1)))
    return _add_scaled(ctx, self, product, beta, alpha)


@lowering("aten.addmv.default")
def _addmv(ctx, self, mat, vec, *, beta=1, alpha=1):
    return _add_scaled(ctx, self, _dot(ctx, mat, vec, ((1,), (0,))), beta, alpha)


@lowering("aten.addr.default")
def _addr(ctx, self, vec1, vec2, *, beta=1, alpha=1):
    if ctx.dtype == np.dtype(bool):
        # PyTorch's boolean addr: (beta and self) or (alpha and outer(vec1, vec2)).
        outer = jnp.logical_and(vec1[:, None], vec2[None, :])
        out = jnp.logical_and(cast(alpha, bool), outer)
        out = jnp.logical_or(out, jnp.logical_and(cast(beta, bool), self))
        return jnp.broadcast_to(out, ctx.shape)
    acc = accumulation_dtype(ctx.dtype)
    outer = vec1.astype(acc)[:, None] * vec2.astype(acc)[None, :]
    return _add_scaled(ctx, self, outer, beta, alpha)


@lowering("aten.matmul.default")
def _matmul(ctx, self, other):
    # Reached only where the front end keeps matmul whole; jnp.matmul has torch.matmul's
    # broadcasting and 1-d promotion rules.
    out = jnp.matmul(
        self,
        other,
        precision=ctx.precision,
        preferred_element_type=accumulation_dtype(ctx.dtype),
    )
    return out.astype(ctx.dtype)


@lowering("aten.linear.default")
def _linear(ctx, input, weight, bias=None):
    # Like matmul, linear is composite in PyTorch; this serves a front end that keeps it whole.
    acc = accumulation_dtype(ctx.dtype)
    out = jnp.matmul(input, weight.T, precision=ctx.precision, preferred_element_type=acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return out.astype(ctx.dtype)


# --- a linear layer as one node forward and one backward (lazy_torch/linear.py) -----------------
# ``weight`` is (in, out) as addmm's mat2, or (out, in) as F.linear's when ``transposed``. Each
# product is computed as addmm and mm compute it in the output's dtype (under autocast, the
# autocast dtype): operands cast to it, accumulation in float32 or wider rounded once to it;
# gradients are then cast to their inputs' dtypes.


def _rows(x: Any) -> Any:
    """``x`` as a matrix of its last dimension's rows, as F.linear flattens its input (sizes
    spelled out: ``-1`` is ambiguous for an empty last dimension)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


@lowering("lazy.linear")
def _linear_layer(ctx, values, transposed):
    x, weight, *bias = values
    low = ctx.dtype
    product = _dot(ctx, _rows(x).astype(low), weight.astype(low), ((1,), (1 if transposed else 0,)))
    product = product.reshape(ctx.shape)
    if not bias:
        return product.astype(low)
    return _add_scaled(ctx, bias[0].astype(low), product, 1, 1)


@lowering("lazy.linear_backward")
def _linear_layer_backward(ctx, values, transposed):
    grad, x, weight = values
    low = grad.dtype
    rows = _rows(grad)
    grad_x = grad_w = grad_b = None
    if ctx.dtypes[0] is not None:
        w = weight.astype(low)
        product = _dot(ctx, rows, w, ((1,), (0 if transposed else 1,)), dtype=low)
        grad_x = product.astype(low).reshape(ctx.shapes[0]).astype(ctx.dtypes[0])
    if ctx.dtypes[1] is not None:
        # (out, in) for F.linear's weight, (in, out) for addmm's: made in that layout, not
        # transposed after.
        xs = _rows(x).astype(low)
        pair = (rows, xs) if transposed else (xs, rows)
        product = _dot(ctx, *pair, ((0,), (0,)), dtype=low).astype(low)
        grad_w = product.astype(ctx.dtypes[1])
    if ctx.dtypes[2] is not None:
        total = jnp.sum(rows.astype(accumulation_dtype(low)), axis=0)
        grad_b = total.astype(low).astype(ctx.dtypes[2])
    return grad_x, grad_w, grad_b
