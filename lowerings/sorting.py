"""Lowerings: sorting and selection (sort, topk, kthvalue, median, mode), cumulative extrema,
searchsorted/bucketize and histc."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowerings.dtypes import cast, result_type
from lowerings.registry import LoweringContext, lowering

# Eager CPU leaves equal elements wherever its C++ algorithms put them: libstdc++'s std::sort,
# std::nth_element and std::partial_sort (sort, topk, mode, median) and TH's quickselect
# (kthvalue). Those orders are replayed exactly on integer ranks. Each round of Hoare partitions is
# computed at once for every segment of a row (the m-th left stop trades places with the m-th
# right stop), so a replay takes O(log n) vector rounds; only the heap fallbacks run element by
# element. A row without ties has one possible order, so the replay runs only when some row has
# ties.

_POS = jnp.int32  # positions inside one row
_CPU_ACC = {
    np.dtype(jnp.bfloat16): np.dtype(np.float32),
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.float32): np.dtype(np.float64),
    np.dtype(np.complex64): np.dtype(np.complex128),
}
_INSERTION_SORT_MAX = 16  # libstdc++'s _S_threshold
_RADIX_SORT_MIN = 32768  # at::internal::GRAIN_SIZE: fbgemm's (stable) radix sort from here on


def _lg(n: int) -> int:
    """std::__lg: floor(log2(n)); libstdc++'s depth budget is twice that."""
    return max(n, 1).bit_length() - 1


# --- layout ----------------------------------------------------------------------------------


def _rows(x: Any, dim: int) -> tuple[jax.Array, tuple[int, ...]]:
    """``x`` as a (rows, n) matrix with axis ``dim`` last (a 0-d tensor is one row of one), and
    the shape of the other axes."""
    x = jnp.asarray(x)
    if x.ndim == 0:
        return x.reshape(1, 1), ()
    x = jnp.moveaxis(x, dim % x.ndim, -1)
    batch = x.shape[:-1]
    return x.reshape(int(np.prod(batch)), x.shape[-1]), batch


def _along(ctx: LoweringContext, y: jax.Array, batch: tuple, ndim: int, dim: int, index=0):
    """Output ``index`` from a (rows, m) result laid out like ``_rows``."""
    y = y.reshape(batch + y.shape[1:])
    if ndim:
        y = jnp.moveaxis(y, -1, dim % ndim)
    return y.reshape(ctx.shapes[index]).astype(ctx.dtypes[index])


def _reduced(ctx: LoweringContext, y: jax.Array, index=0) -> jax.Array:
    """Output ``index`` from a per-row result (keepdim or not, ctx's shape says which)."""
    return y.reshape(ctx.shapes[index]).astype(ctx.dtypes[index])


def _empty(ctx: LoweringContext) -> tuple[jax.Array, ...]:
    return tuple(jnp.zeros(s, d) for s, d in zip(ctx.shapes, ctx.dtypes))


def _gather(rows: jax.Array, idx: jax.Array) -> jax.Array:
    return jnp.take_along_axis(rows, idx, axis=1)


# --- stable order and ranks ------------------------------------------------------------------


def _stable_sort(rows: jax.Array, descending: bool = False) -> tuple[jax.Array, jax.Array]:
    """Stable sort of each row in PyTorch's order (NaN above +inf, -0.0 equal to 0.0)."""
    idx = lax.broadcasted_iota(_POS, rows.shape, 1)
    if descending:
        # Reversed, sorted ascending, reversed back: equal elements stay in index order.
        rows, idx = rows[:, ::-1], idx[:, ::-1]
    values, idx = lax.sort((rows, idx), dimension=1, is_stable=True, num_keys=1)
    if descending:
        values, idx = values[:, ::-1], idx[:, ::-1]
    return values, idx


