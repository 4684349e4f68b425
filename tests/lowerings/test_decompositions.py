"""Tests for lowerings/decompositions.py and lazy_torch/meta_kernels.py against eager CPU PyTorch."""

import pytest
import torch

import lazy_torch
from tests.lowerings.util import run_lowering

aten = torch.ops.aten

_TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.complex64: {"atol": 1e-5, "rtol": 1e-5},
    torch.complex128: {"atol": 1e-12, "rtol": 1e-12},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _symmetric(*shape, dtype=torch.float64, hermitian=False):
    a = torch.randn(*shape, dtype=dtype)
    return a + (a.mH if hermitian else a.mT)


# ------------------------------------------------------------------------------------------ eig


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("shape", [(5, 5), (2, 4, 4), (1, 1), (0, 0), (2, 0, 0)])
def test_eig_matches_geev_order_and_normalization(dtype, shape):
    # Both sides run LAPACK's geev: same eigenvalue order, unit-norm eigenvectors whose largest
    # component is real. Compared directly, not up to phase.
    a = torch.randn(*shape, dtype=dtype)
    (w_e, v_e), (w, v) = run_lowering(aten.linalg_eig.default, a)
    assert (w.dtype, v.dtype, w.shape, v.shape) == (w_e.dtype, v_e.dtype, w_e.shape, v_e.shape)
    tol = _TOL[dtype] if dtype != torch.float32 else {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(w, w_e, **tol)
    torch.testing.assert_close(v, v_e, **tol)


def test_eigvals():
    a = torch.randn(3, 5, 5)
    expected, (got,) = run_lowering(aten._linalg_eigvals.default, a)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------ LDL


_LDL_CASES = [
    (torch.float64, False),
    (torch.float32, False),
    (torch.complex128, False),
    (torch.complex128, True),
]


@pytest.mark.parametrize("dtype,hermitian", _LDL_CASES)
@pytest.mark.parametrize("shape", [(5, 5), (3, 6, 6), (1, 1), (2, 2), (9, 9), (0, 0), (0, 2, 2)])
def test_ldl_factor_pivots_exact(dtype, hermitian, shape):
    # Indefinite matrices take both 1x1 and 2x2 Bunch-Kaufman pivots.
    a = _symmetric(*shape, dtype=dtype, hermitian=hermitian)
    (ld_e, piv_e, info_e), (ld, piv, info) = run_lowering(
        aten.linalg_ldl_factor_ex.default, a, hermitian=hermitian
    )
    assert torch.equal(piv, piv_e) and piv.dtype == torch.int32
    assert torch.equal(info, info_e)
    torch.testing.assert_close(ld, ld_e, **_TOL[dtype])


def test_ldl_factor_takes_two_by_two_pivots():
    a = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 0.0]], dtype=torch.float64)
    (_, piv_e, _), (_, piv, _) = run_lowering(aten.linalg_ldl_factor_ex.default, a)
    assert (piv_e < 0).any()
    assert torch.equal(piv, piv_e)


def test_ldl_factor_singular_sets_info_and_continues():
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[0, 0], a[3, 3] = 1.0, 2.0
    (ld_e, piv_e, info_e), (ld, piv, info) = run_lowering(aten.linalg_ldl_factor_ex.default, a)
    assert info.item() == info_e.item() == 2
    assert torch.equal(piv, piv_e)
    torch.testing.assert_close(ld, ld_e)


@pytest.mark.parametrize("dtype,hermitian", _LDL_CASES)
@pytest.mark.parametrize(
    "a_shape,b_shape", [((5, 5), (5, 3)), ((2, 6, 6), (6, 2)), ((0, 0), (0, 2))]
)
def test_ldl_solve(dtype, hermitian, a_shape, b_shape):
    a = _symmetric(*a_shape, dtype=dtype, hermitian=hermitian)
    ld, pivots, _ = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    b = torch.randn(*b_shape, dtype=dtype)
    expected, (got,) = run_lowering(
        aten.linalg_ldl_solve.default, ld, pivots, b, hermitian=hermitian
    )
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, **_TOL[dtype])


# ------------------------------------------------------------------------------- meta kernels


def _fallbacks():
    return {k for k, v in lazy_torch.metrics.counters().items() if k.startswith("fallback::")}


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss", None])
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [((2, 3, 5), (2, 3, 2)), ((4, 4), (4,)), ((1, 3, 4), (2, 3, 2)), ((5, 3), (5, 2))],
)
def test_lstsq_on_lazy_is_lowered_with_eager_shapes_and_strides(driver, a_shape, b_shape):
    a, b = torch.randn(*a_shape) + 3 * torch.eye(*a_shape[-2:]), torch.randn(*b_shape)
    expected = torch.linalg.lstsq(a, b, driver=driver)
    tall = a_shape[-2] > a_shape[-1] and driver in ("gelsd", "gelss")
    before = _fallbacks()
    got = torch.linalg.lstsq(a.to("lazy"), b.to("lazy"), driver=driver)
    for g, e in zip(got, expected):
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype)
        torch.testing.assert_close(g.cpu(), e, atol=1e-4, rtol=1e-4)
    # Tall gelsd/gelss residuals exist only at full rank (a size that depends on values).
    assert (_fallbacks() - before == {"fallback::aten.linalg_lstsq.default"}) == tall


def test_lstsq_rank_deficient_tall_gelsd_has_no_residuals():
    a = torch.randn(5, 2, dtype=torch.float64) @ torch.randn(2, 3, dtype=torch.float64)
    b = torch.randn(5, 2, dtype=torch.float64)
    expected = torch.linalg.lstsq(a, b, driver="gelsd")
    got = torch.linalg.lstsq(a.to("lazy"), b.to("lazy"), driver="gelsd")
    assert got.residuals.shape == expected.residuals.shape == (0,)
    torch.testing.assert_close(got.solution.cpu(), expected.solution)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (0, 3)])
def test_geqrf_on_lazy_is_lowered_with_eager_strides(shape):
    a = torch.randn(*shape)
    before = _fallbacks()
    got = torch.geqrf(a.to("lazy"))
    assert _fallbacks() == before
    for g, e in zip(got, torch.geqrf(a)):
        assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype)
        torch.testing.assert_close(g.cpu(), e, atol=1e-4, rtol=1e-4)
