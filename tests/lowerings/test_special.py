"""Tests for lowerings/special.py: every lowering against eager CPU PyTorch."""

from __future__ import annotations

import math

import pytest
import torch

import lazy_torch
from tests.lowerings.util import check_lowering, make

aten, prims = torch.ops.aten, torch.ops.prims
NAN, INF = math.nan, math.inf
# The float32 tolerance of the OpInfo sweep.
TOL = {"atol": 1e-4, "rtol": 1.3e-4}
FLOATS = (torch.float32, torch.float64)

# Special values and the branch points of PyTorch's kernels (2.09 for Airy, 5 for J/Y, 2 and 8
# for I/K, 0.5 for the spherical j0, 103.892 where Ai underflows).
SPECIAL = torch.tensor(
    [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.5, 3.5, 1e-30, 1e30, 88.0, -88.0]
    + [1e-6, 2.09, -2.09, 4.99, 5.01, 7.9, 8.1, 8.4, -10.3, 25.0, 100.0, 104.0, 1e4]
)
GRID = torch.linspace(-12, 30, 211)


def pairs(values):
    """Every (a, b) pair of ``values``, as two flat tensors."""
    values = torch.tensor(values)
    return values.repeat_interleave(len(values)), values.repeat(len(values))


# --- unary special functions -----------------------------------------------------------------

UNARY = [
    aten.special_airy_ai.default,
    aten.special_bessel_j0.default,
    aten.special_bessel_j1.default,
    aten.special_bessel_y0.default,
    aten.special_bessel_y1.default,
    aten.special_modified_bessel_i0.default,
    aten.special_modified_bessel_i1.default,
    aten.special_modified_bessel_k0.default,
    aten.special_modified_bessel_k1.default,
    aten.special_scaled_modified_bessel_k0.default,
    aten.special_scaled_modified_bessel_k1.default,
    aten.special_spherical_bessel_j0.default,
    aten.i0.default,
    aten.special_i0e.default,
    aten.special_i1.default,
    aten.special_i1e.default,
    prims.bessel_i0.default,
    prims.bessel_i0e.default,
    prims.bessel_i1.default,
    prims.bessel_i1e.default,
    prims.bessel_j0.default,
    prims.bessel_j1.default,
    prims.spherical_bessel_j0.default,
    prims.erfcx.default,
]


@pytest.mark.parametrize("op", UNARY, ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary(op, dtype):
    check_lowering(op, SPECIAL.to(dtype), **TOL)
    check_lowering(op, GRID.to(dtype), **TOL)


@pytest.mark.parametrize("op", [op for op in UNARY if op.namespace == "aten"], ids=str)
def test_unary_promotes_integers(op):
    check_lowering(op, make((3, 5), torch.int64, -9, 9), **TOL)
    check_lowering(op, make((3, 5), torch.bool), **TOL)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_erfcx_where_erfc_underflows(dtype):
    # jax.scipy.special.erfcx returns 0 around x = 9.3 (float32) and 26.6 (float64).
    check_lowering(prims.erfcx.default, torch.linspace(-30, 60, 901, dtype=dtype), **TOL)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_ndtri(dtype):
    x = torch.cat([torch.linspace(0, 1, 201), torch.tensor([NAN, -0.5, 1.5, 1e-30])])
    check_lowering(prims.ndtri.default, x.to(dtype), **TOL)


# --- gamma family ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(6))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_polygamma(n, dtype):
    check_lowering(aten.polygamma.default, n, SPECIAL.to(dtype), **TOL)
    # Poles, and negative half-integers where zeta cancels (PyTorch sums it in double: float32
    # alone misses by 1e-4).
    check_lowering(aten.polygamma.default, n, torch.arange(-12.5, 30, 0.25, dtype=dtype), **TOL)


def test_bfloat16():
    # The few of these that eager CPU supports in bfloat16; they compute in float32.
    x = make((4, 5), torch.bfloat16, 0.1, 10)
    for op in (aten.i0.default, aten.special_i0e.default, aten.special_i1e.default):
        check_lowering(op, x, atol=1e-2, rtol=1.6e-2)
    check_lowering(prims.igamma.default, x, x.flip(0), atol=1e-2, rtol=1.6e-2)
    check_lowering(aten.polygamma.default, 2, x, atol=1e-2, rtol=1.6e-2)


def test_polygamma_promotes_integers():
    check_lowering(aten.polygamma.default, 2, make((3, 5), torch.int64, -3, 9), **TOL)
    check_lowering(aten.polygamma.default, 1, make((3, 5), torch.bool), **TOL)


ZETA_VALUES = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.5, 1e-30, 1e30, 88.0, 2.0]
ZETA_VALUES += [-3.0, 0.1, 25.0, 7.3, -7.3, -0.7, -100.25, 1e3, 1e10, 1e13, 1e15, 1.5, 0.9]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_zeta(dtype):
    x, q = pairs(ZETA_VALUES)
    check_lowering(prims.zeta.default, x.to(dtype), q.to(dtype), **TOL)