def _ties(values: jax.Array) -> jax.Array:
    """Per adjacent pair of a sorted row: equal (all NaNs count as equal)."""
    a, b = values[:, :-1], values[:, 1:]
    tie = a == b
    if jnp.issubdtype(values.dtype, jnp.inexact):
        tie |= jnp.isnan(a) & jnp.isnan(b)
    return tie


def _ranks(rows: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Dense ranks in PyTorch's order (equal values and all NaNs share one, NaN ranks highest),
    the stable ascending order, and whether any row has a tie."""
    values, order = _stable_sort(rows)
    tie = _ties(values)
    step = jnp.cumsum(~tie, axis=1, dtype=_POS)
    step = jnp.concatenate([jnp.zeros_like(order[:, :1]), step], axis=1)
    _, ranks = lax.sort((order, step), dimension=1, num_keys=1)
    return ranks, order, jnp.any(tie)


# --- one row: Hoare partitions ---------------------------------------------------------------


def _slot(a: jax.Array, s: Any, lo: Any, hi: Any, default: Any) -> jax.Array:
    """``a[s]`` where lo <= s < hi, else ``default``."""
    inside = (s >= lo) & (s < hi)
    return jnp.where(inside, a[jnp.clip(s, 0, a.shape[0] - 1)], default)


def _exchange(lstop, rstop, lo, hi):
    """The exchanges of a Hoare partition of each range [lo, hi), all ranges at once.

    The left scan stops at ``lstop`` elements (not below the pivot), the right scan at ``rstop``
    ones (not above it); the m-th left stop trades with the m-th right stop while it lies left of
    it. Returns the left and right stops by rank (rank m kept at slot lo + m; n and -1 mark none),
    each position's number of exchanges and the gather that performs them.
    """
    n = lstop.shape[0]
    pos = jnp.arange(n, dtype=_POS)
    zero = jnp.zeros(1, _POS)
    lo, hi = jnp.clip(lo, 0, n), jnp.clip(hi, 0, n)
    before = jnp.concatenate([zero, jnp.cumsum(lstop, dtype=_POS)])
    after = jnp.concatenate([jnp.cumsum(rstop[::-1], dtype=_POS)[::-1], zero])
    rank_l = before[pos + 1] - before[lo] - 1
    rank_r = after[pos] - after[hi] - 1
    ls = jnp.full(n, n, _POS).at[jnp.where(lstop, lo + rank_l, n)].set(pos, mode="drop")
    rs = jnp.full(n, -1, _POS).at[jnp.where(rstop, lo + rank_r, n)].set(pos, mode="drop")
    pairs = jnp.concatenate([zero, jnp.cumsum(ls < rs, dtype=_POS)])
    swaps = pairs[hi] - pairs[lo]
    src = jnp.where(lstop & (rank_l < swaps), rs[jnp.clip(lo + rank_l, 0, n - 1)], pos)
    src = jnp.where(rstop & (rank_r < swaps), ls[jnp.clip(lo + rank_r, 0, n - 1)], src)
    return ls, rs, swaps, src


def _swap(keys, perm, i, j, do):
    pos = jnp.arange(keys.shape[0], dtype=_POS)
    src = jnp.where(do & (pos == i), j, jnp.where(do & (pos == j), i, pos))
    return keys[src], perm[src]


def _partition_rounds(keys, perm, lo, hi, depth, threshold, wanted):
    """libstdc++'s __unguarded_partition_pivot, applied to every segment longer than
    ``threshold`` that ``wanted(lo, hi)`` selects and whose depth budget is left, until none is.

    ``lo``/``hi`` give each position's segment and ``depth`` the budget at segment starts.
    """
    n = keys.shape[0]
    pos = jnp.arange(n, dtype=_POS)

    def active(lo, hi, depth):
        return (hi - lo > threshold) & (depth[lo] > 0) & wanted(lo, hi)

    def body(state):
        keys, perm, lo, hi, depth = state
        act = active(lo, hi, depth)
        # __move_median_to_first(lo, lo + 1, mid, hi - 1)
        a, b, c = jnp.minimum(lo + 1, n - 1), lo + (hi - lo) // 2, hi - 1
        ka, kb, kc = keys[a], keys[b], keys[c]
        med = jnp.where(
            ka < kb,
            jnp.where(kb < kc, b, jnp.where(ka < kc, c, a)),
            jnp.where(ka < kc, a, jnp.where(kb < kc, c, b)),
        )
        src = jnp.where(act & (pos == lo), med, jnp.where(act & (pos == med), lo, pos))
        keys, perm = keys[src], perm[src]
        # __unguarded_partition(lo + 1, hi, pivot at lo)
        pivot, inside = keys[lo], act & (pos > lo)
        ls, rs, swaps, src = _exchange(
            inside & (keys >= pivot), inside & (keys <= pivot), lo + 1, hi
        )
        keys, perm = keys[src], perm[src]
        cut = jnp.minimum(
            _slot(ls, lo + 1 + swaps, lo + 1, hi, n), _slot(rs, lo + swaps, lo + 1, hi, hi)
        )
        split = act & (pos == cut)
        depth = jnp.where((act & (pos == lo)) | split, depth[lo] - 1, depth)
        right = act & (pos >= cut)
        lo, hi = jnp.where(right, cut, lo), jnp.where(act & ~right, cut, hi)
        return keys, perm, lo, hi, depth

    def more(state):
        return jnp.any(active(*state[2:]))

    return lax.while_loop(more, body, (keys, perm, lo, hi, depth))


def _insertion_sort(keys, perm, first, last):
    """Insertion sort of [first, last): a stable sort of that range, the rest left in place."""
    pos = jnp.arange(keys.shape[0], dtype=_POS)
    group = (pos >= first).astype(jnp.int8) + (pos >= last)
    inner = jnp.where(group == 1, keys, 0)
    _, _, keys, perm = lax.sort((group, inner, keys, perm), num_keys=2, is_stable=True)
    return keys, perm


# --- one row: libstdc++ heaps ----------------------------------------------------------------


def _adjust_heap(keys, perm, first, hole, length, value):
    """libstdc++'s __adjust_heap (with __push_heap) on the heap at [first, first + length)."""
    top = hole

    def down(s):
        keys, perm, hole, child = s
        child = 2 * (child + 1)
        child = jnp.where(keys[first + child] < keys[first + child - 1], child - 1, child)
        keys = keys.at[first + hole].set(keys[first + child])
        perm = perm.at[first + hole].set(perm[first + child])
        return keys, perm, child, child

    state = (keys, perm, hole, hole)
    keys, perm, hole, child = lax.while_loop(lambda s: s[3] < (length - 1) // 2, down, state)
    lone = jnp.where((length % 2 == 0) & (child == (length - 2) // 2), 2 * child + 1, hole)
    keys = keys.at[first + hole].set(keys[first + lone])
    perm = perm.at[first + hole].set(perm[first + lone])

    def rises(s):
        keys, _, hole = s
        return (hole > top) & (keys[first + jnp.maximum(hole - 1, 0) // 2] < value[0])

    def up(s):
        keys, perm, hole = s
        parent = (hole - 1) // 2
        keys = keys.at[first + hole].set(keys[first + parent])
        return keys, perm.at[first + hole].set(perm[first + parent]), parent

    keys, perm, hole = lax.while_loop(rises, up, (keys, perm, lone))
    return keys.at[first + hole].set(value[0]), perm.at[first + hole].set(value[1])


def _pop_heap(keys, perm, first, length, result):
    """libstdc++'s __pop_heap: the heap's top goes to ``result``, whose element joins the heap."""
    value = (keys[result], perm[result])
    keys, perm = keys.at[result].set(keys[first]), perm.at[result].set(perm[first])
    return _adjust_heap(keys, perm, first, 0, length, value)


def _first_below(keys):
    """A search for the first position >= i whose key is below t, by binary lifting over
    power-of-two block minima (positions from i on must still hold these keys)."""
    n = keys.shape[0]
    big = jnp.iinfo(keys.dtype).max
    levels = [jnp.concatenate([keys, jnp.full(1, big, keys.dtype)])]
    for level in range(_lg(n)):
        m, step = levels[-1], 1 << level
        levels.append(jnp.minimum(m, jnp.concatenate([m[step:], jnp.full(step, big, m.dtype)])))

    def search(i, t):
        for level in reversed(range(len(levels))):
            clear = levels[level][jnp.minimum(i, n)] >= t
            i = jnp.where(clear & (i < n), jnp.minimum(i + (1 << level), n), i)
        return i

    return search


def _heap_select(keys, perm, first, middle, last, sort: bool, scan: bool = True):
    """libstdc++'s __heap_select(first, middle, last), then __sort_heap(first, middle) if
    ``sort``: together std::partial_sort. ``scan=False`` when middle == last."""
    length = middle - first

    def make(s):
        keys, perm, parent = s
        value = (keys[first + parent], perm[first + parent])
        keys, perm = _adjust_heap(keys, perm, first, parent, length, value)
        return keys, perm, parent - 1

    start = jnp.where(length >= 2, (length - 2) // 2, -1)
    keys, perm, _ = lax.while_loop(lambda s: s[2] >= 0, make, (keys, perm, start))
    if scan:
        # Only elements below the heap's top pop it; the search jumps to the next one.
        below = _first_below(keys)

        def select(s):
            keys, perm, i = s
            keys, perm = _pop_heap(keys, perm, first, length, i)
            return keys, perm, below(i + 1, keys[first])

        state = (keys, perm, below(middle, keys[first]))
        keys, perm, _ = lax.while_loop(lambda s: s[2] < last, select, state)

    def unheap(s):
        keys, perm, end = s
        keys, perm = _pop_heap(keys, perm, first, end - 1 - first, end - 1)
        return keys, perm, end - 1

    done = first + 1 if sort else middle
    keys, perm, _ = lax.while_loop(lambda s: s[2] > done, unheap, (keys, perm, middle))
    return keys, perm


# --- one row: the algorithms eager calls -----------------------------------------------------


def _nth_element(keys, perm, nth):
    """std::nth_element(begin, begin + nth, end): libstdc++'s introselect."""
    n = keys.shape[0]
    pos = jnp.arange(n, dtype=_POS)
    depth = jnp.where(pos == 0, 2 * _lg(n), 0)
    lo, hi = jnp.zeros(n, _POS), jnp.full(n, n, _POS)
    keys, perm, lo, hi, depth = _partition_rounds(
        keys, perm, lo, hi, depth, 3, lambda lo, hi: (lo <= nth) & (nth < hi)
    )
    first, last = lo[nth], hi[nth]
    # An exhausted depth budget ends in a heap select; otherwise an insertion sort finishes.
    heap = (last - first > 3) & (depth[first] == 0)
    keys, perm = _heap_select(
        keys, perm, first, jnp.where(heap, nth + 1, first), jnp.where(heap, last, first), False
    )
    keys, perm = _swap(keys, perm, first, nth, heap)
    return _insertion_sort(keys, perm, first, jnp.where(heap, first, last))


def _std_sort(keys, perm, end: int):
    """std::sort(begin, begin + end): libstdc++'s introsort."""
    n = keys.shape[0]
    pos = jnp.arange(n, dtype=_POS)
    depth = jnp.where(pos == 0, 2 * _lg(end), 0)
    inside = pos < end
    lo, hi = jnp.where(inside, 0, end).astype(_POS), jnp.where(inside, end, n).astype(_POS)
    keys, perm, lo, hi, depth = _partition_rounds(
        keys, perm, lo, hi, depth, _INSERTION_SORT_MAX, lambda lo, hi: lo < end
    )
    heap = (pos == lo) & inside & (hi - lo > _INSERTION_SORT_MAX) & (depth == 0)

    def heapsort(s):
        # A segment whose depth budget ran out is heap-sorted (std::partial_sort over all of it).
        keys, perm, heap = s
        first = jnp.argmax(heap).astype(_POS)
        last = jnp.where(heap[first], hi[first], first)
        keys, perm = _heap_select(keys, perm, first, last, last, True, scan=False)
        return keys, perm, heap.at[first].set(False)

    keys, perm, _ = lax.while_loop(lambda s: jnp.any(s[2]), heapsort, (keys, perm, heap))
    # __final_insertion_sort over the whole range.
    return _insertion_sort(keys, perm, 0, end)


def _quickselect(keys, perm, k):
    """TH's quick_select_template (Sedgewick's partition), as kthvalue runs it."""
    n = keys.shape[0]
    pos = jnp.arange(n, dtype=_POS)

    def body(s):
        keys, perm, left, right = s
        two, many = right == left + 1, right > left + 1
        keys, perm = _swap(keys, perm, left, right, two & (keys[left] > keys[right]))
        # Median of three: keys[left + 1] <= keys[left] <= keys[right] guard both scans.
        keys, perm = _swap(keys, perm, (left + right) >> 1, left + 1, many)
        keys, perm = _swap(keys, perm, left + 1, right, many & (keys[left + 1] > keys[right]))
        keys, perm = _swap(keys, perm, left, right, many & (keys[left] > keys[right]))
        keys, perm = _swap(keys, perm, left + 1, left, many & (keys[left + 1] > keys[left]))
        pivot, lo, hi = keys[left], left + 2, right
        inside = many & (pos >= lo) & (pos < hi)
        ls, rs, m, src = _exchange(inside & (keys >= pivot), inside & (keys <= pivot), lo, hi)
        keys, perm = keys[src], perm[src]
        # Scans meeting on one element equal to the pivot swap it with itself and go on once.
        met = _slot(ls, lo + m, lo, hi, -2) == _slot(rs, lo + m, lo, hi, -3)
        i = jnp.minimum(_slot(ls, lo + m + met, lo, hi, n), _slot(rs, lo + m - 1, lo, hi, right))
        j = jnp.maximum(
            _slot(rs, lo + m + met, lo, hi, -1), _slot(ls, lo + m - 1, lo, hi, left + 1)
        )
        keys, perm = _swap(keys, perm, left, j, many)
        new_left = jnp.where(two, right, jnp.where(j <= k, i, left))
        new_right = jnp.where(many & (j >= k), j - 1, right)
        return keys, perm, new_left, new_right

    state = (keys, perm, jnp.asarray(0, _POS), jnp.asarray(n - 1, _POS))
    keys, perm, _, _ = lax.while_loop(lambda s: s[3] > s[2], body, state)
    return keys, perm


def _identity_perm(keys):
    return jnp.arange(keys.shape[0], dtype=_POS)


def _std_sort_rows(rows: jax.Array, descending: bool) -> jax.Array:
    """The index order std::sort leaves each row in, comparing as KeyValueCompAsc/Desc do."""
    values, idx = _stable_sort(rows, descending)
    if rows.shape[1] <= _INSERTION_SORT_MAX:
        return idx

    def replay():
        ranks = _ranks(rows)[0]
        keys = -ranks if descending else ranks
        n = rows.shape[1]
        return jax.vmap(lambda k: _std_sort(k, _identity_perm(k), n)[1])(keys)

    return lax.cond(jnp.any(_ties(values)), replay, lambda: idx)


# --- sort ------------------------------------------------------------------------------------


def _radix_sorted(x: jax.Array, descending: bool) -> bool:
    """Whether eager takes fbgemm's radix sort (stable): 1-d integers, ascending, and large."""
    integral = jnp.issubdtype(x.dtype, jnp.integer)
    return x.ndim == 1 and integral and not descending and x.size >= _RADIX_SORT_MIN


def _sort_lowering(ctx, x, dim, descending, stable):
    ndim = jnp.ndim(x)
    rows, batch = _rows(x, dim)
    if stable or _radix_sorted(jnp.asarray(x), descending):
        idx = _stable_sort(rows, descending)[1]
    else:
        idx = _std_sort_rows(rows, descending)
    values = _gather(rows, idx)
    return _along(ctx, values, batch, ndim, dim), _along(ctx, idx, batch, ndim, dim, 1)


@lowering("aten.sort.default")
def _sort(ctx, x, dim=-1, descending=False):
    return _sort_lowering(ctx, x, dim, descending, stable=False)


@lowering("aten.sort.stable")
def _sort_stable(ctx, x, *, stable=None, dim=-1, descending=False):
    return _sort_lowering(ctx, x, dim, descending, bool(stable))


# --- topk, kthvalue --------------------------------------------------------------------------


def _topk_row(keys, k: int, sorted: bool):
    """The first ``k`` of eager's queue (TopKImpl.h: partial_sort, or nth_element + sort)."""
    n = keys.shape[0]
    perm = _identity_perm(keys)
    if k * 64 <= n:
        return _heap_select(keys, perm, 0, k, n, True)[1][:k]
    keys, perm = _nth_element(keys, perm, k - 1)
    if sorted and k > 2:
        keys, perm = _std_sort(keys, perm, k - 1)
    return perm[:k]


@lowering("aten.topk.default")
def _topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    ndim = jnp.ndim(x)
    k = k if ndim else 1  # eager's topk(0) of a 0-d tensor gives its one element, as topk(1)
    rows, batch = _rows(x, dim)
    n = rows.shape[1]
    if k == 0 or rows.size == 0:
        return _empty(ctx)
    ranks = _ranks(rows)[0]
    keys = -ranks if largest else ranks
    replay = functools.partial(jax.vmap(_topk_row, in_axes=(0, None, None)), keys, k, sorted)
    if k * 64 > n and not sorted and k > 1:
        # nth_element leaves the first k in an order of its own, ties or not.
        idx = replay()
    else:
        # Sorted, the first k have one possible order unless the first k + 1 hold equal keys.
        order_keys, order = lax.sort((keys, lax.broadcasted_iota(_POS, keys.shape, 1)), num_keys=1)
        tied = jnp.any(order_keys[:, 1 : k + 1] == order_keys[:, : min(k, n - 1)])
        if k == 1 and k * 64 <= n:
            # A heap of one keeps the first of equal elements, as the stable order does.
            idx = order[:, :1]
        else:
            idx = lax.cond(tied, replay, lambda: order[:, :k])
    values = _gather(rows, idx)
    return _along(ctx, values, batch, ndim, dim), _along(ctx, idx, batch, ndim, dim, 1)


@lowering("aten.kthvalue.default")
def _kthvalue(ctx, x, k, dim=-1, keepdim=False):
    rows, _ = _rows(x, dim)
    ranks, order, tied = _ranks(rows)

    def replay():
        return jax.vmap(lambda r: _quickselect(r, _identity_perm(r), k - 1)[1][k - 1])(ranks)

    idx = lax.cond(tied, replay, lambda: order[:, k - 1])[:, None]
    return _reduced(ctx, _gather(rows, idx)), _reduced(ctx, idx, 1)


# --- median ----------------------------------------------------------------------------------


def _nth_of(ranks, order, tied, nth):
    """Index of the element std::nth_element puts at ``nth`` (per row) under rank order."""

    def replay():
        return jax.vmap(lambda r, i: _nth_element(r, _identity_perm(r), i)[1][i])(ranks, nth)

    return lax.cond(tied, replay, lambda: jnp.take_along_axis(order, nth[:, None], 1)[:, 0])


def _nan_count(rows):
    if not jnp.issubdtype(rows.dtype, jnp.inexact):
        return jnp.zeros(rows.shape[0], _POS)
    return jnp.sum(jnp.isnan(rows), axis=1, dtype=_POS)


def _median_of_all(ctx, x, ignore_nan: bool):
    rows = jnp.ravel(x)[None, :]
    if rows.size == 0:
        return jnp.full((), jnp.nan).astype(ctx.dtype)
    nans = _nan_count(rows)
    # std::nth_element on the values; nanmedian's comparator puts NaN last.
    valid = rows.shape[1] - nans
    nth = jnp.where(valid > 0, (valid - 1) // 2, 0)
    ranks, order, tied = _ranks(rows)
    value = rows[0, _nth_of(ranks, order, tied, nth)[0]]
    if not ignore_nan and jnp.issubdtype(rows.dtype, jnp.inexact):
        value = jnp.where(nans[0] > 0, jnp.nan, value)
    return value.astype(ctx.dtype)


@lowering("aten.median.default")
def _median(ctx, x):
    return _median_of_all(ctx, x, ignore_nan=False)


@lowering("aten.nanmedian.default")
def _nanmedian(ctx, x):
    return _median_of_all(ctx, x, ignore_nan=True)


@functools.cache
def _all_nan_index(n: int) -> int:
    """The index nanmedian returns for a row of ``n`` NaNs: std::nth_element's pick at 0 when
    every element is equivalent."""
    with jax.ensure_compile_time_eval():
        keys = jnp.zeros(n, _POS)
        return int(_nth_element(keys, _identity_perm(keys), 0)[1][0])


def _median_dim(ignore_nan: bool):
    def lower(ctx, x, dim, keepdim=False):
        rows, _ = _rows(x, dim)
        n = rows.shape[1]
        order = _stable_sort(rows)[1]
        nans = _nan_count(rows)
        if ignore_nan:
            valid = n - nans
            nth = jnp.where(valid > 0, (valid - 1) // 2, 0)
            idx = jnp.take_along_axis(order, nth[:, None], 1)[:, 0]
            idx = jnp.where(valid > 0, idx, _all_nan_index(n))
        else:
            # The comparator breaks ties by index: the stable order's middle, or the first NaN.
            idx = order[:, (n - 1) // 2]
            if jnp.issubdtype(rows.dtype, jnp.inexact):
                idx = jnp.where(nans > 0, jnp.argmax(jnp.isnan(rows), axis=1), idx)
        idx = idx[:, None]
        return _reduced(ctx, _gather(rows, idx)), _reduced(ctx, idx, 1)

    return lower


lowering("aten.median.dim")(_median_dim(ignore_nan=False))
lowering("aten.nanmedian.dim")(_median_dim(ignore_nan=True))


# --- mode ------------------------------------------------------------------------------------


@lowering("aten.mode.default")
def _mode(ctx, x, dim=-1, keepdim=False):
    rows, _ = _rows(x, dim)
    if rows.size == 0:
        return _empty(ctx)
    # Eager std::sorts (value, index) pairs by value, then keeps the last pair of the first
    # longest run of equal neighbours (NaN != NaN: each NaN is a run of its own). Its comparator
    # is a plain `<`, which NaN breaks; rows without NaN are replayed exactly.
    idx = _std_sort_rows(rows, descending=False)
    values = _gather(rows, idx)
    differs = values[:, 1:] != values[:, :-1]
    edge = jnp.ones((rows.shape[0], 1), bool)
    starts = jnp.concatenate([edge, differs], axis=1)
    ends = jnp.concatenate([differs, edge], axis=1)
    pos = lax.broadcasted_iota(_POS, rows.shape, 1)
    length = jnp.where(ends, pos - lax.cummax(jnp.where(starts, pos, 0), axis=1) + 1, 0)
    best = jnp.argmax(length, axis=1)[:, None]
    return _reduced(ctx, _gather(values, best)), _reduced(ctx, _gather(idx, best), 1)


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
