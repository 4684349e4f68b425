"""Lowerings: sorting and selection (sort, topk, kthvalue, median, mode), cumulative extrema,
searchsorted/bucketize and histc."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowerings.dtypes import cast, result_type
from lowerings.registry import LoweringContext, lowering

# PyTorch specifies the order of equal elements only for sort(stable=True). Elsewhere (sort with
# stable=False, argsort, topk's indices, kthvalue's, median's and mode's index) it leaves the
# choice among equal elements to the implementation: eager CPU's comes from libstdc++'s introsort
# and introselect and TH's quickselect, CUDA's from its own kernels. Every lowering here follows
# the stable order (equal elements in index order) of one XLA sort or top_k: replaying eager's
# C++ algorithms exactly, in while loops, took far more XLA compile time per graph (figures:
# benchmarks/RESULTS.md, "Sorting compile time").

_POS = jnp.int32  # positions inside one row
_CPU_ACC = {
    np.dtype(jnp.bfloat16): np.dtype(np.float32),
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float64),
    np.dtype(np.complex64): np.dtype(np.complex128),
}


# --- layout ----------------------------------------------------------------------------------
# Everything works along the op's own axis: transposes around an XLA sort cost more compile time
# than the sort itself (figures: benchmarks/RESULTS.md, "Sorting compile time").


def _axis(x: Any, dim: int) -> tuple[jax.Array, int]:
    """``x`` with at least one axis (a 0-d tensor is a row of one) and ``dim`` as an axis of it."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        return x.reshape(1), 0
    return x, dim % x.ndim


def _out(ctx: LoweringContext, y: jax.Array, index=0) -> jax.Array:
    """Output ``index`` (a reduced axis kept or not, ctx's shape says which)."""
    return y.reshape(ctx.shapes[index]).astype(ctx.dtypes[index])


def _empty(ctx: LoweringContext) -> tuple[jax.Array, ...]:
    return tuple(jnp.zeros(s, d) for s, d in zip(ctx.shapes, ctx.dtypes))


def _at(x: jax.Array, position: Any, axis: int) -> jax.Array:
    """The elements at ``position`` along ``axis`` (an int, or an array with that axis of size
    one), keeping the axis."""
    if isinstance(position, int):
        return lax.slice_in_dim(x, position, position + 1, axis=axis)
    return jnp.take_along_axis(x, position, axis=axis)


# --- the two orders: a stable sort and a top k -----------------------------------------------


def _stable_sort(x: jax.Array, axis: int, descending=False) -> tuple[jax.Array, jax.Array]:
    """Stable sort along ``axis`` in PyTorch's order (NaN above +inf, -0.0 equal to 0.0): the
    sorted values and their indices. JAX's comparator already orders floats so."""
    idx = lax.broadcasted_iota(_POS, x.shape, axis)
    if descending:
        # Reversed, sorted ascending, reversed back: equal elements stay in index order.
        x, idx = lax.rev(x, (axis,)), lax.rev(idx, (axis,))
    values, idx = lax.sort((x, idx), dimension=axis, is_stable=True, num_keys=1)
    if descending:
        values, idx = lax.rev(values, (axis,)), lax.rev(idx, (axis,))
    return values, idx


def _top(x: jax.Array, axis: int, k: int, largest: bool) -> jax.Array:
    """Indices of the ``k`` largest (or smallest) elements along ``axis`` in PyTorch's order, the
    first of equal elements first: the stable order's first k."""
    if axis != x.ndim - 1:  # XLA's top_k works on the last axis only
        return lax.slice_in_dim(_stable_sort(x, axis, largest)[1], 0, k, axis=axis)
    key = x
    if jnp.issubdtype(key.dtype, jnp.floating):
        # top_k compares in IEEE total order (-NaN lowest, -0.0 below 0.0): canonicalize both.
        key = jnp.where(key == 0, jnp.zeros_like(key), key)
        key = jnp.where(jnp.isnan(key), jnp.full_like(key, jnp.nan), key)
        key = key if largest else -key
    elif not largest:
        key = ~key  # reverses every integer order (and bool's) without overflow
    return lax.top_k(key, k)[1]


