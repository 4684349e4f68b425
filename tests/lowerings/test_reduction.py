"""Tests for lowerings/reduction.py: every lowering against eager CPU PyTorch."""

from __future__ import annotations

import math

import pytest
import torch

from tests.lowerings.util import check_lowering, make

aten = torch.ops.aten
NAN, INF = math.nan, math.inf
BF16_TOL = {"atol": 2e-2, "rtol": 1.6e-2}

# (dim, keepdim) cases for a 3-d input; dims may be negative, repeated orders, or absent.
DIMS = [(None, False), ((), False), (1, False), (-1, True), ((0, 2), False), ((-1, 0), True)]


def as_list(dim):
    return [dim] if isinstance(dim, int) else dim


WITH_NAN = torch.tensor([[1.0, NAN, 3.0, NAN], [1.0, 5.0, 5.0, 2.0], [-INF, 0.0, INF, 2.0]])


# --- sum / mean / prod -----------------------------------------------------------------------


@pytest.mark.parametrize("dim, keepdim", DIMS)
def test_sum(dim, keepdim):
    x = make((2, 3, 4))
    check_lowering(aten.sum.dim_IntList, x, as_list(dim), keepdim)
    check_lowering(aten.sum.dim_IntList, make((2, 3, 4), torch.int64), as_list(dim), keepdim)
    check_lowering(aten.sum.dim_IntList, make((2, 3, 4), torch.bool), as_list(dim), keepdim)
    check_lowering(aten.sum.dim_IntList, x, as_list(dim), keepdim, dtype=torch.float64)
    check_lowering(aten.sum.dim_IntList, x.bfloat16(), as_list(dim), keepdim, **BF16_TOL)


def test_sum_default():
    check_lowering(aten.sum.default, make((3, 5)))
    check_lowering(aten.sum.default, make((3, 5), torch.int32))
    check_lowering(aten.sum.default, make((3, 5), torch.bool))
    check_lowering(aten.sum.default, make((3, 5), torch.uint8, 0, 200))
    check_lowering(aten.sum.default, make((3, 5), torch.int64), dtype=torch.float32)
    check_lowering(aten.sum.default, make((3, 5)), dtype=torch.int64)
    check_lowering(aten.sum.default, make(()))
    check_lowering(aten.sum.default, torch.zeros(0, 3))
    check_lowering(aten.sum.default, WITH_NAN)
    check_lowering(aten.sum.dim_IntList, make(()), [0], True)
    check_lowering(aten.sum.dim_IntList, torch.zeros(0, 3), [0])
    check_lowering(aten.sum.default, make((64, 64), torch.bfloat16), **BF16_TOL)


@pytest.mark.parametrize("dim, keepdim", DIMS)
def test_mean(dim, keepdim):
    x = make((2, 3, 4))
    check_lowering(aten.mean.dim, x, as_list(dim), keepdim)
    check_lowering(
        aten.mean.dim, make((2, 3, 4), torch.int64), as_list(dim), keepdim, dtype=torch.float32
    )
    check_lowering(aten.mean.dim, x.bfloat16(), as_list(dim), keepdim, **BF16_TOL)


def test_mean_default():
    check_lowering(aten.mean.default, make((3, 5)))
    check_lowering(aten.mean.default, make((3, 5)), dtype=torch.float64)
    check_lowering(aten.mean.default, make(()))
    check_lowering(aten.mean.default, torch.zeros(0, 3))
    check_lowering(aten.mean.default, WITH_NAN)
    check_lowering(aten.mean.dim, torch.zeros(0, 3), [0])