IGAMMA_VALUES = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, 3.5, 1e-30, 1e30, 88.0, 2.0, 10.0]
IGAMMA_VALUES += [0.1, 25.0, 1e-5, 7.3, 100.0, 250.0, 1e4, -0.7]


@pytest.mark.parametrize("op", [prims.igamma.default, prims.igammac.default], ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_igamma(op, dtype):
    a, x = pairs(IGAMMA_VALUES)
    check_lowering(op, a.to(dtype), x.to(dtype), **TOL)
    check_lowering(op, make((40,), dtype, 0, 30, seed=1), make((40,), dtype, 0, 40, seed=2), **TOL)


@pytest.mark.parametrize("op", [prims.igamma.default, prims.igammac.default], ids=str)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_igamma_large_a_near_x(op, dtype):
    # XLA's series lose float32 accuracy here, and never end (float64) once a + 1 == a.
    g = torch.Generator().manual_seed(0)
    a = torch.exp(torch.rand(2000, generator=g, dtype=torch.float64) * math.log(1e7))
    x = (a * (1 + torch.randn(2000, generator=g, dtype=torch.float64) * 6 / a.sqrt())).abs()
    a, x = torch.cat([a, torch.tensor([1e20, 1e30])]), torch.cat([x, torch.tensor([1e20, 1e30])])
    check_lowering(op, a.to(dtype), x.to(dtype), **TOL)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_nextafter(dtype):
    a, b = pairs([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 1e-30, 3e38])
    check_lowering(prims.nextafter.default, a.to(dtype), b.to(dtype), atol=0, rtol=0)


# --- orthogonal polynomials ------------------------------------------------------------------

POLYNOMIALS = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]
# No NaN x: most of PyTorch's loops then return an uninitialized variable (garbage).
POLY_X = torch.tensor([INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 0.3, -0.7, 0.999, 1.5, -2.5])
POLY_X = torch.cat([POLY_X, torch.tensor([3.0, 1e-3, 0.25, 0.75, 1e10])])
# Degrees around the switches to closed forms (4, 6, 8) and Hermite's limits (128, 512).
POLY_N = torch.tensor([-3, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 20, 30, 100, 129, 513])


