"""Lowerings: reductions into indexed slots (index_reduce, put/take, embedding_bag, segment_reduce).

Every op here writes or reads through an index tensor whose values are only known on the device.
Negative indices wrap as in PyTorch. Out-of-range indices, which eager PyTorch rejects with an
error, cannot raise from inside a compiled program: reads give the dtype's fill value (NaN for
floating types, the most negative integer otherwise), so the bad result is visible, and writes are
dropped.

Segments (embedding_bag bags, segment_reduce segments) become a segment id per element, computed
from offsets by a scatter of ones and a cumulative sum, so empty segments need no special case and
the output shape depends only on the shapes of lengths/offsets.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax

from lowerings.bounds import IN_SELF, Bound
from lowerings.indexing import _at_least_1d, _dim, _reduce_identity
from lowerings.registry import lowering

# ------------------------------------------------------------------------------------------------
# index_reduce: ``source`` slices along ``dim`` reduce into the ``self`` slices ``index`` names.

_REDUCE_AT = {
    "prod": lambda ref, v: ref.multiply(v),
    "amax": lambda ref, v: ref.max(v),
    "amin": lambda ref, v: ref.min(v),
    "mean": lambda ref, v: ref.add(v),
}


@lowering("aten.index_reduce.default", bounds=Bound(2, 1, False, IndexError, IN_SELF))
def _index_reduce(ctx, x, dim, index, source, reduce, *, include_self=True):
    x, source = _at_least_1d(x, source)
    dim = _dim(dim, x.ndim)
    index = jnp.reshape(index, (-1,))
    position = (slice(None),) * dim + (index,)
    source = source.astype(x.dtype)
    base = x if include_self else x.at[position].set(_reduce_identity(reduce, x.dtype))
    out = _REDUCE_AT[reduce](base.at[position], source)
    if reduce == "mean":
        count = jnp.full((x.shape[dim],), 1 if include_self else 0, x.dtype).at[index].add(1)
        count = jnp.where(count == 0, 1, count)
        count = jnp.reshape(count, (-1,) + (1,) * (x.ndim - dim - 1))
        if jnp.issubdtype(x.dtype, jnp.integer):
            out = jnp.floor_divide(out, count)
        else:
            out = out / count
    return jnp.reshape(out, ctx.shape)


# ------------------------------------------------------------------------------------------------
# take / put address ``self`` as if it were flattened.


# Bounds of take and put: an index into the flattened tensor, negatives wrapped.
_FLAT = Bound(
    1,
    None,
    True,
    IndexError,
    "out of range: tried to access index {index} on a tensor of {size} elements.",
    flat=True,
)


def _flat_index(index: Any) -> Any:
    # jax.numpy wraps negative indices once, as PyTorch does, and leaves the rest out of range.
    return jnp.reshape(index, (-1,))


@lowering("aten.take.default", bounds=_FLAT)
def _take(ctx, x, index):
    flat = jnp.reshape(x, (-1,))
    if flat.shape[0] == 0:  # only an empty index is valid here
        return jnp.zeros(ctx.shape, ctx.dtype)
    out = jnp.take(flat, _flat_index(index), mode="fill")
    return jnp.reshape(out, ctx.shape)


@lowering("aten.put.default", bounds=_FLAT)
def _put(ctx, x, index, source, accumulate=False):
    flat = jnp.reshape(x, (-1,))
    ref = flat.at[_flat_index(index)]
    values = jnp.reshape(source, (-1,)).astype(x.dtype)
    if not accumulate:
        out = ref.set(values, mode="drop")
    elif x.dtype == jnp.bool_:
        out = ref.max(values, mode="drop")
    else:
        out = ref.add(values, mode="drop")
    return jnp.reshape(out, ctx.shape)


# ------------------------------------------------------------------------------------------------
# embedding_renorm: rows of ``self`` that ``indices`` names and whose p-norm exceeds max_norm are
# scaled down to it (eager's 1e-7 guard included). Repeated indices renormalize a row once.


@lowering("aten.embedding_renorm.default")
def _embedding_renorm(ctx, weight, indices, max_norm, norm_type):
    rows = weight.shape[0]
    named = jnp.zeros((rows,), jnp.bool_).at[jnp.reshape(indices, (-1,))].set(True, mode="drop")
    norm = _row_norm(weight, norm_type)
    scale = jnp.where(named & (norm > max_norm), max_norm / (norm + 1e-7), 1.0)
    return (weight * scale[:, None].astype(weight.dtype)).astype(ctx.dtype)


def _row_norm(weight: Any, p: Any) -> Any:
    a = jnp.abs(weight.astype(jnp.promote_types(weight.dtype, jnp.float32)))
    if isinstance(p, (int, float)):
        if p == float("inf"):
            return jnp.max(a, axis=1, initial=0)
        if p == 0:
            return jnp.sum(a != 0, axis=1).astype(a.dtype)
        if p == 1:
            return jnp.sum(a, axis=1)
        if p == 2:
            return jnp.sqrt(jnp.sum(a * a, axis=1))
    return jnp.sum(a**p, axis=1) ** (1.0 / p)


# ------------------------------------------------------------------------------------------------
# Segment ids.


def _segment_ids(starts: Any, ends: Any, n: int) -> tuple[Any, Any]:
    """Segment id of each of ``n`` positions (last axis) given segment ``starts`` (..., S) and the
    end of the last segment ``ends`` (...), with a mask of the positions inside some segment."""
    batch = starts.shape[:-1]
    counts = jnp.zeros(batch + (n + 1,), jnp.int32)
    batch_index = tuple(lax.broadcasted_iota(jnp.int32, starts.shape, d) for d in range(len(batch)))
    counts = counts.at[batch_index + (starts,)].add(1, mode="drop")
    ids = jnp.cumsum(counts[..., :n], axis=-1) - 1
    position = lax.broadcasted_iota(starts.dtype, batch + (n,), len(batch))
    first = starts[..., :1] if starts.shape[-1] else jnp.zeros(batch + (1,), starts.dtype)
    inside = (ids >= 0) & (position >= first) & (position < ends[..., None])
    return ids, inside


# ------------------------------------------------------------------------------------------------
# embedding_bag. Modes: 0 sum, 1 mean, 2 max. aten passes 1-d indices (F.embedding_bag flattens
# 2-d input) and padding_idx -1 for "none". The auxiliary outputs follow the meta kernel's shapes:
# offset2bag (N,), bag_size (offsets.size(0),) with the bag sizes first, max_indices (bags, D) in
# max mode; the backward lowerings below read them in that form or in eager's.

_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(indices: Any, offsets: Any, num_bags: int, padding_idx: int) -> tuple[Any, Any]:
    """Bag of every index (``num_bags`` for an index in no bag or equal to padding_idx) and the
    number of non-padding indices in each bag."""
    n = indices.shape[0]
    starts = offsets[:num_bags]
    ids, inside = _segment_ids(starts, jnp.asarray(n, offsets.dtype), n)
    valid = inside & (indices != padding_idx)
    bag = jnp.where(valid, ids, num_bags)
    size = jnp.zeros((num_bags,), offsets.dtype).at[bag].add(1, mode="drop")
    return bag, size


def _accumulation_dtype(dtype: Any) -> Any:
    # Eager CPU sums half-precision bags in float32 and rounds once.
    return jnp.promote_types(dtype, jnp.float32)


def _embedding_bag(
    ctx,
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=0,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    num_bags, dim = ctx.shapes[0]
    indices = jnp.reshape(indices, (-1,))
    bag, size = _bags(indices, offsets, num_bags, padding_idx)
    rows = jnp.take(weight, indices, axis=0, mode="fill").astype(_accumulation_dtype(weight.dtype))
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.astype(rows.dtype)[:, None]
    max_indices = jnp.zeros(ctx.shapes[3], ctx.dtypes[3])
    if mode == _MAX:
        init = jnp.full((num_bags, dim), -jnp.inf, rows.dtype)
        out = init.at[bag].max(rows, mode="drop")
        # The first index reaching the maximum, as eager's strict ">" scan keeps.
        hit = (rows == out.at[bag].get(mode="fill", fill_value=jnp.nan)) & (bag < num_bags)[:, None]
        order = jnp.where(hit, jnp.arange(indices.shape[0])[:, None], indices.shape[0])
        first = jnp.full((num_bags, dim), indices.shape[0]).at[bag].min(order, mode="drop")
        if indices.shape[0]:
            winner = jnp.take(indices, first, mode="fill", fill_value=0)
        else:
            winner = jnp.zeros((num_bags, dim), indices.dtype)
        max_indices = jnp.where(size[:, None] > 0, winner, 0).astype(ctx.dtypes[3])
        out = jnp.where(size[:, None] > 0, out, 0)
    else:
        out = jnp.zeros((num_bags, dim), rows.dtype).at[bag].add(rows, mode="drop")
        if mode == _MEAN:
            out = out / jnp.maximum(size, 1)[:, None].astype(out.dtype)
    offset2bag = jnp.zeros(ctx.shapes[1], ctx.dtypes[1])
    if ctx.shapes[1][0] == indices.shape[0]:
        ids, _ = _segment_ids(offsets[:num_bags], jnp.asarray(indices.shape[0]), indices.shape[0])
        offset2bag = jnp.maximum(ids, 0).astype(ctx.dtypes[1])
    bag_size = jnp.zeros(ctx.shapes[2], ctx.dtypes[2])
    if mode != _SUM:  # eager leaves it zero in sum mode
        bag_size = bag_size.at[: size.shape[0]].set(size.astype(bag_size.dtype))
    return out.astype(ctx.dtypes[0]), offset2bag, bag_size, max_indices


lowering("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")(_embedding_bag)


def _bag_grad(
    ctx,
    grad,
    indices,
    bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx,
):
    """Gradient of the weight given the bag of every index (``num_bags`` where it has none)."""
    num_bags, dim = grad.shape
    dtype = _accumulation_dtype(ctx.dtype)
    if num_bags == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    if mode == _MAX:
        nonempty = (bag_size[:num_bags] > 0)[:, None]
        target = jnp.where(nonempty, maximum_indices, num_weights)
        column = lax.broadcasted_iota(jnp.int32, grad.shape, 1)
        out = jnp.zeros((num_weights, dim), dtype)
        return out.at[target, column].add(grad.astype(dtype), mode="drop").astype(ctx.dtype)
    valid = (bag < num_bags) & (indices != padding_idx)
    rows = jnp.take(grad, jnp.minimum(bag, num_bags - 1), axis=0).astype(dtype)
    scale = jnp.where(valid, 1, 0).astype(dtype)
    if mode == _MEAN:
        size = jnp.take(bag_size, jnp.minimum(bag, num_bags - 1))
        scale = scale / jnp.maximum(size, 1).astype(dtype)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(dtype)
    if scale_grad_by_freq:
        scale = scale / _freq_divisor(indices, num_weights).astype(dtype)
    target = jnp.where(valid, indices, num_weights)
    out = jnp.zeros((num_weights, dim), dtype).at[target].add(rows * scale[:, None], mode="drop")
    return out.astype(ctx.dtype)


def _freq_divisor(indices: Any, num_weights: int) -> Any:
    """What eager CPU divides each index's gradient by under scale_grad_by_freq.

    Eager (torch 2.13, EmbeddingBag.cpp) looks the count up as ``counts[sorted[r]]`` where ``r`` is
    the rank of the index among the distinct indices, not at the index itself: the k-th smallest
    distinct index is divided by the count of the k-th smallest index (with repeats). For indices
    without repeats below them this is their own count.
    """
    counts = jnp.zeros((num_weights,), jnp.int64).at[indices].add(1, mode="drop")
    ordered = jnp.sort(indices)
    distinct = jnp.concatenate([jnp.ones((1,), jnp.int64), (ordered[1:] != ordered[:-1])])
    rank_in_order = jnp.cumsum(distinct) - 1
    rank = jnp.take(rank_in_order, jnp.searchsorted(ordered, indices), mode="clip")
    return jnp.maximum(jnp.take(counts, jnp.take(ordered, rank, mode="clip"), mode="clip"), 1)


@lowering("aten._embedding_bag_backward.default")
def _embedding_bag_backward(
    ctx,
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights,
    padding_idx=-1,
):
    if sparse:
        raise NotImplementedError("sparse embedding_bag gradients have no lowering")
    indices = jnp.reshape(indices, (-1,))
    num_bags = grad.shape[0]
    # Bags again from offsets: eager's offset2bag is empty on its fast sum path.
    starts = offsets[:num_bags]
    ids, inside = _segment_ids(starts, jnp.asarray(indices.shape[0]), indices.shape[0])
    bag = jnp.where(inside, ids, num_bags)
    if mode != _SUM:
        size = (
            jnp.zeros((num_bags,), offsets.dtype)
            .at[bag]
            .add(jnp.where(indices != padding_idx, 1, 0).astype(offsets.dtype), mode="drop")
        )
        bag_size = size
    return _bag_grad(
        ctx,
        grad,
        indices,
        bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowering("aten._embedding_bag_dense_backward.default")
def _embedding_bag_dense_backward(
    ctx,
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights,
    padding_idx=-1,
):
    indices = jnp.reshape(indices, (-1,))
    return _bag_grad(
        ctx,
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowering("aten._embedding_bag_per_sample_weights_backward.default")
def _embedding_bag_per_sample_weights_backward(
    ctx, grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    indices = jnp.reshape(indices, (-1,))
    num_bags = grad.shape[0]
    ids, inside = _segment_ids(offsets[:num_bags], jnp.asarray(indices.shape[0]), indices.shape[0])
    valid = inside & (indices != padding_idx)
    rows = jnp.take(weight, indices, axis=0, mode="fill")
    bag_grad = jnp.take(grad, jnp.clip(ids, 0, num_bags - 1), axis=0)
    out = jnp.sum(rows * bag_grad, axis=1)
    return jnp.where(valid, out, 0).astype(ctx.dtype)


# ------------------------------------------------------------------------------------------------
# segment_reduce: ``data`` reduced along ``axis`` over consecutive segments given by ``lengths``
# (..., S) or ``offsets`` (..., S + 1), whose leading dims are data's dims before ``axis``.
# ``initial`` joins every segment's reduction (mean: the sum) and is the value of empty ones;
# without it an empty segment is the identity (mean: NaN, as eager's 0 / 0).


def _segments(data: Any, lengths: Any, offsets: Any, axis: int) -> tuple[Any, Any, Any]:
    """Flat segment id of each element of ``data`` moved to (batch, N, rest), out of range for
    elements in no segment; the segment lengths (batch * S,); and S."""
    if offsets is not None:
        starts, ends = offsets[..., :-1], offsets[..., -1]
        lengths = offsets[..., 1:] - offsets[..., :-1]
    else:
        ends = jnp.sum(lengths, axis=-1)
        starts = jnp.cumsum(lengths, axis=-1) - lengths
    n = data.shape[axis]
    s = starts.shape[-1]
    ids, inside = _segment_ids(starts, ends, n)
    batch = jnp.zeros_like(ids)
    if axis:
        stride = 1
        for d in reversed(range(axis)):
            batch = batch + lax.broadcasted_iota(ids.dtype, ids.shape, d) * stride
            stride *= ids.shape[d]
    total = s * max(1, _prod(starts.shape[:-1]))
    flat = jnp.where(inside, batch * s + ids, total)
    return jnp.reshape(flat, (-1,)), jnp.reshape(lengths, (-1,)), total


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def _rows(data: Any, axis: int) -> Any:
    """``data`` as (elements along batch and axis, rest)."""
    return jnp.reshape(data, (_prod(data.shape[: axis + 1]), -1))


@lowering("aten.segment_reduce.default")
def _segment_reduce(
    ctx,
    data,
    reduce,
    *,
    lengths=None,
    indices=None,
    offsets=None,
    axis=0,
    unsafe=False,
    initial=None,
):
    if indices is not None:
        raise NotImplementedError("segment_reduce with indices has no lowering")
    axis = _dim(axis, data.ndim)
    seg, count, total = _segments(data, lengths, offsets, axis)
    rows = _rows(data, axis)
    rest = rows.shape[1]
    identity = {"sum": 0, "mean": 0, "prod": 1, "max": -jnp.inf, "min": jnp.inf}[reduce]
    start = jnp.full((total, rest), identity if initial is None else initial, rows.dtype)
    if reduce in ("sum", "mean"):
        out = start.at[seg].add(rows, mode="drop")
    elif reduce == "prod":
        out = start.at[seg].multiply(rows, mode="drop")
    else:
        ref = start.at[seg]
        out = ref.max(rows, mode="drop") if reduce == "max" else ref.min(rows, mode="drop")
    if reduce == "mean":
        count = count[:, None].astype(out.dtype)
        divided = out / jnp.where(count > 0, count, 1)
        empty = jnp.nan if initial is None else out
        out = jnp.where(count > 0, divided, empty)
    return jnp.reshape(out, ctx.shape).astype(ctx.dtype)


@lowering("aten._segment_reduce_backward.default")
def _segment_reduce_backward(
    ctx, grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None
):
    axis = _dim(axis, data.ndim)
    seg, count, total = _segments(data, lengths, offsets, axis)
    rows = _rows(data, axis)
    inside = (seg < total)[:, None]
    safe = jnp.minimum(seg, total - 1) if total else seg

    def spread(per_segment: Any) -> Any:
        """A (segments, rest) value at each element of its segment."""
        if total == 0:
            return jnp.zeros(rows.shape, per_segment.dtype)
        return jnp.take(jnp.reshape(per_segment, (total, -1)), safe, axis=0)

    def per_segment_sum(values: Any) -> Any:
        return jnp.zeros((total, rows.shape[1]), values.dtype).at[seg].add(values, mode="drop")

    g = spread(grad)
    if reduce == "sum":
        out = g
    elif reduce == "mean":
        out = g / jnp.maximum(spread(count[:, None]), 1).astype(g.dtype)
    elif reduce in ("max", "min"):
        # Eager's rule (SegmentReduce.cpp, torch 2.13): every element equal to the result, or
        # NaN, takes the gradient, and tied elements share it only where it is positive.
        hit = (rows == spread(output)) | jnp.isnan(rows)
        ties = spread(per_segment_sum(hit.astype(g.dtype)))
        out = jnp.where(hit, jnp.where(g > 0, g / jnp.maximum(ties, 1), g), 0)
    else:  # prod: with one zero in a segment only the zero gets a gradient; with more, none
        zero = rows == 0
        zeros = spread(per_segment_sum(zero.astype(jnp.int32)))
        nonzero = jnp.where(zero, 1, rows)
        start = jnp.full((total, rows.shape[1]), 1 if initial is None else initial, rows.dtype)
        others = spread(start.at[seg].multiply(nonzero, mode="drop"))
        out = jnp.where(
            zeros == 0,
            g * spread(output) / nonzero,
            jnp.where((zeros == 1) & zero, g * others, 0),
        )
    out = jnp.where(inside, out, 0)
    return jnp.reshape(out, ctx.shape).astype(ctx.dtype)
