"""Tests for lowerings/sorting.py: every lowering against eager CPU PyTorch, ties included."""

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


def signed_zeros(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(shape).masked_fill(torch.rand(shape, generator=g) < 0.5, -0.0)
    return torch.cat([x, torch.ones(shape[:-1] + (1,))], dim=-1)


def check_signs(op, *args, **kwargs):
    """Values match eager down to the sign of zero (assert_close calls -0.0 and 0.0 equal)."""
    expected, got = run_lowering(op, *args, **kwargs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    for e, g in zip(expected, got):
        assert torch.equal(e, g), (e, g)
        if e.is_floating_point():
            assert torch.equal(torch.signbit(e), torch.signbit(g)), (e, g)


# --- sort ------------------------------------------------------------------------------------


@pytest.mark.parametrize("descending", [False, True])
def test_sort_short_rows_are_stable(descending):
    # Up to 16 elements std::sort is an insertion sort: stable.
    check_lowering(aten.sort.default, with_nan((64, 16)), 1, descending)
    check_lowering(aten.sort.default, ties((5, 5, 5), dtype=torch.int64), -3, descending)
    check_lowering(aten.sort.default, ties((9, 7), levels=2, dtype=torch.bool), 0, descending)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_replays_std_sort(descending):
    # Longer rows with ties: eager leaves equal elements where libstdc++'s introsort does.
    check_lowering(aten.sort.default, with_nan((16, 300)), 1, descending)
    check_lowering(aten.sort.default, ties((17, 40), dtype=torch.int8), 0, descending)
    check_lowering(aten.sort.default, ties((1000,), levels=2, dtype=torch.bool), 0, descending)
    check_lowering(aten.sort.default, make((2, 50)), 1, descending)


def test_sort_stable():
    for descending in (False, True):
        kwargs = {"stable": True, "dim": 1, "descending": descending}
        check_lowering(aten.sort.stable, with_nan((3, 30)), **kwargs)
        check_lowering(aten.sort.stable, ties((3, 40), dtype=torch.bool), **kwargs)
    check_lowering(aten.sort.stable, ties((40, 3)), stable=False, dim=0, descending=True)
    check_lowering(aten.sort.stable, make((4, 3)), stable=True)
    check_lowering(aten.sort.stable, ties((3, 40)), stable=None, dim=1)


def test_sort_radix_path_is_stable():
    # 1-d ascending integers from 32768 elements take fbgemm's (stable) radix sort.
    check_lowering(aten.sort.default, ties((32768,), dtype=torch.int64))


def test_sort_edge_cases():
    check_lowering(aten.sort.default, make(()))
    check_lowering(aten.sort.default, torch.zeros(3, 0), 1)
    check_lowering(aten.sort.default, torch.tensor([INF, -INF, NAN, 0.0, -0.0, NAN, 1.0]))
    check_lowering(aten.sort.default, make((3, 4), torch.bfloat16), 1, True)
    check_signs(aten.sort.default, signed_zeros((2, 30)), 1, True)


# --- topk ------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("sorted", [True, False])
def test_topk_nth_element_path(largest, sorted):
    # k * 64 > n: std::nth_element, then std::sort of the first k - 1 when sorted.
    check_lowering(aten.topk.default, make((64, 4)), 3, 1, largest, sorted)
    check_lowering(aten.topk.default, ties((64, 10), dtype=torch.int64), 4, 1, largest, sorted)
    check_lowering(aten.topk.default, with_nan((32, 10)), 1, -1, largest, sorted)
    check_lowering(aten.topk.default, ties((8, 45)), 20, 1, largest, sorted)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_partial_sort_path(largest):
    # k * 64 <= n: std::partial_sort, a heap select then a heap sort.
    check_lowering(aten.topk.default, ties((8, 130), levels=4), 2, 1, largest)
    check_lowering(aten.topk.default, with_nan((4, 200)), 3, 1, largest, False)
    check_lowering(aten.topk.default, make((2, 200)), 3, 1, largest)


def test_topk_edge_cases():
    check_lowering(aten.topk.default, make((5, 10, 5)), 3, -2)
    check_lowering(aten.topk.default, ties((3, 64)), 1)
    check_lowering(aten.topk.default, make((3, 4)), 0)
    check_lowering(aten.topk.default, make(()), 1)
    check_lowering(aten.topk.default, make(()), 0)  # the element itself, as k = 1
    check_lowering(aten.topk.default, make((4, 6), torch.bfloat16), 2)
    check_signs(aten.topk.default, signed_zeros((2, 12)), 6, 1, False)


def test_topk_small_rows_regression():
    # A partition that made no exchange once cut its segment at the wrong place.
    check_lowering(aten.topk.default, make((200, 4), seed=5), 3, 1, True, False)


# McIlroy's antiqsort adversary run against libstdc++: inputs that spend the depth budget, so
# std::sort ends in a heap sort and std::nth_element(begin, begin + 29, end) in a heap select.
# fmt: off
SORT_KILLER = [
    38, 1, 36, 3, 34, 5, 32, 7, 37, 9, 33, 11, 40, 13, 31, 15, 35, 17, 20, 19,
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 30, 27, 28, 25, 26, 23, 24, 21, 22, 29,
]
SELECT_KILLER = [
    60, 1, 60, 3, 60, 5, 60, 7, 60, 9, 60, 11, 60, 13, 60, 15, 60, 17, 60, 19,
    28, 26, 29, 25, 20, 23, 24, 21, 22, 27, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18,
] + [60] * 20
# fmt: on


def test_depth_limit_fallbacks():
    check_lowering(aten.sort.default, torch.tensor([SORT_KILLER], dtype=torch.float32), 1)
    check_lowering(aten.mode.default, torch.tensor([SORT_KILLER]), 1)
    # topk(largest=False, sorted=False) is nth_element at k - 1, then the first k.
    check_lowering(aten.topk.default, torch.tensor([SELECT_KILLER]), 30, 1, False, False)


# --- kthvalue --------------------------------------------------------------------------------


def test_kthvalue():
    # TH's quickselect decides which of equal elements is returned.
    for k in (1, 3, 5):
        check_lowering(aten.kthvalue.default, ties((25, 5), dtype=torch.int64), k, 1)
    check_lowering(aten.kthvalue.default, with_nan((6, 5)), 2, 0, True)
    check_lowering(aten.kthvalue.default, ties((32, 33)), 17, -1)
    check_lowering(aten.kthvalue.default, make((4, 5)), 2)
    check_lowering(aten.kthvalue.default, make(()), 1)


# --- median ----------------------------------------------------------------------------------


def test_median_default():
    for op in (aten.median.default, aten.nanmedian.default):
        check_lowering(op, ties((4, 6), dtype=torch.int64))
        check_lowering(op, with_nan((4, 6)))
        check_lowering(op, torch.full((5,), NAN))
        check_lowering(op, torch.tensor([2**60 + 1, 2**60 + 3, 2**60 + 5]))
        check_lowering(op, make(()))
        check_signs(op, signed_zeros((3, 7)))


@pytest.mark.parametrize("op", [aten.median.dim, aten.nanmedian.dim])
def test_median_dim(op):
    check_lowering(op, make((4, 6)), 0, True)
    check_lowering(op, ties((5, 8), dtype=torch.int64), -1)
    check_lowering(op, with_nan((32, 7)), 1)
    check_lowering(op, make(()), 0)
    check_signs(op, signed_zeros((3, 7)), 1)


def test_nanmedian_all_nan_rows():
    # The comparator finds every NaN equivalent: the index is wherever nth_element leaves one.
    for n in (1, 4, 9, 31):
        x = torch.full((2, n), NAN)
        x[1, 0] = 1.0
        check_lowering(aten.nanmedian.dim, x, 1)


# --- mode ------------------------------------------------------------------------------------


def test_mode():
    check_lowering(aten.mode.default, ties((5, 5, 5), dtype=torch.int64))
    check_lowering(aten.mode.default, ties((5, 5, 5)), 1, True)
    check_lowering(aten.mode.default, ties((5, 9), levels=2, dtype=torch.bool), 0)
    check_lowering(aten.mode.default, make(()), 0, True)
    # Past 16 elements the index within the winning run follows libstdc++'s introsort.
    check_lowering(aten.mode.default, ties((16, 40), levels=5, dtype=torch.int64))
    check_lowering(aten.mode.default, ties((3, 200), levels=7))


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
