"""Tests for lowerings/sorting.py: every lowering against eager CPU PyTorch, ties included.

PyTorch specifies the order of equal elements only for sort(stable=True). Where it leaves the
choice open (sort and argsort with stable=False, the indices of topk, kthvalue, median, nanmedian
and mode, the order of topk(sorted=False), and which of several most frequent values mode gives),
``check_ties`` and ``check_mode`` assert only what is specified.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.lowerings.util import check_lowering, make, run_lowering

aten = torch.ops.aten
NAN, INF = math.nan, math.inf


def ties(shape, levels=3, seed=0, dtype=torch.float32):
    """Few distinct values, so equal elements abound and their order shows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, levels, shape, generator=g).to(dtype)


def with_nan(shape, seed=0):
    x = ties(shape, levels=4, seed=seed)
    return x.masked_fill(x == 3, NAN)


# NaN of either sign sorts above +inf; -0.0 equals 0.0.
ODD_FLOATS = torch.tensor([[INF, -NAN, -INF, 0.0, NAN, -0.0, 1.0, -1.0, NAN, -NAN, 0.0]])
INT_EXTREMES = torch.tensor([[5, 2**62, -(2**63), 2**63 - 1, -(2**63), 0]])


def signed_zeros(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(shape).masked_fill(torch.rand(shape, generator=g) < 0.5, -0.0)
    return torch.cat([x, torch.ones(shape[:-1] + (1,))], dim=-1)


def check_signs(op, *args, **kwargs):
    """Values match eager down to the sign of zero (assert_close calls -0.0 and 0.0 equal)."""
    expected, got = run_lowering(op, *args, **kwargs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    for e, g in zip(expected, got):
        _same_bits(g, e)


def _same_bits(got, expected):
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    if got.is_floating_point():
        assert torch.equal(torch.signbit(got), torch.signbit(expected)), (got, expected)


def _lowered_and_eager(dim, op, x, /, *args, **kwargs):
    """(rows of ``x``, eager's (values, indices), the lowering's), all with ``dim`` last and
    reduced dims kept."""
    expected, got = run_lowering(op, x, *args, **kwargs)
    for e, g in zip(expected, got):
        assert (g.dtype, g.shape) == (e.dtype, e.shape)

    def along(t):
        if x.dim() == 0:
            return t.reshape(1)
        if t.dim() < x.dim():
            t = t.unsqueeze(dim % x.dim())
        return t.movedim(dim, -1)

    return along(x), tuple(map(along, expected)), tuple(map(along, got))


def _occurrences(rows, values):
    """How often each of ``values`` occurs in its row (all NaNs count as equal)."""
    equal = rows.unsqueeze(-2) == values.unsqueeze(-1)
    if rows.is_floating_point():
        equal |= rows.unsqueeze(-2).isnan() & values.unsqueeze(-1).isnan()
    return equal.sum(-1)


def check_ties(dim, op, x, /, *args, unordered=False, **kwargs):
    """``op`` picks (values, indices) along ``dim`` of ``x``, free to choose among equal elements:
    eager's values, indices of distinct elements holding exactly those values (sign of zero
    included), and eager's index wherever the value occurs once in its row. ``unordered``: the
    order of the picked elements is open too (topk with sorted=False)."""
    rows, (e_val, e_idx), (g_val, g_idx) = _lowered_and_eager(dim, op, x, *args, **kwargs)
    if unordered:
        e_order, g_order = (v.sort(dim=-1, stable=True).indices for v in (e_val, g_val))
        e_val, e_idx = e_val.gather(-1, e_order), e_idx.gather(-1, e_order)
        g_val, g_idx = g_val.gather(-1, g_order), g_idx.gather(-1, g_order)
    torch.testing.assert_close(g_val, e_val, rtol=0, atol=0, equal_nan=True)
    _same_bits(rows.gather(-1, g_idx), g_val)
    picked = g_idx.sort(-1).values
    assert (picked[..., 1:] != picked[..., :-1]).all(), g_idx
    once = _occurrences(rows, e_val) == 1
    assert torch.equal(g_idx[once], e_idx[once]), (g_idx, e_idx)


def check_mode(x, dim=-1, keepdim=False):
    """mode gives a most frequent value of each row (which one, when several are, is open) and
    an index holding it."""
    rows, (e_val, _), (g_val, g_idx) = _lowered_and_eager(dim, aten.mode.default, x, dim, keepdim)
    assert torch.equal(_occurrences(rows, g_val), _occurrences(rows, e_val))
    _same_bits(rows.gather(-1, g_idx), g_val)


# --- sort ------------------------------------------------------------------------------------


@pytest.mark.parametrize("descending", [False, True])
def test_sort_stable_keeps_the_order_of_equal_elements(descending):
    # NaN sorts above +inf; -0.0 and 0.0 are equal, so they keep their order and their signs.
    kwargs = {"stable": True, "descending": descending}
    check_lowering(aten.sort.stable, with_nan((16, 300)), dim=1, **kwargs)
    check_lowering(aten.sort.stable, ties((17, 40), dtype=torch.int8), dim=0, **kwargs)
    check_lowering(aten.sort.stable, ties((1000,), levels=2, dtype=torch.bool), **kwargs)
    check_lowering(aten.sort.stable, ties((5, 5, 5), dtype=torch.int64), dim=-3, **kwargs)
    check_lowering(aten.sort.stable, ties((4, 40), dtype=torch.uint8), dim=1, **kwargs)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        check_lowering(aten.sort.stable, with_nan((4, 40)).to(dtype), dim=1, **kwargs)
    check_signs(aten.sort.stable, signed_zeros((2, 30)), dim=1, **kwargs)
    check_signs(aten.sort.stable, ODD_FLOATS, **kwargs)
    check_lowering(aten.sort.stable, INT_EXTREMES, **kwargs)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_unstable(descending):
    # Eager's order of equal elements comes from libstdc++'s introsort (an insertion sort up to
    # 16 elements, fbgemm's radix sort for long 1-d integers): not specified.
    check_ties(1, aten.sort.default, with_nan((16, 300)), 1, descending)
    check_ties(0, aten.sort.default, ties((17, 40), dtype=torch.int8), 0, descending)
    check_ties(0, aten.sort.default, ties((1000,), levels=2, dtype=torch.bool), 0, descending)
    check_ties(0, aten.sort.default, ties((32768,), dtype=torch.int64), 0, descending)
    check_ties(1, aten.sort.default, signed_zeros((2, 30)), 1, descending)
    check_ties(1, aten.sort.default, make((3, 40), torch.bfloat16), 1, descending)
    check_ties(1, aten.sort.stable, ties((3, 40)), stable=None, dim=1, descending=descending)
    check_ties(0, aten.sort.stable, ties((40, 3)), stable=False, dim=0, descending=descending)


def test_sort_distinct_values():
    # Without equal elements the order is specified, indices included.
    for descending in (False, True):
        check_lowering(aten.sort.default, make((2, 50)), 1, descending)
        check_lowering(aten.sort.default, make((5, 6, 7)), 1, descending)


def test_sort_edge_cases():
    check_lowering(aten.sort.default, make(()))
    check_lowering(aten.sort.default, torch.zeros(3, 0), 1)
    check_lowering(aten.sort.stable, torch.zeros(0), stable=True, descending=True)


# --- topk ------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("sorted", [True, False])
def test_topk(largest, sorted):
    # Which of equal elements is picked is open ("not guaranteed to be stable"), and without
    # sorted so is the order of the k: eager's come from std::partial_sort or nth_element.
    def check(dim, x, k):
        check_ties(dim, aten.topk.default, x, k, dim, largest, sorted, unordered=not sorted)

    check(1, make((64, 4)), 3)
    check(1, ties((64, 10), dtype=torch.int64), 4)
    check(-1, with_nan((32, 10)), 1)
    check(1, ties((8, 45)), 20)
    check(1, ties((8, 130), levels=4), 2)
    check(1, with_nan((4, 200)), 3)
    check(1, with_nan((4, 200)), 190)
    check(0, ties((40, 3), dtype=torch.int8), 5)
    check(1, signed_zeros((2, 12)), 6)
    check(1, ODD_FLOATS, 5)
    check(1, INT_EXTREMES, 3)
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.uint8):
        check(1, ties((4, 30), levels=5, dtype=dtype), 5)


def test_topk_distinct_values():
    # Without equal elements the indices are specified too.
    check_lowering(aten.topk.default, make((64, 40)), 5, 1)
    check_lowering(aten.topk.default, make((64, 40)), 5, 1, False)
    check_lowering(aten.topk.default, make((5, 10, 5)), 3, -2)
    check_lowering(aten.topk.default, make((2, 200)), 30, 1)
    check_lowering(aten.topk.default, make((2, 200)), 1, 1, False)


def test_topk_edge_cases():
    check_lowering(aten.topk.default, make((3, 4)), 0)
    check_lowering(aten.topk.default, torch.zeros(3, 0), 0)
    check_lowering(aten.topk.default, torch.zeros(0, 3), 2)
    check_lowering(aten.topk.default, make(()), 1)
    check_lowering(aten.topk.default, make(()), 0)  # the element itself, as k = 1


# --- kthvalue --------------------------------------------------------------------------------


def test_kthvalue():
    # Eager's index among equal elements is wherever TH's quickselect leaves one: not specified.
    for k in (1, 3, 5):
        check_ties(1, aten.kthvalue.default, ties((25, 5), dtype=torch.int64), k, 1)
    check_ties(0, aten.kthvalue.default, with_nan((6, 5)), 2, 0, True)
    check_ties(0, aten.kthvalue.default, with_nan((6, 5)), 5, 0)
    check_ties(-1, aten.kthvalue.default, ties((32, 33)), 17, -1)
    check_ties(1, aten.kthvalue.default, with_nan((4, 9, 5)), 3, 1, True)
    check_ties(1, aten.kthvalue.default, signed_zeros((3, 9)), 4, 1)
    check_ties(1, aten.kthvalue.default, ties((4, 30), dtype=torch.bfloat16), 7, 1)
    check_lowering(aten.kthvalue.default, make((4, 5)), 2)
    check_lowering(aten.kthvalue.default, make(()), 1)


# --- median ----------------------------------------------------------------------------------


def test_median_default():
    # The lower median; median is NaN where a NaN is, nanmedian skips them. Which of equal zeros
    # (and so the sign of a zero median) is open.
    for op in (aten.median.default, aten.nanmedian.default):
        check_lowering(op, ties((4, 6), dtype=torch.int64))
        check_lowering(op, with_nan((4, 6)))
        check_lowering(op, torch.full((5,), NAN))
        check_lowering(op, torch.tensor([2**60 + 1, 2**60 + 3, 2**60 + 5]))
        check_lowering(op, make(()))
        check_lowering(op, torch.zeros(0))
        check_lowering(op, signed_zeros((3, 7)))


@pytest.mark.parametrize("op", [aten.median.dim, aten.nanmedian.dim])
def test_median_dim(op):
    # "indices does not necessarily contain the first occurrence of each median value found,
    # unless it is unique".
    check_lowering(op, make((4, 6)), 0, True)
    check_ties(-1, op, ties((5, 8), dtype=torch.int64), -1)
    check_ties(1, op, with_nan((32, 7)), 1)
    check_ties(1, op, with_nan((4, 9, 5)), 1, True)
    check_ties(1, op, signed_zeros((3, 7)), 1)
    check_lowering(op, make(()), 0)
    for n in (1, 4, 9):  # rows of NaN but one element, and all NaN
        x = torch.full((2, n), NAN)
        x[1, 0] = 1.0
        check_ties(1, op, x, 1)


# --- mode ------------------------------------------------------------------------------------


def test_mode():
    check_mode(ties((5, 5, 5), dtype=torch.int64))
    check_mode(ties((5, 5, 5)), 1, True)
    check_mode(ties((5, 9), levels=2, dtype=torch.bool), 0)
    check_mode(ties((16, 40), levels=5, dtype=torch.int64))
    check_mode(ties((3, 200), levels=7))
    check_mode(signed_zeros((2, 9)), 1)
    check_mode(make((4, 6)), 1)  # every value once: any is a mode
    check_lowering(aten.mode.default, make(()), 0, True)
    check_lowering(aten.mode.default, torch.zeros(0, 3), 1)


# --- cumulative extrema ----------------------------------------------------------------------


@pytest.mark.parametrize("op", [aten.cummax.default, aten.cummin.default])
def test_cumulative_extrema(op):
    # Equal values move the index to the latest one; a NaN sticks and every later NaN takes over.
    check_lowering(op, ties((4, 9)), 1)
    check_lowering(op, ties((5, 5, 5), dtype=torch.int64), 0)
    check_lowering(op, with_nan((8, 9)), 1)
    check_lowering(op, ties((6, 5), levels=2, dtype=torch.bool), 1)
    check_lowering(op, torch.tensor([1.0, NAN, 3.0, NAN, -INF, 2.0]), 0)
    check_lowering(op, make(()), 0)
    check_lowering(op, torch.zeros(0, 3), 0)
    check_signs(op, signed_zeros((2, 9)), 1)


# --- logcumsumexp ----------------------------------------------------------------------------


def test_logcumsumexp():
    check_lowering(aten.logcumsumexp.default, make((5, 5, 5)), 0)
    check_lowering(aten.logcumsumexp.default, make((5, 5, 5)), -1)
    check_lowering(aten.logcumsumexp.default, make(()), 0)
    check_lowering(aten.logcumsumexp.default, make((3, 4), torch.float64, -50, 50), 1)
    x = torch.tensor([[-INF, -INF, 0.0, INF, 1.0], [1.0, NAN, 2.0, -INF, INF]])
    check_lowering(aten.logcumsumexp.default, x, 1)
    check_lowering(
        aten.logcumsumexp.default, make((4, 6), torch.bfloat16), 1, atol=2e-2, rtol=1.6e-2
    )


def test_logcumsumexp_complex():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, generator=g, dtype=torch.complex64)
    check_lowering(aten.logcumsumexp.default, x, 1, atol=1e-4, rtol=1e-4)