def test_prod():
    x = make((3, 4), low=0.5, high=1.5)
    check_lowering(aten.prod.default, x)
    check_lowering(aten.prod.default, make((3, 4), torch.int64, -3, 3))
    check_lowering(aten.prod.default, make((3, 4), torch.bool))
    check_lowering(aten.prod.default, x, dtype=torch.float64)
    for dim, keepdim in [(0, False), (-1, True), (1, False)]:
        check_lowering(aten.prod.dim_int, x, dim, keepdim)
        check_lowering(aten.prod.dim_int, make((3, 4), torch.int32, -3, 3), dim, keepdim)
    check_lowering(aten.prod.dim_int, make(()), 0)
    check_lowering(aten.prod.dim_int, WITH_NAN, 1)
    check_lowering(aten.prod.dim_int, x.bfloat16(), 1, **BF16_TOL)
    check_lowering(aten.prod.default, torch.tensor([2**40, 2**30], dtype=torch.int64))


# --- extrema ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim, keepdim", [((), False), (1, False), (-1, True), ((0, 2), False)])
def test_amax_amin(op, dim, keepdim):
    f = getattr(aten, op).default
    check_lowering(f, make((2, 3, 4)), as_list(dim), keepdim)
    check_lowering(f, make((2, 3, 4), torch.int64, -50, 50), as_list(dim), keepdim)
    check_lowering(f, make((2, 3, 4), torch.bool), as_list(dim), keepdim)
    check_lowering(f, make((2, 3, 4), torch.bfloat16), as_list(dim), keepdim)


@pytest.mark.parametrize("op", ["amax", "amin", "max", "min"])
def test_extrema_nan_and_defaults(op):
    f = getattr(aten, op).default
    check_lowering(f, WITH_NAN)
    check_lowering(f, WITH_NAN[1:])
    check_lowering(f, make(()))
    check_lowering(f, make((3, 4), torch.int64))
    if op.startswith("a"):
        check_lowering(f, WITH_NAN, [1])
        check_lowering(f, WITH_NAN, [0], True)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_dim(op):
    f = getattr(aten, op).dim
    for dim, keepdim in [(0, False), (1, False), (-1, True), (-2, True)]:
        check_lowering(f, WITH_NAN, dim, keepdim)
        check_lowering(f, make((3, 4), torch.int64, -2, 2), dim, keepdim)
        check_lowering(f, make((3, 4), torch.bool), dim, keepdim)
    check_lowering(f, make((2, 3, 4)), 1)
    check_lowering(f, make(()), 0)
    check_lowering(f, make(()), -1, True)
    check_lowering(f, make((5, 6), torch.bfloat16), 1)


@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(op):
    f = getattr(aten, op).default
    check_lowering(f, make((3, 4)))
    check_lowering(f, WITH_NAN)
    check_lowering(f, WITH_NAN, 1)
    check_lowering(f, WITH_NAN, 0, True)
    check_lowering(f, WITH_NAN, None, True)
    check_lowering(f, make((2, 3, 4), torch.int64, -1, 1), -1)
    check_lowering(f, make((2, 3, 4), torch.int64, -1, 1), -2, True)
    check_lowering(f, make(()))
    check_lowering(f, make(()), 0, True)
    check_lowering(f, torch.tensor([1.0, 3.0, 3.0, -1.0, -1.0]))


# --- any / all -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all(op):
    f = getattr(aten, op)
    mostly_true = make((3, 4, 5), torch.int64, 0, 6).bool()
    for x in [make((3, 4, 5), torch.bool), mostly_true, make((3, 4, 5), torch.int64, -1, 1)]:
        check_lowering(f.default, x)
        check_lowering(f.dim, x, 1)
        check_lowering(f.dim, x, -1, True)
        check_lowering(f.dims, x)
        check_lowering(f.dims, x, [0, 2])
        check_lowering(f.dims, x, [-1], True)
        check_lowering(f.dims, x, [])
        check_lowering(f.dims, x, None, True)
    check_lowering(f.default, make((4,), torch.uint8, 0, 2))
    check_lowering(f.dim, make((3, 4), torch.uint8, 0, 1), 0)
    check_lowering(f.default, SPECIAL_FLOATS)
    check_lowering(f.default, torch.zeros(0, dtype=torch.bool))
    check_lowering(f.dim, make(()), 0)


SPECIAL_FLOATS = torch.tensor([NAN, 0.0, -0.0, INF])