# --- sort ------------------------------------------------------------------------------------


@lowering("aten.sort.default")
def _sort(ctx, x, dim=-1, descending=False):
    values, idx = _stable_sort(*_axis(x, dim), descending)
    return _out(ctx, values), _out(ctx, idx, 1)


@lowering("aten.sort.stable")
def _sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sort(ctx, x, dim, descending)


# --- topk, kthvalue --------------------------------------------------------------------------


@lowering("aten.topk.default")
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    # sorted=False leaves the order of the k unspecified: the sorted order is one.
    k = k if jnp.ndim(x) else 1  # eager's topk(0) of a 0-d tensor gives its one element
    x, axis = _axis(x, dim)
    if k == 0 or x.size == 0:
        return _empty(ctx)
    idx = _top(x, axis, k, largest)
    return _out(ctx, jnp.take_along_axis(x, idx, axis=axis)), _out(ctx, idx, 1)


@lowering("aten.kthvalue.default")
def _kthvalue(ctx, x, k, dim=-1, keepdim=False):
    x, axis = _axis(x, dim)
    idx = _at(_top(x, axis, k, largest=False), k - 1, axis)
    return _out(ctx, jnp.take_along_axis(x, idx, axis=axis)), _out(ctx, idx, 1)


# --- median ----------------------------------------------------------------------------------


def _median(x: jax.Array, axis: int, ignore_nan: bool) -> tuple[jax.Array, jax.Array]:
    """The lower median along ``axis`` and its index in the stable order (eager's comparators
    break ties by index too): median's is the first NaN where there is one, nanmedian's the
    median of the other elements (the first NaN where all are)."""
    n = x.shape[axis]
    values, order = _stable_sort(x, axis)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        nth = (n - 1) // 2
        return _at(values, nth, axis), _at(order, nth, axis)
    # NaNs sort last, in index order: the first of them is at n - nans.
    nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True, dtype=_POS)
    if ignore_nan:
        nth = jnp.maximum(n - nans - 1, 0) // 2
    else:
        nth = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _at(values, nth, axis), _at(order, nth, axis)


def _median_of_all(ignore_nan: bool):
    def lower(ctx, x):
        x = jnp.ravel(x)
        if x.size == 0:
            return jnp.full((), jnp.nan).astype(ctx.dtype)
        return _out(ctx, _median(x, 0, ignore_nan)[0])

    return lower


def _median_dim(ignore_nan: bool):
    def lower(ctx, x, dim, keepdim=False):
        values, idx = _median(*_axis(x, dim), ignore_nan)
        return _out(ctx, values), _out(ctx, idx, 1)

    return lower


lowering("aten.median.default")(_median_of_all(ignore_nan=False))
lowering("aten.nanmedian.default")(_median_of_all(ignore_nan=True))
lowering("aten.median.dim")(_median_dim(ignore_nan=False))
lowering("aten.nanmedian.dim")(_median_dim(ignore_nan=True))


# --- mode ------------------------------------------------------------------------------------


