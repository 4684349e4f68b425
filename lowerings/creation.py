"""Lowerings: factories and fills (empty, zeros, ones, full, arange, eye, tril/triu, ...)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lazy_core.ir import ZERO_DIM
from lowerings.dtypes import cast
from lowerings.registry import lowering


def _zeros(ctx, *args, **kwargs):
    # Uninitialized memory has no pure meaning; zeros keep graphs deterministic.
    return jnp.zeros(ctx.shape, ctx.dtype)


lowering(
    "aten.empty.memory_format",
    "aten.empty_strided.default",
    "aten.empty_like.default",
    "aten.new_empty.default",
    "aten.new_empty_strided.default",
    "aten.zeros.default",
    "aten.zeros_like.default",
    "aten.new_zeros.default",
    "aten.zero.default",
    "aten._efficientzerotensor.default",
)(_zeros)


def _tri_indices(lower: bool):
    def lower_fn(ctx, row, col, offset=0, **kwargs):
        # Static: the (2, N) coordinates of the triangle in row-major order, as eager lists them.
        rows, cols = np.indices((row, col))
        keep = (cols - rows <= offset) if lower else (cols - rows >= offset)
        return jnp.asarray(np.stack([rows[keep], cols[keep]]), ctx.dtype)

    return lower_fn


lowering("aten.tril_indices.default")(_tri_indices(lower=True))
lowering("aten.triu_indices.default")(_tri_indices(lower=False))


@lowering("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx, *args, **kwargs):
    return jnp.ones(ctx.shape, ctx.dtype)


@lowering("aten.full.default", "aten.new_full.default")
def _full(ctx, size_or_self, size_or_value, fill_value=None, **kwargs):
    value = size_or_value if fill_value is None else fill_value
    return jnp.full(ctx.shape, cast(value, ctx.dtype))


@lowering("aten.full_like.default", "aten.fill.Scalar", "aten.fill.Tensor")
def _fill(ctx, self, value, **kwargs):
    return jnp.full(ctx.shape, cast(value, ctx.dtype))


@lowering("aten.scalar_tensor.default")
def _scalar_tensor(ctx, s, **kwargs):
    return cast(s, ctx.dtype)


@lowering(ZERO_DIM)
def _zero_dim(ctx, s):
    # A 0-dim CPU tensor operand's parameter as a value of its own: the parameter itself is what
    # lowerings rank as a Python number in type promotion (ctx.is_scalar).
    return jnp.array(s, dtype=ctx.dtype, copy=True)


@lowering("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx, *args, **kwargs):
    if len(args) == 1:
        start, step = 0, 1
    else:
        start, step = args[0], args[2] if len(args) > 2 else kwargs.get("step", 1)
    n = ctx.shape[0]
    if jnp.issubdtype(ctx.dtype, jnp.integer):
        return (
            jnp.asarray(start, jnp.int64) + jnp.arange(n, dtype=jnp.int64).astype(ctx.dtype) * step
        )
    # PyTorch computes start + i * step in double precision, then casts.
    return (start + jnp.arange(n, dtype=jnp.float64) * step).astype(ctx.dtype)


@lowering("aten.linspace.default")
def _linspace(ctx, start, end, steps, **kwargs):
    return jnp.linspace(start, end, steps, dtype=jnp.float64).astype(ctx.dtype)


@lowering("aten.eye.default", "aten.eye.m")
def _eye(ctx, n, m=None, **kwargs):
    return jnp.eye(ctx.shape[0], ctx.shape[1], dtype=ctx.dtype)


@lowering("aten.tril.default")
def _tril(ctx, self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowering("aten.triu.default")
def _triu(ctx, self, diagonal=0):
    return jnp.triu(self, diagonal)