# --- var / std -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["var", "std"])
@pytest.mark.parametrize("dim, keepdim", DIMS)
def test_var_std(op, dim, keepdim):
    f = getattr(aten, op).correction
    x = make((2, 3, 4), low=-2, high=5)
    check_lowering(f, x, as_list(dim), keepdim=keepdim)
    for correction in [0, 1, 2, 0.5]:
        check_lowering(f, x, as_list(dim), correction=correction, keepdim=keepdim)
    check_lowering(f, x.bfloat16(), as_list(dim), keepdim=keepdim, **BF16_TOL)
    check_lowering(f, x.double(), as_list(dim), keepdim=keepdim)


@pytest.mark.parametrize("op", ["var_mean", "std_mean"])
@pytest.mark.parametrize("dim, keepdim", DIMS)
def test_var_std_mean(op, dim, keepdim):
    f = getattr(aten, op).correction
    x = make((2, 3, 4), low=-2, high=5)
    check_lowering(f, x, as_list(dim), keepdim=keepdim)
    check_lowering(f, x, as_list(dim), correction=0, keepdim=keepdim)
    check_lowering(f, x, as_list(dim), correction=3, keepdim=keepdim)


@pytest.mark.parametrize("op", ["var", "std", "var_mean", "std_mean"])
def test_var_std_edges(op):
    f = getattr(aten, op).correction
    # Too few elements for the correction: PyTorch divides by max(N - correction, 0).
    check_lowering(f, make((1, 3)), [0])
    check_lowering(f, make((2, 3)), [0], correction=3)
    check_lowering(f, make(()))
    check_lowering(f, WITH_NAN, [1])
    check_lowering(f, make((3, 4)))


# --- logsumexp and norms ---------------------------------------------------------------------


def test_logsumexp():
    x = make((2, 3, 4), low=-50, high=50)
    check_lowering(aten.logsumexp.default, x, [1])
    check_lowering(aten.logsumexp.default, x, [-1], True)
    check_lowering(aten.logsumexp.default, x, [0, 2])
    check_lowering(aten.logsumexp.default, WITH_NAN, [1])
    rows = torch.tensor([[-INF, -INF], [INF, 1.0], [-INF, 2.0], [INF, INF], [1e30, 1e30]])
    check_lowering(aten.logsumexp.default, rows, [1])
    check_lowering(aten.logsumexp.default, make((3, 4), torch.int64), [1])
    check_lowering(aten.logsumexp.default, make(()), [0])
    check_lowering(aten.logsumexp.default, make((0, 3)), [0])  # empty: -inf, as eager
    check_lowering(aten.logsumexp.default, make((2, 0)), [1], True)
    check_lowering(aten.logsumexp.default, x.bfloat16(), [1], **BF16_TOL)


ORDS = [2, 1, 0, 3, 0.5, -1, -2, INF, -INF, 2.0]


@pytest.mark.parametrize("ord", ORDS)
def test_linalg_vector_norm(ord):
    f = aten.linalg_vector_norm.default
    x = make((2, 3, 4))
    x[0, 0, 0] = 0.0
    check_lowering(f, x, ord)
    check_lowering(f, x, ord, [1])
    check_lowering(f, x, ord, [-1, 0], True)
    check_lowering(f, x, ord, None, False, dtype=torch.float64)
    check_lowering(f, x.bfloat16(), ord, [2], **BF16_TOL)
    check_lowering(f, make(()), ord)
    if ord >= 0 and ord != INF:  # other orders have no identity: PyTorch raises on empty input
        check_lowering(f, torch.zeros(0, 3), ord, [0])


def test_linalg_vector_norm_defaults_and_nan():
    check_lowering(aten.linalg_vector_norm.default, make((3, 4)))
    for ord in [2, 1, INF, 0, 3]:
        check_lowering(aten.linalg_vector_norm.default, WITH_NAN, ord, [1])