# --- searchsorted / bucketize ----------------------------------------------------------------

BOUNDARIES = torch.tensor([-1.0, 0.0, 0.0, 1.5, 2.0, 2.0, 3.0])
PROBES = torch.tensor(
    [[-2.0, -1.0, 0.0, 0.5, 2.0, 3.0, 4.0, NAN], [1.5, 2.5, -0.0, 0.0, 3.0, 5, 6, 7]]
)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted(right):
    check_lowering(aten.searchsorted.Tensor, BOUNDARIES, PROBES, right=right)
    check_lowering(aten.searchsorted.Tensor, BOUNDARIES, PROBES, side="right" if right else "left")
    check_lowering(aten.searchsorted.Tensor, BOUNDARIES, PROBES, right=right, out_int32=True)
    nd = torch.sort(make((2, 3, 6)), dim=-1).values
    check_lowering(aten.searchsorted.Tensor, nd, make((2, 3, 4), seed=1), right=right)
    ints = torch.tensor([0, 2, 2, 5, 9])
    check_lowering(aten.searchsorted.Tensor, ints, ties((3, 4), levels=10), right=right)
    check_lowering(aten.searchsorted.Tensor, ints, make((4,)), right=right)
    check_lowering(aten.searchsorted.Scalar, BOUNDARIES, 2.0, right=right)
    check_lowering(aten.searchsorted.Scalar, ints, 2, right=right)
    check_lowering(aten.searchsorted.Scalar, ints, 2.5, right=right, out_int32=True)


