"""Tests for lowerings/linalg_solvers.py against eager CPU PyTorch."""

import jax
import pytest
import torch

from lowerings import LOWERINGS, LoweringContext
from tests.lowerings.util import check_lowering, run_lowering, to_jax, to_torch

aten = torch.ops.aten

# Real and complex; float64 where exactness matters more than coverage.
_DTYPES = [torch.float32, torch.complex64]
# The same LAPACK algorithms, rounded differently by MKL (eager) and XLA's LAPACK.
_TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
    torch.complex64: {"atol": 1e-4, "rtol": 1e-4},
    torch.complex128: {"atol": 1e-10, "rtol": 1e-10},
}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def _well_conditioned(*shape, dtype=torch.float32):
    """Random matrices whose condition number stays small: A + min(m, n) I."""
    eye = torch.eye(shape[-2], shape[-1], dtype=dtype)
    return _rand(*shape, dtype=dtype) + min(shape[-2:]) * eye


def _hermitian_pd(*shape, dtype=torch.float32):
    a = _rand(*shape, dtype=dtype)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _close(got, expected, dtype):
    torch.testing.assert_close(got, expected, **_TOL[dtype])


def _assert_columns_match_up_to_phase(got, expected, dtype):
    """Columns of ``got`` equal those of ``expected`` times a unit scalar each."""
    phase = (expected.conj() * got).sum(-2, keepdim=True)
    phase = phase / phase.abs().clamp_min(1e-30)
    _close(got, expected * phase, dtype)


def _lower_only(name, shapes, dtypes, *args, **kwargs):
    """Run a lowering alone, for inputs eager CPU PyTorch rejects or gets wrong."""
    ctx = LoweringContext(shapes=shapes, dtypes=dtypes)
    out = jax.jit(lambda *a: LOWERINGS[name](ctx, *a, **kwargs))(*(to_jax(a) for a in args))
    return tuple(to_torch(o) for o in out) if isinstance(out, (tuple, list)) else to_torch(out)


# ------------------------------------------------------------------------------------- SVD, eigh


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (0, 0), (3, 0), (2, 0, 3)])
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd(dtype, shape, full_matrices):
    # Singular vectors are defined up to one phase per singular triplet (MKL and the reference
    # LAPACK pick differently): compare them up to phase and check the reconstruction.
    a = _rand(*shape, dtype=dtype)
    (u_e, s_e, vh_e), (u, s, vh) = run_lowering(aten._linalg_svd.default, a, full_matrices)
    assert (u.shape, s.shape, vh.shape) == (u_e.shape, s_e.shape, vh_e.shape)
    assert (u.dtype, s.dtype, vh.dtype) == (u_e.dtype, s_e.dtype, vh_e.dtype)
    _close(s, s_e, dtype)
    k = s.shape[-1]
    _assert_columns_match_up_to_phase(u[..., :k], u_e[..., :k], dtype)
    _assert_columns_match_up_to_phase(vh[..., :k, :].mH, vh_e[..., :k, :].mH, dtype)
    _close(u[..., :k] * s.to(dtype).unsqueeze(-2) @ vh[..., :k, :], a, dtype)
    for q in (u, vh.mH):
        _close(q.mH @ q, torch.eye(q.shape[-1], dtype=dtype).expand(q.mH.shape[:-1] + (-1,)), dtype)


def test_svd_without_vectors():
    check_lowering(aten._linalg_svd.default, _rand(2, 5, 3), False, False, atol=1e-5)


@pytest.mark.parametrize("dtype", [*_DTYPES, torch.float64])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(dtype, uplo):
    a = _rand(3, 5, 5, dtype=dtype)  # not Hermitian: only the UPLO triangle counts
    (w_e, v_e), (w, v) = run_lowering(aten._linalg_eigh.default, a, uplo)
    assert v.dtype == v_e.dtype and w.dtype == w_e.dtype
    _close(w, w_e, dtype)
    _assert_columns_match_up_to_phase(v, v_e, dtype)