@pytest.mark.parametrize("ord", [2, 1, 0, 3, INF, -INF])
def test_norm(ord):
    x = make((3, 4, 5))
    check_lowering(aten.norm.Scalar, x, ord)
    check_lowering(aten.norm.ScalarOpt_dim, x, ord, [1])
    check_lowering(aten.norm.ScalarOpt_dim, x, ord, [-1, 0], True)
    check_lowering(aten.norm.ScalarOpt_dtype, x, ord, dtype=torch.float64)
    check_lowering(aten.norm.ScalarOpt_dim_dtype, x, ord, [2], False, dtype=torch.float64)


def test_norm_defaults():
    x = make((3, 4))
    check_lowering(aten.norm.Scalar, x)
    check_lowering(aten.norm.ScalarOpt_dim, x, None, [1])
    check_lowering(aten.norm.ScalarOpt_dtype, x, None, dtype=torch.float64)


# --- scans -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_cumsum_cumprod(op):
    f = getattr(aten, op).default
    x = make((3, 4, 5), low=0.5, high=1.5)
    for dim in [0, 1, 2, -1, -3]:
        check_lowering(f, x, dim)
    check_lowering(f, make((3, 4), torch.int64, -3, 3), 1)
    check_lowering(f, make((3, 4), torch.int32, -3, 3), 0)
    check_lowering(f, make((3, 4), torch.bool), 1)
    check_lowering(f, make((3, 4), torch.uint8, 0, 3), 1)
    check_lowering(f, x, 1, dtype=torch.float64)
    check_lowering(f, make((3, 4), torch.int64), 1, dtype=torch.float32)
    check_lowering(f, make(()), 0)
    check_lowering(f, make(()), -1)
    check_lowering(f, WITH_NAN, 1)
    check_lowering(f, x.bfloat16(), 2, **BF16_TOL)


# --- softmax ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["_softmax", "_log_softmax"])
def test_softmax(op):
    f = getattr(aten, op).default
    x = make((2, 3, 4), low=-10, high=10)
    for dim in [0, 1, 2, -1]:
        check_lowering(f, x, dim, False)
    rows = torch.tensor([[-INF, -INF, -INF], [-INF, 0.0, 1.0], [INF, 1.0, 2.0], [NAN, 1.0, 2.0]])
    check_lowering(f, rows, 1, False)
    check_lowering(f, torch.tensor([[1e30, -1e30, 0.0]]), -1, False)
    check_lowering(f, make(()), 0, False)
    check_lowering(f, x.double(), 1, False)
    check_lowering(f, x.bfloat16(), -1, False, **BF16_TOL)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_backward_data(dim):
    x, g = make((3, 4, 5)), make((3, 4, 5), seed=1)
    y = torch.softmax(x, dim)
    check_lowering(aten._softmax_backward_data.default, g, y, dim, torch.float32)
    log_y = torch.log_softmax(x, dim)
    check_lowering(aten._log_softmax_backward_data.default, g, log_y, dim, torch.float32)


def test_softmax_backward_data_bfloat16():
    x, g = make((4, 6), torch.bfloat16), make((4, 6), torch.bfloat16, seed=1)
    y = torch.softmax(x, -1)
    check_lowering(aten._softmax_backward_data.default, g, y, -1, torch.bfloat16, **BF16_TOL)
    log_y = torch.log_softmax(x, -1)
    check_lowering(
        aten._log_softmax_backward_data.default, g, log_y, -1, torch.bfloat16, **BF16_TOL
    )
    s = torch.softmax(make(()), 0)
    check_lowering(aten._softmax_backward_data.default, make(()), s, 0, torch.float32)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.int32, torch.int64, torch.bool]
)
@pytest.mark.parametrize("dim, keepdim", [((), False), ((1,), True), ((0, 2), False)])
def test_hash_tensor(dtype, dim, keepdim):
    x = make((3, 4, 2), dtype, low=-5, high=5)
    check_lowering(aten.hash_tensor.default, x, list(dim), keepdim=keepdim, atol=0, rtol=0)