@lowering("aten.mode.default")
def _mode(ctx, x, dim=-1, keepdim=False):
    x, axis = _axis(x, dim)
    if x.size == 0:
        return _empty(ctx)
    # As eager: the smallest of the most frequent values (NaN != NaN: each NaN counts once),
    # from the runs of equal neighbours in sorted order, and the index that ends its run (here
    # the value's last occurrence; eager's depends on std::sort's order of equal elements).
    values, idx = _stable_sort(x, axis)
    n = x.shape[axis]
    later, earlier = (lax.slice_in_dim(values, a, b, axis=axis) for a, b in ((1, n), (0, n - 1)))
    differs = later != earlier
    edge = jnp.ones(x.shape[:axis] + (1,) + x.shape[axis + 1 :], bool)
    starts = jnp.concatenate([edge, differs], axis=axis)
    ends = jnp.concatenate([differs, edge], axis=axis)
    pos = lax.broadcasted_iota(_POS, x.shape, axis)
    length = jnp.where(ends, pos - lax.cummax(jnp.where(starts, pos, 0), axis=axis) + 1, 0)
    best = jnp.argmax(length, axis=axis, keepdims=True)
    return _out(ctx, _at(values, best, axis)), _out(ctx, _at(idx, best, axis), 1)


# --- cumulative extrema and logcumsumexp -----------------------------------------------------


def _cumulative_extremum(replaces):
    """cummax/cummin: eager's running (value, index), where a later element ``x`` replaces the
    running one ``out`` when replaces(x, out); NaN always replaces, and so does an equal value."""

    def lower(ctx, x, dim):
        x = jnp.asarray(x)
        if x.ndim == 0 or x.size == 0:
            return x.astype(ctx.dtypes[0]), jnp.zeros(ctx.shapes[1], ctx.dtypes[1])
        axis = dim % x.ndim
        floating = jnp.issubdtype(x.dtype, jnp.inexact)

        def combine(earlier, later):
            (va, ia), (vb, ib) = earlier, later
            take = replaces(vb, va)
            if floating:
                take = jnp.isnan(vb) | (~jnp.isnan(va) & take)
            return jnp.where(take, vb, va), jnp.where(take, ib, ia)

        index = lax.broadcasted_iota(ctx.dtypes[1], x.shape, axis)
        index = lax.associative_scan(combine, (x, index), axis=axis)[1]
        # The scan interleaves partial results by adding zeros, which turns -0.0 into 0.0.
        return jnp.take_along_axis(x, index, axis=axis).astype(ctx.dtypes[0]), index

    return lower


lowering("aten.cummax.default")(_cumulative_extremum(lambda x, out: x >= out))
lowering("aten.cummin.default")(_cumulative_extremum(lambda x, out: x <= out))


def _log_add_exp_complex(a, b):
    """ATen's complex _log_add_exp_helper: ordered by real part, NaN infectious."""
    a_nan = jnp.isnan(a.real) | jnp.isnan(a.imag)
    b_nan = jnp.isnan(b.real) | jnp.isnan(b.imag)
    low = jnp.where(a.real < b.real, a, b)
    high = jnp.where(a.real < b.real, b, a)
    general = jnp.log1p(jnp.exp(low - high)) + high
    both_inf = ~jnp.isfinite(low.real) & (low.real == high.real)
    inf = jnp.where(low.real < 0, low, jnp.log(jnp.exp(low) + jnp.exp(high)))
    out = jnp.where(both_inf, inf, general)
    nan = jnp.asarray(complex(np.nan, np.nan), out.dtype)
    return jnp.where(a_nan | b_nan, nan, out)


@lowering("aten.logcumsumexp.default")
def _logcumsumexp(ctx, x, dim):
    x = jnp.asarray(x)
    if x.ndim == 0 or x.size == 0:
        return x.astype(ctx.dtype)
    # Eager CPU accumulates in acc_type<T, /*is_cuda=*/false>: float32 and complex64 in double
    # precision, half and bfloat16 in float32. The backward's formula cancels badly enough that
    # a float32 forward puts its gradient visibly off eager's.
    acc = _CPU_ACC.get(np.dtype(ctx.dtype), ctx.dtype)
    combine = _log_add_exp_complex if jnp.issubdtype(acc, jnp.complexfloating) else jnp.logaddexp
    out = lax.associative_scan(combine, x.astype(acc), axis=dim % x.ndim)
    return out.astype(ctx.dtype)


# --- searchsorted, bucketize -----------------------------------------------------------------