def test_eigh_without_vectors():
    check_lowering(aten._linalg_eigh.default, _rand(2, 4, 4), "U", False, atol=1e-5)


# ----------------------------------------------------------------------------- QR, Householder


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (0, 3), (3, 0)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_householder_signs(dtype, shape, mode):
    check_lowering(aten.linalg_qr.default, _rand(*shape, dtype=dtype), mode, **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_geqrf(dtype, shape):
    check_lowering(aten.geqrf.default, _rand(*shape, dtype=dtype), **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape,k", [((5, 3), 3), ((5, 3), 2), ((2, 4, 4), 4)])
def test_householder_product(dtype, shape, k):
    a, tau = _rand(*shape, dtype=dtype), _rand(*shape[:-2], k, dtype=dtype)
    check_lowering(aten.linalg_householder_product.default, a, tau, **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_ormqr(dtype, left, transpose):
    a, tau = torch.geqrf(_rand(2, 5, 3, dtype=dtype))
    other = _rand(2, 5, 4, dtype=dtype) if left else _rand(2, 4, 5, dtype=dtype)
    check_lowering(aten.ormqr.default, a, tau, other, left, transpose, **_TOL[dtype])


# -------------------------------------------------------------------------------------------- LU


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 3, 4, 4), (0, 0)])
def test_lu_factor_ex(dtype, shape):
    check_lowering(aten.linalg_lu_factor_ex.default, _rand(*shape, dtype=dtype), **_TOL[dtype])


def test_lu_factor_ex_info_names_the_first_zero_pivot():
    a = torch.tensor([[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 1.0, 1.0]], [[2.0, 0, 0]] * 3])
    expected, got = run_lowering(aten.linalg_lu_factor_ex.default, a)
    assert got[2].tolist() == expected[2].tolist() == [3, 2]


def test_lu_without_pivoting_reconstructs():
    # Eager CPU PyTorch refuses pivot=False (CUDA only), so check A = L U instead.
    a = _well_conditioned(2, 5, 3, dtype=torch.float64)
    lu, pivots, info = _lower_only(
        "aten.linalg_lu_factor_ex.default",
        ((2, 5, 3), (2, 3), (2,)),
        ("float64", "int32", "int32"),
        a,
        pivot=False,
    )
    lower = lu.tril(-1) + torch.eye(5, 3, dtype=a.dtype)
    torch.testing.assert_close(lower @ lu.triu()[..., :3, :], a)
    assert pivots.tolist() == [[1, 2, 3]] * 2 and info.tolist() == [0, 0]


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 4)])
def test_linalg_lu(dtype, shape):
    check_lowering(aten.linalg_lu.default, _rand(*shape, dtype=dtype), **_TOL[dtype])


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 4)])
@pytest.mark.parametrize("unpack_data,unpack_pivots", [(True, True), (False, True), (True, False)])
def test_lu_unpack(shape, unpack_data, unpack_pivots):
    lu, pivots = torch.linalg.lu_factor(_rand(*shape))
    check_lowering(aten.lu_unpack.default, lu, pivots, unpack_data, unpack_pivots)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
def test_lu_solve_broadcasts(dtype, left, adjoint):
    lu, pivots = torch.linalg.lu_factor(_well_conditioned(2, 4, 4, dtype=dtype))
    b = _rand(3, 1, 4, 2, dtype=dtype) if left else _rand(3, 1, 2, 4, dtype=dtype)
    check_lowering(
        aten.linalg_lu_solve.default, lu, pivots, b, left=left, adjoint=adjoint, **_TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [*_DTYPES, torch.float64])