def test_searchsorted_sorter_and_odd_boundaries():
    unsorted = torch.tensor([3.0, -1.0, 2.0, 0.0, NAN, 1.0])
    sorter = torch.argsort(unsorted)
    probes = make((2, 5))
    check_lowering(aten.searchsorted.Tensor, unsorted, probes, sorter=sorter)
    check_lowering(aten.searchsorted.Tensor, unsorted, probes, side="right", sorter=sorter)
    rows = make((3, 7))
    check_lowering(aten.searchsorted.Tensor, rows, make((3, 2)), sorter=torch.argsort(rows))
    # Unsorted boundaries and NaN land where eager's binary search takes them.
    check_lowering(aten.searchsorted.Tensor, unsorted, probes)
    check_lowering(aten.searchsorted.Tensor, torch.tensor([1.0, NAN, 2.0]), probes, right=True)
    check_lowering(aten.searchsorted.Tensor, torch.zeros(0), probes)


@pytest.mark.parametrize("right", [False, True])
def test_bucketize(right):
    check_lowering(aten.bucketize.Tensor, PROBES, BOUNDARIES, right=right)
    check_lowering(aten.bucketize.Tensor, PROBES, BOUNDARIES, right=right, out_int32=True)
    check_lowering(aten.bucketize.Tensor, make(()), BOUNDARIES, right=right)
    check_lowering(aten.bucketize.Tensor, ties((3, 3), 9, dtype=torch.int64), BOUNDARIES)
    check_lowering(aten.bucketize.Scalar, 1.5, BOUNDARIES, right=right)
    check_lowering(aten.bucketize.Scalar, 2, torch.tensor([0, 2, 4]), right=right)


