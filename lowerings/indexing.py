"""Lowerings: gather/scatter, advanced indexing, index_* ops, embedding, one_hot, masked_scatter.

Indices go through jax.numpy indexing, which wraps negative indices as PyTorch's advanced
indexing does. Out-of-range indices (and negative ones where PyTorch rejects them) are caught by
the bounds checks each op declares here (``bounds=``, evaluated by lowerings/bounds.py), which
raise eager's error from the runtime.

``index.Tensor`` and ``index_put`` take integer index tensors only: a boolean mask has a
data-dependent result shape, so the lazy layer turns it into integer indices (after a sync) before
a node is recorded. ``take_along_dim`` is composite in PyTorch and reaches the backend as
``gather``, so it needs no lowering.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
from jax import lax

from lowerings.bounds import EACH, IN_SELF, OUT_OF_BOUNDS, Bound
from lowerings.registry import lowering

# The bounds checks of the ops here: Bound(index position, dim position, negatives wrap, error).
_GATHER = Bound(2, 1, False, RuntimeError, OUT_OF_BOUNDS)
_ADVANCED = Bound(1, EACH, True, IndexError, OUT_OF_BOUNDS)
_INDEX_DIM = Bound(2, 1, False, IndexError, IN_SELF)


def _dim(dim: int, ndim: int) -> int:
    """``dim`` made non-negative; a 0-d tensor has one addressable dim, as in PyTorch."""
    return dim % max(ndim, 1)


def _at_least_1d(*xs: Any) -> tuple[Any, ...]:
    """PyTorch treats a 0-d self/index/src of gather and scatter as shape ``(1,)``."""
    return tuple(None if x is None else jnp.reshape(x, (-1,)) if x.ndim == 0 else x for x in xs)


# ------------------------------------------------------------------------------------------------
# gather / scatter: ``index`` addresses ``self`` along ``dim`` and may be smaller than ``self`` and
# ``src`` in every dim, so the coordinates of every other dim come from an iota over index.


def _coordinates(index: Any, dim: int) -> tuple[Any, ...]:
    """Full coordinates into ``self`` for every element of ``index``."""
    return tuple(
        index if d == dim else lax.broadcasted_iota(index.dtype, index.shape, d)
        for d in range(index.ndim)
    )


def _src_values(src: Any, index: Any, dtype: Any) -> Any:
    """The part of ``src`` (a tensor or scalar) that ``index`` covers, in ``self``'s dtype."""
    src = jnp.asarray(src)
    if src.ndim == 0:
        return jnp.broadcast_to(src.astype(dtype), index.shape)
    return src[tuple(slice(0, n) for n in index.shape)].astype(dtype)