@pytest.mark.parametrize(
    "a_shape,b_shape,left",
    [
        ((4, 4), (4, 2), True),
        ((4, 4), (3, 4), False),
        ((2, 4, 4), (4,), True),
        ((2, 4, 4), (2, 4), True),
        ((3, 1, 4, 4), (2, 4, 5), True),
    ],
)
def test_solve_ex(dtype, a_shape, b_shape, left):
    # Also the LU and pivots of A PyTorch returns for the backward.
    a, b = _well_conditioned(*a_shape, dtype=dtype), _rand(*b_shape, dtype=dtype)
    check_lowering(aten._linalg_solve_ex.default, a, b, left=left, **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
def test_inv_ex(dtype):
    a = _well_conditioned(3, 4, 4, dtype=dtype)
    check_lowering(aten.linalg_inv_ex.default, a, **_TOL[dtype])


def test_inv_ex_info_of_singular_matrix():
    # A nonzero info is what lets the eager _linalg_check_errors raise eager's error.
    expected, got = run_lowering(
        aten.linalg_inv_ex.default, torch.stack([torch.eye(3)] + [torch.ones(3, 3)])
    )
    assert got[1].tolist() == expected[1].tolist() == [0, 2]


@pytest.mark.parametrize("dtype", [*_DTYPES, torch.float64])
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 3), (0, 0)])
@pytest.mark.parametrize("op", [aten._linalg_det.default, aten._linalg_slogdet.default])
def test_det_slogdet(dtype, shape, op):
    # The LU returned for the backward is of A^T for real A, of A for complex A, as in PyTorch.
    check_lowering(op, _rand(*shape, dtype=dtype), **_TOL[dtype])


@pytest.mark.parametrize("op", [aten._linalg_det.default, aten._linalg_slogdet.default])
def test_det_slogdet_singular(op):
    check_lowering(op, torch.tensor([[1.0, 2.0], [2.0, 4.0]], dtype=torch.float64))


# -------------------------------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_reads_one_triangle(dtype, upper):
    a = _hermitian_pd(2, 4, 4, dtype=dtype)
    a = a.triu() + _rand(4, 4, dtype=dtype).tril(-1) if upper else a.tril() + 5 * a.triu(1)
    check_lowering(aten.linalg_cholesky_ex.default, a, upper=upper, **_TOL[dtype])
    check_lowering(aten.cholesky.default, a, upper, **_TOL[dtype])


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex_info_names_the_first_bad_minor(upper):
    good = _hermitian_pd(4, 4, dtype=torch.float64)
    bad = good.clone()
    bad[2, 2] = -10.0
    a = torch.stack([good, bad])
    expected, (factor, info) = run_lowering(aten.linalg_cholesky_ex.default, a, upper=upper)
    assert info.tolist() == expected[1].tolist() == [0, 3]
    torch.testing.assert_close(factor[0], expected[0][0])


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(dtype, upper):
    factor = torch.linalg.cholesky(_hermitian_pd(2, 4, 4, dtype=dtype), upper=upper)
    b = _rand(3, 1, 4, 2, dtype=dtype)
    check_lowering(aten.cholesky_solve.default, b, factor, upper, **_TOL[dtype])
    check_lowering(aten.cholesky_inverse.default, factor, upper, **_TOL[dtype])