# --- histc -----------------------------------------------------------------------------------


def test_histc():
    x = make((50,), low=-2, high=2)
    check_lowering(aten.histc.default, x)
    check_lowering(aten.histc.default, x, 7)
    check_lowering(aten.histc.default, x, 5, -1.0, 1.0)
    check_lowering(aten.histc.default, x, 4, -1, 3)
    check_lowering(aten.histc.default, x.double(), 10, -2.5, 2.5)
    # Values on the edges: the last bin holds its right edge, NaN and outsiders are skipped.
    edges = torch.tensor([0.0, 0.25, 0.5, 1.0, 1.0, -0.1, 1.1, NAN, 0.75])
    check_lowering(aten.histc.default, edges, 4, 0, 1)
    check_lowering(aten.histc.default, torch.tensor([0.1, 0.2, 0.3]), 3, 0.1, 0.3)


def test_histc_data_range():
    # min == max takes the data's range; an empty or constant one widens to +-1.
    check_lowering(aten.histc.default, make((20,)), 6)
    check_lowering(aten.histc.default, torch.full((4,), 2.0), 3)
    check_lowering(aten.histc.default, torch.zeros(0), 3, 1, 1)
    check_lowering(aten.histc.default, make(()), 2)


def test_logcumsumexp_float32_gradient_matches_eager():
    # The backward (reverse logcumsumexp of log|grad| - result, exponentiated) subtracts two
    # nearly equal terms, so it is sensitive to the forward's rounding (eager accumulates in double).
    import lazy_torch  # noqa: F401  (device 'lazy')

    x = make((5, 5, 5), low=-9, high=9, seed=3).requires_grad_()
    cotangent = make((5, 5, 5), seed=4)
    (expected,) = torch.autograd.grad(torch.logcumsumexp(x, 1), x, cotangent)
    lazy_x = x.detach().to("lazy").requires_grad_()
    (got,) = torch.autograd.grad(torch.logcumsumexp(lazy_x, 1), lazy_x, cotangent.to("lazy"))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)