def _search(ctx, boundaries, values, right, side=None, sorter=None):
    """Eager's binary search (cus_lower_bound / cus_upper_bound), step for step: the same
    midpoints and comparisons, so unsorted boundaries and NaN land where eager puts them."""
    right = right or side == "right"
    dtype = result_type(ctx, boundaries, values)
    boundaries, values = cast(boundaries, dtype), cast(values, dtype)
    if sorter is not None:
        boundaries = jnp.take_along_axis(boundaries, sorter, axis=-1)
    n = boundaries.shape[-1]
    start = jnp.zeros(values.shape, _POS)
    end = jnp.full(values.shape, n, _POS)
    for _ in range(n.bit_length()):
        mid = start + (end - start) // 2
        at = jnp.minimum(mid, n - 1)
        if boundaries.ndim == 1:
            pivot = boundaries[at]
        else:
            pivot = jnp.take_along_axis(boundaries, at, axis=-1)
        go_right = ~(pivot > values) if right else ~(pivot >= values)
        live = start < end
        start = jnp.where(live & go_right, mid + 1, start)
        end = jnp.where(live & ~go_right, mid, end)
    return start.astype(ctx.dtype)


@lowering("aten.searchsorted.Tensor", "aten.searchsorted.Scalar")
def _searchsorted(ctx, sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    return _search(ctx, sorted_sequence, x, right, side, sorter)


@lowering("aten.bucketize.Tensor", "aten.bucketize.Scalar")
def _bucketize(ctx, x, boundaries, *, out_int32=False, right=False):
    return _search(ctx, boundaries, x, right)


# --- histc -----------------------------------------------------------------------------------


@lowering("aten.histc.default")
def _histc(ctx, x, bins=100, min=0, max=0):
    x = jnp.ravel(x)
    low, high = cast(min, np.float64), cast(max, np.float64)
    if x.size:
        # min == max asks for the data's range (eager errors on a NaN or infinite one).
        auto = low == high
        low = jnp.where(auto, jnp.min(x).astype(np.float64), low)
        high = jnp.where(auto, jnp.max(x).astype(np.float64), high)
    same = low == high
    low, high = jnp.where(same, low - 1, low), jnp.where(same, high + 1, high)
    # Eager's linear-interpolation kernel, in the input's dtype: the bin edges are
    # linspace(low, high) in that dtype, so its ends are low and high rounded to it.
    low, high = low.astype(x.dtype), high.astype(x.dtype)
    inside = (x >= low) & (x <= high)
    pos = ((x - low) * jnp.asarray(bins, x.dtype) / (high - low)).astype(np.int64)
    pos = jnp.where(pos == bins, bins - 1, pos)
    counts = jnp.zeros(bins, ctx.dtype).at[jnp.where(inside, pos, bins)].add(1, mode="drop")
    return counts


# Up to this many element-by-test-element comparisons, isin compares every pair (one fused
# broadcast); beyond, it looks each element up in the sorted test elements.
_ISIN_PAIRS = 1 << 16


@lowering("aten.isin.Tensor_Tensor", "aten.isin.Tensor_Scalar", "aten.isin.Scalar_Tensor")
def _isin(ctx: LoweringContext, elements, test_elements, *, assume_unique=False, invert=False):
    dtype = result_type(ctx, elements, test_elements)
    x = jnp.broadcast_to(cast(elements, dtype), ctx.shape)
    table = jnp.ravel(cast(test_elements, dtype))
    if table.size == 0:
        found = jnp.zeros(ctx.shape, bool)
    elif table.size * x.size <= _ISIN_PAIRS:
        found = jnp.any(x[..., None] == table, axis=-1)
    else:  # NaN sorts last and equals nothing, as in eager
        table = jnp.sort(table)
        at = jnp.clip(jnp.searchsorted(table, x), 0, table.size - 1)
        found = table[at] == x
    return jnp.logical_not(found) if invert else found