# ------------------------------------------------------------------------------ triangular solve


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unitriangular", [True, False])
def test_solve_triangular_ignores_other_triangle(dtype, upper, left, unitriangular):
    a = _rand(2, 1, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    b = _rand(3, 4, 2, dtype=dtype) if left else _rand(3, 2, 4, dtype=dtype)
    kwargs = {"upper": upper, "left": left, "unitriangular": unitriangular}
    check_lowering(aten.linalg_solve_triangular.default, a, b, **kwargs, **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_triangular_solve(dtype, upper, transpose):
    a = _rand(2, 1, 4, 4, dtype=dtype) + 4 * torch.eye(4, dtype=dtype)
    b = _rand(3, 4, 2, dtype=dtype)
    check_lowering(aten.triangular_solve.default, b, a, upper, transpose, **_TOL[dtype])


# ---------------------------------------------------------------------------- matrix_exp, pinv


@pytest.mark.parametrize("dtype", [*_DTYPES, torch.float64, torch.complex128])
@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (0, 0)])
def test_matrix_exp(dtype, shape):
    check_lowering(aten.linalg_matrix_exp.default, _rand(*shape, dtype=dtype), **_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matrix_exp_picks_the_degree_per_matrix(dtype):
    # One matrix per Taylor degree (1, 2, 4, 8, 12) and some scaled and squared (18).
    scales = [1e-17, 1e-9, 1e-5, 1e-3, 0.03, 0.2, 0.5, 1.0, 3.0, 20.0]
    a = _rand(len(scales), 4, 4, dtype=dtype) * torch.tensor(scales, dtype=dtype)[:, None, None]
    expected, (got,) = run_lowering(aten.linalg_matrix_exp.default, a)
    rtol = 1e-5 if dtype == torch.float32 else 1e-11
    torch.testing.assert_close(got, expected, rtol=rtol, atol=0)


def test_matrix_exp_large_norm_float32_matches_eager_rounding():
    # Four squarings of a degree-18 approximant amplify every rounding: eager's small-matrix bmm
    # adds products one at a time (no fused multiply-add), and so must the lowering, else an
    # entry that cancels to 0.15 among entries of 300 lands 2e-4 away (OpInfo's sample).
    a = torch.empty(5, 5, 5).uniform_(-9, 9)
    expected, (got,) = run_lowering(aten.linalg_matrix_exp.default, a)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_matrix_exp_nan_matrix_stays_nan_and_spares_its_batch():
    a = _rand(2, 4, 4) * 5
    a[0, 1, 1] = float("nan")
    expected, (got,) = run_lowering(aten.linalg_matrix_exp.default, a)
    assert got[0].isnan().all()
    torch.testing.assert_close(got[1], expected[1], **_TOL[torch.float32])


def test_matrix_exp_bfloat16_is_computed_in_float32():
    # Eager CPU PyTorch's bfloat16 matrix_exp returns inf/NaN; compare with its float32 result.
    a = _rand(3, 3).to(torch.bfloat16)
    got = _lower_only("aten.linalg_matrix_exp.default", ((3, 3),), ("bfloat16",), a)
    assert got.dtype == torch.bfloat16
    expected = torch.linalg.matrix_exp(a.float()).bfloat16()
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (0, 3)])
def test_pinv(dtype, shape):
    check_lowering(aten.linalg_pinv.atol_rtol_tensor, _rand(*shape, dtype=dtype), **_TOL[dtype])


@pytest.mark.parametrize("dtype", _DTYPES)
def test_pinv_hermitian(dtype):
    a = _rand(2, 4, 4, dtype=dtype)
    pinv = aten.linalg_pinv.atol_rtol_tensor
    check_lowering(pinv, a + a.mH, hermitian=True, **_TOL[dtype])


@pytest.mark.parametrize("hermitian", [False, True])
@pytest.mark.parametrize(
    "tolerances",
    [{}, {"atol": 0.01}, {"rtol": [0.1]}, {"atol": 0.0, "rtol": 1e-4}, {"atol": [0.5, 1e-6]}],
)
def test_pinv_tolerances_drop_small_singular_values(hermitian, tolerances):
    u = torch.linalg.qr(_rand(2, 5, 5, dtype=torch.float64)).Q
    a = u * torch.tensor([4.0, 2.0, 1.0, 1e-3, 0.0], dtype=torch.float64) @ u.mT
    kwargs = {k: torch.tensor(v, dtype=torch.float64) for k, v in tolerances.items()}
    pinv = aten.linalg_pinv.atol_rtol_tensor
    # Through run_lowering: check_lowering's own atol/rtol would take the op's.
    expected, (got,) = run_lowering(pinv, a, hermitian=hermitian, **kwargs)
    torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------------------------------- lstsq


@pytest.mark.parametrize(
    "dtype,driver",
    [(torch.float64, d) for d in (None, "gels", "gelsy", "gelsd", "gelss")]
    + [(torch.complex64, "gelsd")],
)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((5, 3), (5, 2)),
        ((3, 3), (3, 2)),
        ((2, 3, 5), (2, 3, 4)),
        ((2, 5, 3), (2, 5)),
        ((5, 3), (5,)),
    ],
)
def test_lstsq_full_rank(dtype, driver, a_shape, b_shape):
    # Solution, and residuals/rank/singular values as the driver fills them.
    a, b = _well_conditioned(*a_shape, dtype=dtype), _rand(*b_shape, dtype=dtype)
    check_lowering(aten.linalg_lstsq.default, a, b, driver=driver, **_TOL[dtype])