# --- isin ----------------------------------------------------------------------------------


@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    ints = ties((3, 5), levels=10).long()
    check_lowering(aten.isin.Tensor_Tensor, ints, torch.tensor([1, 3, 7]), invert=invert)
    check_lowering(aten.isin.Tensor_Tensor, ints, torch.tensor([], dtype=torch.long))
    check_lowering(aten.isin.Tensor_Scalar, ints, 3, invert=invert)
    check_lowering(aten.isin.Scalar_Tensor, 4, torch.tensor([1, 4]), invert=invert)
    # Signed zeros are equal, NaN equals nothing; mixed dtypes compare in the promoted one.
    check_lowering(aten.isin.Tensor_Tensor, ODD_FLOATS, torch.tensor([0.0, NAN, INF]))
    check_lowering(aten.isin.Tensor_Tensor, ints.int(), torch.tensor([1.0, 2.5]), invert=invert)
    check_lowering(aten.isin.Tensor_Tensor, INT_EXTREMES, torch.tensor([2**63 - 1, 5]))
    # Past _ISIN_PAIRS comparisons the lookup goes through the sorted test elements.
    many, table = ties((300, 300), levels=1000, seed=1).long(), ties((2000,), levels=1000)
    check_lowering(aten.isin.Tensor_Tensor, many, table.long(), invert=invert)
    floats = with_nan((300, 300), seed=2)
    check_lowering(aten.isin.Tensor_Tensor, floats, torch.tensor([2.0, NAN, -0.0]), invert=invert)