@pytest.mark.parametrize("name", POLYNOMIALS)
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_polynomial(name, dtype):
    op = getattr(aten, f"special_{name}")
    x = POLY_X.to(dtype).repeat_interleave(len(POLY_N))
    check_lowering(op.default, x, POLY_N.repeat(len(POLY_X)), **TOL)
    # Float degrees truncate; NaN, infinities and values past int64 read as negative.
    n = torch.tensor([NAN, INF, -INF, 2.7, -0.5, 0.9, 5.5, 1e20, 1e19], dtype=dtype)
    check_lowering(op.default, POLY_X.to(dtype).reshape(-1, 1), n, **TOL)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_overloads(name):
    op = getattr(aten, f"special_{name}")
    check_lowering(op.x_scalar, 0.3, POLY_N, **TOL)
    check_lowering(op.n_scalar, POLY_X, 7, **TOL)
    check_lowering(op.n_scalar, torch.arange(-3, 4), 3, **TOL)
    check_lowering(op.default, torch.tensor([0, 1, 2, -1, 3]), POLY_N[:5], **TOL)
    check_lowering(op.default, torch.tensor([True, False, True]), torch.tensor([1, 1, 0]), **TOL)


def test_scalar_overloads_run_on_the_lazy_device():
    # x_scalar and n_scalar reach dispatch as themselves (CompositeExplicitAutograd).
    x = torch.linspace(-1, 1, 7)
    n = torch.arange(7)
    lazy_torch.metrics.reset()
    got = torch.special.chebyshev_polynomial_t(x.to("lazy"), 5).cpu()
    got_n = torch.special.legendre_polynomial_p(0.5, n.to("lazy")).cpu()
    got_gamma = torch.polygamma(3, x.to("lazy")).cpu()
    assert not [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]
    torch.testing.assert_close(got, torch.special.chebyshev_polynomial_t(x, 5), **TOL)
    torch.testing.assert_close(got_n, torch.special.legendre_polynomial_p(0.5, n), **TOL)
    torch.testing.assert_close(got_gamma, torch.polygamma(3, x), equal_nan=True, **TOL)


# --- angle, frexp ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int64, torch.complex64], ids=str)
def test_angle(dtype):
    check_lowering(aten.angle.default, SPECIAL.to(dtype), **TOL)
    check_lowering(aten.angle.default, torch.tensor([True, False]))


@pytest.mark.parametrize("dtype", [*FLOATS, torch.bfloat16], ids=str)
def test_frexp(dtype):
    # Subnormals included: XLA's arithmetic flushes them to zero, so the bits are read directly.
    x = torch.cat([SPECIAL, torch.tensor([1e-40, -1e-44, 1.17549435e-38, 3e38, -7.0])])
    if dtype == torch.float64:
        x = torch.cat([x.double(), torch.tensor([1e-310, -4.9e-324, 1e300], dtype=dtype)])
    check_lowering(prims.frexp.default, x.to(dtype), atol=0, rtol=0)


# --- integer prims ---------------------------------------------------------------------------

INT64_MIN = -(2**63)
LEFT = [0, 1, -1, 12, -18, 2**63 - 1, INT64_MIN, 7, 0, INT64_MIN, 5, -9]
RIGHT = [0, 0, 4, -8, 12, 3, 6, INT64_MIN, INT64_MIN, 0, INT64_MIN, 6]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8], ids=str)
def test_gcd_and_div(dtype):
    a, b = torch.tensor(LEFT).to(dtype), torch.tensor(RIGHT).to(dtype)
    check_lowering(prims.gcd.default, a, b)
    # Integer division truncates toward zero (C's division).
    check_lowering(prims.div.default, a, torch.where(b == 0, 3, b).to(dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_div_float_is_true_division(dtype):
    check_lowering(prims.div.default, SPECIAL.to(dtype), SPECIAL.flip(0).to(dtype))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8], ids=str)
def test_shifts(dtype):
    bits = torch.iinfo(dtype).bits
    a = torch.tensor([1, -1, 100, 127, 5, 3, -128, 0, 77, -77])
    # Negative and too-large shift amounts: zero to the left, sign fill to the right.
    b = torch.tensor([0, 1, bits - 1, bits, -1, 100, 7, 3, bits + 1, 2])
    a, b = a.to(dtype), b.to(dtype)
    check_lowering(prims.shift_left.default, a, b)
    check_lowering(prims.shift_right_arithmetic.default, a, b)
