"""Lowerings: shape and layout ops (views as pure ops), casts, concatenation and splitting."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from lowerings.dtypes import astype, bitcast
from lowerings.registry import lowering

# Functionalized "_copy" twins (view_copy, permute_copy, ...) lower like their views.


def _twins(*names: str) -> tuple[str, ...]:
    out = []
    for n in names:
        out.append(n)
        packet, overload = n.rsplit(".", 1)
        out.append(f"{packet}_copy.{overload}")
    return tuple(out)


@lowering(
    *_twins("aten.view.default", "aten._reshape_alias.default"),
    "aten._unsafe_view.default",
    "aten.reshape.default",
)
def _reshape(ctx, self, *args):
    return jnp.reshape(self, ctx.shape)


@lowering("aten.view.dtype")
def _view_dtype(ctx, self, dtype):
    return bitcast(self, ctx.dtype, ctx.shape)


@lowering(*_twins("aten.expand.default"))
def _expand(ctx, self, size, *, implicit=False):
    return jnp.broadcast_to(self, ctx.shape)


@lowering(*_twins("aten.permute.default"))
def _permute(ctx, self, dims):
    return jnp.transpose(self, [d % max(self.ndim, 1) for d in dims])


@lowering(*_twins("aten.transpose.int"))
def _transpose(ctx, self, dim0, dim1):
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, dim0, dim1)


@lowering(*_twins("aten.t.default"))
def _t(ctx, self):
    return self.T


@lowering(
    *_twins(
        "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default"
    )
)
def _reshape_only(ctx, self, *args):
    return jnp.reshape(self, ctx.shape)


@lowering(*_twins("aten.slice.Tensor"))
def _slice(ctx, self, dim=0, start=None, end=None, step=1):
    dim = dim % self.ndim
    start, end = _slice_bounds(self.shape[dim], start, end)
    return lax.slice_in_dim(self, start, end, step, axis=dim)


def _slice_bounds(n: int, start, end) -> tuple[int, int]:
    start = 0 if start is None else start
    start = max(0, min(n, start + n if start < 0 else start))
    end = n if end is None else end
    return start, max(start, min(n, end + n if end < 0 else end))


@lowering("aten.slice_scatter.default")
def _slice_scatter(ctx, self, src, dim=0, start=None, end=None, step=1):
    # The write-back of a slice: a static-offset update, no copy beyond the written window.
    dim = dim % self.ndim
    start, end = _slice_bounds(self.shape[dim], start, end)
    index = [slice(None)] * self.ndim
    index[dim] = slice(start, end, step)
    return self.at[tuple(index)].set(src.astype(self.dtype))


@lowering(*_twins("aten.select.int"))
def _select(ctx, self, dim, index):
    dim = dim % self.ndim
    index = index + self.shape[dim] if index < 0 else index
    return lax.index_in_dim(self, index, axis=dim, keepdims=False)


@lowering("aten.select_scatter.default")
def _select_scatter(ctx, self, src, dim, index):
    dim = dim % self.ndim
    index = index + self.shape[dim] if index < 0 else index
    return lax.dynamic_update_index_in_dim(self, src.astype(self.dtype), index, dim)


@lowering("aten.narrow.default")
def _narrow(ctx, self, dim, start, length):
    dim = dim % self.ndim
    start = start + self.shape[dim] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=dim)


@lowering(*_twins("aten.diagonal.default"))
def _diagonal(ctx, self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, dim1 % self.ndim, dim2 % self.ndim)


def _diagonal_index(shape, offset, dim1, dim2):
    n = min(shape[dim1] - max(-offset, 0), shape[dim2] - max(offset, 0))
    i = jnp.arange(max(n, 0))
    return i + max(-offset, 0), i + max(offset, 0)


@lowering("aten.diagonal_scatter.default")
def _diagonal_scatter(ctx, self, src, offset=0, dim1=0, dim2=1):
    dim1, dim2 = dim1 % self.ndim, dim2 % self.ndim
    rows, cols = _diagonal_index(self.shape, offset, dim1, dim2)
    # Move the two diagonal dims to the front; src keeps the diagonal as its last dim.
    moved = jnp.moveaxis(self, (dim1, dim2), (0, 1))
    moved = moved.at[rows, cols].set(jnp.moveaxis(src, -1, 0).astype(self.dtype))
    return jnp.moveaxis(moved, (0, 1), (dim1, dim2))


@lowering(*_twins("aten.unfold.default"))
def _unfold(ctx, self, dimension, size, step):
    if self.ndim == 0:  # one window of size 1 or 0
        return jnp.broadcast_to(self, ctx.shape)
    dim = dimension % self.ndim
    count = ctx.shape[dim]
    idx = _unfold_index(self.shape, dim, count, size, step)
    taken = jnp.take(self, idx.reshape(-1), axis=dim)
    shape = self.shape[:dim] + (count, size) + self.shape[dim + 1 :]
    return jnp.moveaxis(taken.reshape(shape), dim + 1, -1)


def _unfold_index(shape, dim, count, size, step):
    return (jnp.arange(count) * step)[:, None] + jnp.arange(size)[None, :]  # (count, size)


@lowering("lazy.unfold_scatter")
def _unfold_scatter(ctx, self, src, dimension, size, step):
    # The write-back of a non-overlapping unfold: src is (..., count, ..., size) windows.
    if self.ndim == 0:  # an empty window writes nothing
        return jnp.reshape(src, ()).astype(self.dtype) if src.size else self
    dim = dimension % self.ndim
    count = src.shape[dim]
    idx = _unfold_index(self.shape, dim, count, size, step).reshape(-1)
    windows = jnp.moveaxis(src, -1, dim + 1).reshape(
        self.shape[:dim] + (count * size,) + self.shape[dim + 1 :]
    )
    index = [slice(None)] * self.ndim
    index[dim] = idx
    return self.at[tuple(index)].set(windows.astype(self.dtype))


def _strided_index(size, stride, storage_offset):
    idx = jnp.asarray(storage_offset or 0, jnp.int64)
    for n, s in zip(size, stride):
        idx = idx[..., None] + jnp.arange(n, dtype=jnp.int64) * s
    return idx


@lowering("aten.as_strided_scatter.default")
def _as_strided_scatter(ctx, self, src, size, stride, storage_offset=None):
    flat = jnp.reshape(self, (-1,))
    idx = _strided_index(size, stride, storage_offset).reshape(-1)
    return flat.at[idx].set(jnp.reshape(src, (-1,)).astype(self.dtype)).reshape(self.shape)


@lowering(*_twins("aten.as_strided.default"))
def _as_strided(ctx, self, size, stride, storage_offset=None):
    # General strided view of the (contiguous) input's elements: a gather of flat indices.
    flat = jnp.reshape(self, (-1,))
    idx = _strided_index(size, stride, storage_offset)
    return flat[idx.reshape(ctx.shape)] if flat.size else jnp.zeros(ctx.shape, ctx.dtype)


@lowering(
    *_twins("aten.alias.default", "aten.detach.default"),
    "aten.lift_fresh.default",
    "aten.clone.default",
)
def _identity(ctx, self, *args, **kwargs):
    return self


@lowering("aten.copy.default")
def _copy(ctx, self, src, non_blocking=False):
    return jnp.broadcast_to(astype(src, ctx.dtype), ctx.shape)


@lowering("aten._to_copy.default")
def _to_copy(ctx, self, **kwargs):
    return astype(self, ctx.dtype)


@lowering("aten.cat.default")
def _cat(ctx, tensors, dim=0):
    # PyTorch skips legacy empty 1-d tensors in cat.
    parts = [astype(t, ctx.dtype) for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return jnp.zeros(ctx.shape, ctx.dtype)
    return jnp.concatenate(parts, axis=dim % parts[0].ndim)


@lowering("aten.stack.default")
def _stack(ctx, tensors, dim=0):
    return jnp.stack([astype(t, ctx.dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


def _split_at(ctx, self, dim, sizes):
    dim = dim % self.ndim
    outs, start = [], 0
    for n in sizes:
        outs.append(lax.slice_in_dim(self, start, start + n, axis=dim))
        start += n
    return tuple(outs)


@lowering(*_twins("aten.split.Tensor"))
def _split(ctx, self, split_size, dim=0):
    dim_ = dim % self.ndim
    return _split_at(ctx, self, dim, [s[dim_] for s in ctx.shapes])


@lowering(*_twins("aten.split_with_sizes.default"))
def _split_with_sizes(ctx, self, split_sizes, dim=0):
    return _split_at(ctx, self, dim, split_sizes)


@lowering(*_twins("aten.unbind.int"))
def _unbind(ctx, self, dim=0):
    dim = dim % self.ndim
    return tuple(
        lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim])
    )


@lowering("aten.flip.default")
def _flip(ctx, self, dims):
    return jnp.flip(self, [d % self.ndim for d in dims]) if self.ndim else self


@lowering("aten.roll.default")
def _roll(ctx, self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, shifts, [d % self.ndim for d in dims])


@lowering("aten.repeat.default")
def _repeat(ctx, self, repeats):
    x = jnp.reshape(self, (1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, repeats)


@lowering("aten.constant_pad_nd.default")
def _constant_pad_nd(ctx, self, pad, value=0):
    # pad lists (before, after) pairs from the last dimension backwards; negative pads crop.
    config = [(0, 0, 0)] * self.ndim
    for i in range(len(pad) // 2):
        config[self.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(self, jnp.asarray(value, self.dtype), config)