@pytest.mark.parametrize("a_batch,b_batch", [((1,), (4,)), ((4,), (1,))])
def test_lstsq_broadcasts_batches(a_batch, b_batch):
    a, b = _well_conditioned(*a_batch, 5, 3), _rand(*b_batch, 5, 2)
    check_lowering(aten.linalg_lstsq.default, a, b, driver="gelsd", **_TOL[torch.float32])


def test_lstsq_rank_deficient_gelsd_is_minimum_norm():
    a = _rand(5, 3, dtype=torch.float64)
    a[:, 2] = a[:, 1]
    expected, got = run_lowering(
        aten.linalg_lstsq.default, a, _rand(5, 2, dtype=torch.float64), driver="gelsd"
    )
    torch.testing.assert_close(got[0], expected[0])
    assert got[2].item() == expected[2].item() == 2
    torch.testing.assert_close(got[3], expected[3])


# ------------------------------------------------------------------------------------ distances


_PS = [0.0, 1.0, 2.0, 3.0, 0.5, 1.5, 2.5, float("inf")]
_PAIRS = [((5, 3), (4, 3)), ((2, 1, 4, 3), (3, 5, 3)), ((0, 3), (4, 3)), ((4, 3), (0, 3))]


def _distance_inputs(shape1, shape2):
    """Random rows, with a repeated row (distance 0) and a repeated coordinate (difference 0)."""
    x1, x2 = _rand(*shape1, dtype=torch.float64), _rand(*shape2, dtype=torch.float64)
    if x1.dim() == x2.dim() and x1.shape[-2] >= 2 and x2.shape[-2] >= 3 and x1.shape[-1]:
        x2[..., 1, :] = x1[..., 0, :]
        x2[..., 2, 0] = x1[..., 1, 0]
    return x1, x2


@pytest.mark.parametrize("p", _PS)
@pytest.mark.parametrize("shape1,shape2", [*_PAIRS, ((4, 0), (2, 0))])
def test_cdist_forward(p, shape1, shape2):
    x1, x2 = _distance_inputs(shape1, shape2)
    check_lowering(aten._cdist_forward.default, x1, x2, p, 2, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("mode", [None, 0, 1])
@pytest.mark.parametrize("rows", [5, 30])
def test_cdist_forward_euclidean_matmul_form(mode, rows):
    # Mode 1, or beyond 25 rows by default, takes |a|^2 - 2 a.b + |b|^2. (Near-zero distances
    # are the square root of a cancellation's rounding, which no two matmul kernels share.)
    x1, x2 = _rand(2, rows, 3), _rand(2, 4, 3)
    check_lowering(aten._cdist_forward.default, x1, x2, 2.0, mode, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("p", _PS)
@pytest.mark.parametrize("shape1,shape2", _PAIRS)
def test_cdist_backward(p, shape1, shape2):
    x1, x2 = _distance_inputs(shape1, shape2)
    dist = torch.cdist(x1, x2, p, compute_mode="donot_use_mm_for_euclid_dist")
    grad = torch.randn_like(dist)
    check_lowering(aten._cdist_backward.default, grad, x1, x2, p, dist, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("p", _PS)
@pytest.mark.parametrize("rows", [5, 1, 0])
def test_pdist_forward_and_backward(p, rows):
    x = _rand(rows, 3, dtype=torch.float64)
    if rows == 5:
        x[3] = x[0]
        x[2, 0] = x[1, 0]
    check_lowering(aten._pdist_forward.default, x, p, atol=1e-12, rtol=1e-12)
    if not rows:
        return  # eager _pdist_backward crashes on an empty input
    dist = aten._pdist_forward.default(x, p)
    grad = torch.randn_like(dist)
    check_lowering(aten._pdist_backward.default, grad, x, p, dist, atol=1e-12, rtol=1e-12)