@lowering("aten.gather.default", bounds=_GATHER)
def _gather(ctx, x, dim, index, *, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    x, index = _at_least_1d(x, index)
    dim = _dim(dim, x.ndim)
    if x.shape[dim] == 0:  # every index is out of range: the bounds check raises eager's error
        return jnp.zeros(ctx.shape, ctx.dtype)
    out = x[_coordinates(index, dim)]
    return jnp.reshape(out, ctx.shape)


def _add(ref, v):
    # For bool, PyTorch's sum saturates: adding is logical or (max); multiplying is and (min).
    return ref.max(v) if v.dtype == jnp.bool_ else ref.add(v)


def _multiply(ref, v):
    return ref.min(v) if v.dtype == jnp.bool_ else ref.multiply(v)


_SCATTER_MODES = {
    None: lambda ref, v: ref.set(v),
    "add": _add,
    "sum": _add,
    "multiply": _multiply,
    "prod": _multiply,
    "amax": lambda ref, v: ref.max(v),
    "amin": lambda ref, v: ref.min(v),
}


def _scatter_impl(ctx, x, dim, index, src, reduce=None):
    if index.size == 0:  # nothing is written
        return jnp.reshape(x, ctx.shape)
    x, index = _at_least_1d(x, index)
    dim = _dim(dim, x.ndim)
    values = _src_values(src, index, x.dtype)
    out = _SCATTER_MODES[reduce](x.at[_coordinates(index, dim)], values)
    return jnp.reshape(out, ctx.shape)


@lowering(
    "aten.scatter.src",
    "aten.scatter.value",
    "aten.scatter.reduce",
    "aten.scatter.value_reduce",
    bounds=_GATHER,
)
def _scatter(ctx, x, dim, index, src, *, reduce=None):
    return _scatter_impl(ctx, x, dim, index, src, reduce)


@lowering("aten.scatter_add.default", bounds=_GATHER)
def _scatter_add(ctx, x, dim, index, src):
    return _scatter_impl(ctx, x, dim, index, src, "add")


def _reduce_identity(reduce: str, dtype: Any) -> Any:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if reduce == "amax" else jnp.inf
    if dtype == jnp.bool_:
        return reduce == "amin"
    info = jnp.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


@lowering("aten.scatter_reduce.two", bounds=_GATHER)
def _scatter_reduce(ctx, x, dim, index, src, reduce, *, include_self=True):
    if index.size == 0:
        return jnp.reshape(x, ctx.shape)
    x, index, src = _at_least_1d(x, index, src)
    dim = _dim(dim, x.ndim)
    coords = _coordinates(index, dim)
    values = _src_values(src, index, x.dtype)
    base = x if include_self else x.at[coords].set(_reduce_identity(reduce, x.dtype))
    if reduce != "mean":
        return jnp.reshape(_SCATTER_MODES[reduce](base.at[coords], values), ctx.shape)
    total = base.at[coords].add(values)
    count = jnp.full(x.shape, 1 if include_self else 0, x.dtype).at[coords].add(1)
    # Elements nothing was scattered to keep their value (count 0 divides by 1).
    count = jnp.where(count == 0, 1, count)
    if jnp.issubdtype(x.dtype, jnp.integer):
        out = jnp.floor_divide(total, count)
    else:
        out = total / count
    return jnp.reshape(out, ctx.shape)


# ------------------------------------------------------------------------------------------------
# index_select / index_add: a 1-d (or 0-d) index along one dim.


@lowering("aten.index_select.default", bounds=_INDEX_DIM)
def _index_select(ctx, x, dim, index):
    (x,) = _at_least_1d(x)
    dim = _dim(dim, x.ndim)
    position = (slice(None),) * dim + (jnp.reshape(index, (-1,)),)
    return jnp.reshape(x[position], ctx.shape)


@lowering("aten.index_add.default", bounds=dataclasses.replace(_INDEX_DIM, above_1d=_GATHER))
def _index_add(ctx, x, dim, index, source, *, alpha=1):
    x, source = _at_least_1d(x, source)
    dim = _dim(dim, x.ndim)
    source = source.astype(x.dtype)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        source = source * jnp.asarray(alpha).astype(x.dtype)
    position = (slice(None),) * dim + (jnp.reshape(index, (-1,)),)
    return jnp.reshape(_add(x.at[position], source), ctx.shape)


@lowering(
    "aten.index_copy.default",
    bounds=Bound(2, 1, False, IndexError, "index_copy_(): " + OUT_OF_BOUNDS),
)
def _index_copy(ctx, x, dim, index, source):
    x, source = _at_least_1d(x, source)
    dim = _dim(dim, x.ndim)
    position = (slice(None),) * dim + (jnp.reshape(index, (-1,)),)
    return jnp.reshape(x.at[position].set(source.astype(x.dtype)), ctx.shape)


@lowering(
    "aten.index_fill.int_Scalar",
    "aten.index_fill.int_Tensor",
    bounds=Bound(2, 1, True, IndexError, OUT_OF_BOUNDS),
)
def _index_fill(ctx, x, dim, index, value):
    (x,) = _at_least_1d(x)
    dim = _dim(dim, x.ndim)
    position = (slice(None),) * dim + (jnp.reshape(index, (-1,)),)
    return jnp.reshape(x.at[position].set(jnp.asarray(value).astype(x.dtype)), ctx.shape)


# ------------------------------------------------------------------------------------------------
# Advanced indexing: ``indices`` has an optional integer tensor per leading dim. NumPy's rules,
# which jax.numpy implements, place the broadcast index dims exactly as PyTorch does: in place of
# the indexed dims when those are adjacent, first otherwise.


def _index_tuple(indices: tuple[Any, ...]) -> tuple[Any, ...]:
    for index in indices:
        if index is not None and index.dtype in (jnp.bool_, jnp.uint8):
            raise TypeError("boolean mask indices must be converted to integer indices first")
    # None means "all of this dim" to aten but a new axis to NumPy. jax.numpy wraps negative
    # indices itself.
    return tuple(slice(None) if index is None else index for index in indices)


# The hacked twins keep no bounds check, as before the checks were declared here (eager checks
# them): adding one changes behaviour, with a test of its own.
@lowering("aten.index.Tensor", bounds=_ADVANCED)
@lowering("aten.index.Tensor_hacked_twin")
def _index(ctx, x, indices):
    return jnp.reshape(x[_index_tuple(indices)], ctx.shape)


@lowering("aten.index_put.default", bounds=_ADVANCED)
@lowering("aten.index_put.hacked_twin")
def _index_put(ctx, x, indices, values, accumulate=False):
    ref = x.at[_index_tuple(indices)]
    values = values.astype(x.dtype)
    return _add(ref, values) if accumulate else ref.set(values)


# ------------------------------------------------------------------------------------------------
# embedding


@lowering("aten.embedding.default", bounds=Bound(1, None, False, IndexError, IN_SELF))
def _embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx and scale_grad_by_freq only change the backward.
    return weight[indices]


@lowering("aten.embedding_dense_backward.default")
def _embedding_dense_backward(
    ctx, grad_output, indices, num_weights, padding_idx, scale_grad_by_freq
):
    flat = jnp.reshape(indices, (-1,))
    grad = jnp.reshape(grad_output, (flat.shape[0], -1))
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), grad.dtype).at[flat].add(1)
        grad = grad / counts[flat][:, None]
    grad = jnp.where((flat != padding_idx)[:, None], grad, 0)
    return jnp.zeros(ctx.shape, ctx.dtype).at[flat].add(grad.astype(ctx.dtype))


# ------------------------------------------------------------------------------------------------
# one_hot (PyTorch's composite checks no class value of a tensor subclass: the lazy layer records
# it whole)


@lowering("aten.one_hot.default")
def _one_hot(ctx, x, num_classes=-1):
    # The runtime checks raise eager's error for a class value outside [0, num_classes).
    return (x[..., None] == jnp.arange(ctx.shape[-1], dtype=x.dtype)).astype(ctx.dtype)


# ------------------------------------------------------------------------------------------------
# masked_scatter: the k-th True position of the (broadcast) mask takes ``source.flatten()[k]``.


def _mask_positions(mask: Any, shape: tuple[int, ...]) -> tuple[Any, Any]:
    flat = jnp.reshape(jnp.broadcast_to(mask, shape), (-1,))
    return flat, jnp.cumsum(flat.astype(jnp.int64)) - 1


@lowering("aten.masked_scatter.default")
def _masked_scatter(ctx, x, mask, source):
    flat_mask, positions = _mask_positions(mask, ctx.shape)
    source = jnp.reshape(source, (-1,)).astype(ctx.dtype)
    base = jnp.reshape(jnp.broadcast_to(x, ctx.shape), (-1,))
    if source.size == 0:  # eager accepts an empty source when the mask selects nothing
        return jnp.reshape(base, ctx.shape)
    picked = jnp.take(source, jnp.maximum(positions, 0), mode="clip")
    return jnp.reshape(jnp.where(flat_mask, picked, base), ctx.shape)


@lowering("aten.masked_scatter_backward.default")
def _masked_scatter_backward(ctx, grad_output, mask, sizes):
    flat_mask, positions = _mask_positions(mask, grad_output.shape)
    size = 1
    for s in sizes:
        size *= s
    # Unmasked elements aim past the end and are dropped; source elements no mask position
    # consumed get a zero gradient.
    target = jnp.where(flat_mask, positions, size)
    grad = (
        jnp.zeros((size,), ctx.dtype)
        .at[target]
        .set(jnp.reshape(grad_output, (-1,)).astype(ctx.dtype), mode="drop")
    )
    return jnp.reshape(grad, ctx.shape)
