"""Lowerings: matrix factorizations and solvers (SVD, QR, eigh, LU, Cholesky, lstsq) and distances.

Factorizations go through ``jax.lax.linalg``, which calls LAPACK on the CPU as eager PyTorch does,
so results follow LAPACK's conventions: Householder signs of geqrf (QR, geqrf, ormqr), getrf's
1-based partial-pivoting pivots, ascending eigenvalues. Singular vectors and eigenvectors are only
defined up to a sign (phase) per vector, which LAPACK implementations choose differently: eager CPU
PyTorch links MKL and XLA's CPU kernels the reference LAPACK, so these may come out negated.

The ``info`` outputs of the ``_ex`` ops are computed, not raised (XLA cannot raise): LU's is exact
(getrf's first zero pivot) and Cholesky's names the first leading minor that is not positive
definite, so ``aten._linalg_check_errors`` (run eagerly on the fallback) raises as eager does.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowerings.registry import LoweringContext, lowering

_LOW_PRECISION = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _mT(x: Any) -> Any:
    return jnp.swapaxes(x, -1, -2)


def _mH(x: Any) -> Any:
    return jnp.conj(_mT(x))


def _is_complex(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _empty(ctx: LoweringContext, i: int) -> Any:
    """Output ``i`` when the op leaves it empty (e.g. U and Vh of an SVD without vectors)."""
    return jnp.zeros(ctx.shapes[i], ctx.dtypes[i])


def _matmul(ctx: LoweringContext, a: Any, b: Any) -> Any:
    return jnp.matmul(a, b, precision=ctx.precision)


def _broadcast_batch(a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` (stacks of matrices) with their batch dimensions broadcast together."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


def _eye(n: int, batch: tuple, dtype: Any) -> Any:
    return jnp.broadcast_to(jnp.eye(n, dtype=dtype), batch + (n, n))


def _tri_solve(a: Any, b: Any, *, lower: bool, adjoint: bool = False, unit: bool = False) -> Any:
    """Solve ``op(a) @ x = b`` for triangular ``a`` (only its ``lower``/upper triangle is read)."""
    a, b = _broadcast_batch(a, b)
    return jax.lax.linalg.triangular_solve(
        a,
        b,
        left_side=True,
        lower=lower,
        transpose_a=adjoint,
        conjugate_a=adjoint,
        unit_diagonal=unit,
    )


# ------------------------------------------------------------------------------------- SVD, eigh


@lowering("aten._linalg_svd.default")
def _linalg_svd(ctx, A, full_matrices=False, compute_uv=True, *, driver=None):
    # ``driver`` only picks a cuSOLVER routine in PyTorch; XLA chooses its own.
    if not compute_uv:
        return _empty(ctx, 0), jax.lax.linalg.svd(A, compute_uv=False), _empty(ctx, 2)
    return tuple(jax.lax.linalg.svd(A, full_matrices=full_matrices))


@lowering("aten._linalg_eigh.default")
def _linalg_eigh(ctx, A, UPLO="L", compute_v=True):
    # Like LAPACK's syevd/heevd, read only the UPLO triangle; the other one may hold anything.
    vectors, values = jax.lax.linalg.eigh(A, lower=UPLO == "L", symmetrize_input=False)
    return values, (vectors if compute_v else _empty(ctx, 1))


# ----------------------------------------------------------------------------- QR, Householder


@lowering("aten.linalg_qr.default")
def _linalg_qr(ctx, A, mode="reduced"):
    q, r = jax.lax.linalg.qr(A, full_matrices=mode == "complete")
    return (_empty(ctx, 0) if mode == "r" else q), r


@lowering("aten.geqrf.default")
def _geqrf(ctx, self):
    # "raw" mode is LAPACK's geqrf output, stored transposed (Fortran order) as numpy does.
    h, tau = jnp.linalg.qr(self, mode="raw")
    return _mT(h), tau


@lowering("aten.linalg_householder_product.default")
def _linalg_householder_product(ctx, input, tau):
    return jax.lax.linalg.householder_product(input, tau)


@lowering("aten.ormqr.default")
def _ormqr(ctx, self, input2, input3, left=True, transpose=False):
    reflectors = self[..., : input2.shape[-1]]
    return jax.lax.linalg.ormqr(reflectors, input2, input3, left=left, transpose=transpose)


# -------------------------------------------------------------------------------------------- LU


def _lu_no_pivot(a: Any) -> Any:
    """Gaussian elimination without row exchanges, packed as getrf packs L and U."""
    m, n = a.shape[-2:]
    if not min(m, n):
        return a  # fori_loop traces its body even for no steps, and that body indexes a column
    rows = jnp.arange(m)

    def step(j, lu):
        below = rows > j
        column = jnp.where(below, lu[..., :, j] / lu[..., j, j][..., None], lu[..., :, j])
        lu = lu.at[..., :, j].set(column)
        trailing = below[:, None] & (jnp.arange(n) > j)[None, :]
        update = column[..., :, None] * lu[..., j, None, :]
        return lu - jnp.where(trailing, update, jnp.zeros((), lu.dtype))

    return jax.lax.fori_loop(0, min(m, n), step, a)


def _lu_factor(a: Any, pivot: bool = True) -> tuple[Any, Any, Any]:
    """getrf: the packed LU, 1-based int32 pivots and the permutation with ``a[perm] = L U``."""
    if pivot:
        lu, pivots, perm = jax.lax.linalg.lu(a)
        return lu, pivots + 1, perm
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    pivots = jnp.broadcast_to(jnp.arange(1, min(m, n) + 1, dtype=jnp.int32), batch + (min(m, n),))
    return _lu_no_pivot(a), pivots, jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), batch + (m,))


def _first_true(mask: Any) -> Any:
    """LAPACK's info: the 1-based position of the first True along the last axis, else 0."""
    n = mask.shape[-1]
    positions = jnp.where(mask, jnp.arange(1, n + 1, dtype=jnp.int32), n + 1)
    first = jnp.min(positions, axis=-1, initial=n + 1)
    return jnp.where(first > n, 0, first).astype(jnp.int32)


def _lu_info(lu: Any) -> Any:
    """getrf's info: the first exactly zero pivot of U."""
    return _first_true(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)


def _permutation(pivots: Any, m: int) -> Any:
    """The row permutation ``perm`` (``a[perm] = L U``) of 1-based getrf pivots."""
    return jax.lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _permutation_matrix(perm: Any, dtype: Any) -> Any:
    """P with ``a = P L U``: column j of P is e_{perm[j]}."""
    return _mT(jax.nn.one_hot(perm, perm.shape[-1], dtype=dtype))


def _unpack_lu(lu: Any) -> tuple[Any, Any]:
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    return lower, jnp.triu(lu[..., :k, :])


def _lu_solve(lu: Any, perm: Any, b: Any, left: bool = True, adjoint: bool = False) -> Any:
    """Solve ``op(A) X = B`` (``X op(A) = B`` when not ``left``), op = adjoint or identity,
    for ``A[perm] = L U`` given as the packed ``lu``."""
    if not left:
        return _mH(_lu_solve(lu, perm, _mH(b), True, not adjoint))
    lu, b = _broadcast_batch(lu, b)
    perm = jnp.broadcast_to(perm, b.shape[:-2] + perm.shape[-1:])
    if not adjoint:
        x = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        x = _tri_solve(lu, x, lower=True, unit=True)
        return _tri_solve(lu, x, lower=False)
    y = _tri_solve(lu, b, lower=False, adjoint=True)
    y = _tri_solve(lu, y, lower=True, adjoint=True, unit=True)
    return jnp.take_along_axis(y, jnp.argsort(perm, axis=-1)[..., :, None], axis=-2)


def _det_factors(A: Any) -> tuple[Any, Any]:
    """The LU and pivots ``_linalg_det``/``_linalg_slogdet`` return for their backward.

    PyTorch factors A^T (det(A^T) = det(A)) when A is real and contiguous, and its backward picks
    its solve from the same test. Lazy tensors are contiguous unless a view made them otherwise;
    a lowering cannot see strides, so it assumes contiguity.
    """
    lu, pivots, _ = _lu_factor(A if _is_complex(A) else _mT(A))
    return lu, pivots


def _solve(A: Any, B: Any, left: bool) -> tuple[Any, Any, Any, Any]:
    """``_linalg_solve_ex``'s result and the LU factors of A it returns for the backward."""
    lu, pivots, perm = _lu_factor(A)
    return _lu_solve(lu, perm, B, left), lu, pivots, _lu_info(lu)


@lowering("aten.linalg_lu_factor_ex.default")
def _linalg_lu_factor_ex(ctx, A, *, pivot=True, check_errors=False):
    lu, pivots, _ = _lu_factor(A, pivot)
    return lu, pivots, _lu_info(lu)


@lowering("aten.linalg_lu.default")
def _linalg_lu(ctx, A, *, pivot=True):
    lu, _, perm = _lu_factor(A, pivot)
    p = _permutation_matrix(perm, A.dtype) if pivot else _empty(ctx, 0)
    return (p, *_unpack_lu(lu))


@lowering("aten.lu_unpack.default")
def _lu_unpack(ctx, LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    if unpack_pivots:
        p = _permutation_matrix(_permutation(LU_pivots, LU_data.shape[-2]), LU_data.dtype)
    else:
        p = _empty(ctx, 0)
    lower, upper = _unpack_lu(LU_data) if unpack_data else (_empty(ctx, 1), _empty(ctx, 2))
    return p, lower, upper


@lowering("aten.linalg_lu_solve.default")
def _linalg_lu_solve(ctx, LU, pivots, B, *, left=True, adjoint=False):
    return _lu_solve(LU, _permutation(pivots, LU.shape[-1]), B, left, adjoint)


@lowering("aten._linalg_solve_ex.default")
def _linalg_solve_ex(ctx, A, B, *, left=True, check_errors=False):
    # B is a (batch of) vector(s) when it is 1-d or has exactly A's shape without the last dim.
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    x, lu, pivots, info = _solve(A, B[..., None] if vector else B, left)
    return (x[..., 0] if vector else x), lu, pivots, info


@lowering("aten.linalg_inv_ex.default")
def _linalg_inv_ex(ctx, A, *, check_errors=False):
    # PyTorch inverts by solving A X = I, so its info is that solve's.
    x, _, _, info = _solve(A, _eye(A.shape[-1], A.shape[:-2], A.dtype), True)
    return x, info


def _permutation_sign(pivots: Any, dtype: Any) -> Any:
    """det(P) of getrf pivots: -1 to the number of actual row swaps."""
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 1, -1, 1).astype(dtype)


@lowering("aten._linalg_det.default")
def _linalg_det(ctx, A):
    lu, pivots = _det_factors(A)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return _permutation_sign(pivots, A.dtype) * jnp.prod(diagonal, axis=-1), lu, pivots


@lowering("aten._linalg_slogdet.default")
def _linalg_slogdet(ctx, A):
    lu, pivots = _det_factors(A)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    # sgn (z / |z|, and 0 at 0) of each pivot, as PyTorch's diag_U.sgn().prod(-1).
    sign = _permutation_sign(pivots, A.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
    return sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1), lu, pivots


# -------------------------------------------------------------------------------------- Cholesky


def _cholesky_info(A: Any) -> Any:
    """potrf's info: the order of the first leading minor that is not positive definite, else 0.

    Its pivots are those of elimination without row exchanges on the Hermitian matrix that the
    lower triangle defines; only computed when the factorization failed (jax returns NaN then).
    """
    hermitian = jnp.tril(A) + _mH(jnp.tril(A, -1))
    pivots = jnp.real(jnp.diagonal(_lu_no_pivot(hermitian), axis1=-2, axis2=-1))
    return _first_true(~(pivots > 0))


def _cholesky(A: Any, upper: bool) -> tuple[Any, Any]:
    """The Cholesky factor of the Hermitian matrix that A's lower (upper) triangle defines, and
    potrf's info."""
    lower = _mH(A) if upper else A
    factor = jax.lax.linalg.cholesky(lower, symmetrize_input=False)
    failed = jnp.isnan(factor).any()
    info = jax.lax.cond(failed, _cholesky_info, lambda a: jnp.zeros(a.shape[:-2], jnp.int32), lower)
    return (_mH(factor) if upper else factor), info


@lowering("aten.linalg_cholesky_ex.default")
def _linalg_cholesky_ex(ctx, self, *, upper=False, check_errors=False):
    return _cholesky(self, upper)


@lowering("aten.cholesky.default")
def _cholesky_op(ctx, self, upper=False):
    return _cholesky(self, upper)[0]


def _cholesky_solve(B: Any, factor: Any, upper: bool) -> Any:
    """Solve ``A X = B`` for ``A = L L^H`` (``U^H U`` when ``upper``)."""
    if upper:
        return _tri_solve(factor, _tri_solve(factor, B, lower=False, adjoint=True), lower=False)
    return _tri_solve(factor, _tri_solve(factor, B, lower=True), lower=True, adjoint=True)


@lowering("aten.cholesky_solve.default")
def _cholesky_solve_op(ctx, self, input2, upper=False):
    return _cholesky_solve(self, input2, upper)


@lowering("aten.cholesky_inverse.default")
def _cholesky_inverse(ctx, self, upper=False):
    inverse = _cholesky_solve(_eye(self.shape[-1], self.shape[:-2], self.dtype), self, upper)
    # potri returns an exactly Hermitian matrix; the two triangular solves only nearly.
    return (inverse + _mH(inverse)) / 2


# ------------------------------------------------------------------------------ triangular solve


@lowering("aten.linalg_solve_triangular.default")
def _linalg_solve_triangular(ctx, self, B, *, upper, left=True, unitriangular=False):
    if not left:
        # X A = B  <=>  A^T X^T = B^T
        return _mT(_tri_solve(_mT(self), _mT(B), lower=upper, unit=unitriangular))
    return _tri_solve(self, B, lower=not upper, unit=unitriangular)


@lowering("aten.triangular_solve.default")
def _triangular_solve(ctx, self, A, upper=True, transpose=False, unitriangular=False):
    B, A = _broadcast_batch(self, A)
    x = jax.lax.linalg.triangular_solve(
        A, B, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, A


# -------------------------------------------------------------------------- matrix_exp, pinv


# PyTorch's matrix_exp (Bader, Blanes, Casas 2019): a Taylor polynomial of degree 1, 2, 4, 8 or 12
# picked per matrix by its 1-norm, else degree 18 with scaling and squaring. Evaluating the same
# polynomials keeps the rounding close to eager's, which float32 inputs of large norm amplify.
_EXP_THETAS = {
    np.dtype(np.float32): (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                           5.800524627688768e-01, 1.461661507209034e00, 3.010066362817634e00),
    np.dtype(np.float64): (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                           4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e00),
}  # fmt: skip


def _t8_coefficients(dtype: Any) -> tuple:
    """The degree-8 coefficients x1..x7, y2 as PyTorch's ``constexpr scalar_t`` constants round
    them: sqrt(177) and 2/3 are rounded to ``dtype`` first, then each coefficient."""
    real = np.dtype(dtype).type
    sqrt_177 = float(real(0.1330413469565007072504e2))
    x3 = float(real(2.0 / 3.0))
    values = (
        x3 * ((1.0 + sqrt_177) / 88.0),
        x3 * ((1.0 + sqrt_177) / 352.0),
        x3,
        (-271.0 + 29.0 * sqrt_177) / (315.0 * x3),
        (-11.0 + 11.0 * sqrt_177) / (1260.0 * x3),
        (-99.0 + 11.0 * sqrt_177) / (5040.0 * x3),
        (89.0 - sqrt_177) / (5040.0 * x3),
        (857.0 - 58.0 * sqrt_177) / 630.0,
    )
    return tuple(real(v) for v in values)


_T12 = np.array([
    [9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740],
    [5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
     0.01108844528519167989],
    [0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
     0.00610700528898058230],
    [-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359],
])  # fmt: skip
_T18 = np.array([
    [0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04,
     0.0],
    [0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04],
    [-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05],
    [-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05],
    [0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02,
     -1.40086798182036094347e-05],
])  # fmt: skip


def _sum_in_order(terms: Any) -> Any:
    """``terms[0] + terms[1] + ...`` over axis 0, one rounding per addition, as eager's loops.

    The additions run in a loop over materialized terms because XLA fuses a product into the
    addition that consumes it as one fused multiply-add, which eager's kernels do not do; the
    squarings of matrix_exp amplify that difference beyond float32 tolerance.
    """

    def add(k, total):
        return total + jax.lax.dynamic_index_in_dim(terms, k, keepdims=False)

    return jax.lax.fori_loop(1, terms.shape[0], add, terms[0])


def _combine(coefficients: Any, powers: list) -> Any:
    """``sum_j coefficients[j] * powers[j]``, accumulated in order as PyTorch does."""
    return _sum_in_order(
        jnp.stack([jnp.asarray(c, p.real.dtype) * p for c, p in zip(coefficients, powers)])
    )


def _exp_matmul(ctx: LoweringContext, a: Any, b: Any) -> Any:
    """matrix_exp's products: below 400 multiply-adds per matrix, eager's bmm runs a plain loop
    over the contraction (no BLAS, no fused multiply-add); mirror it there, else use a dot."""
    m, k = a.shape[-2:]
    if k * m * b.shape[-1] >= 400:
        return _matmul(ctx, a, b)
    a, b = _broadcast_batch(a, b)
    return _sum_in_order(jnp.moveaxis(a[..., :, :, None] * b[..., None, :, :], -2, 0))


def _exp_taylor(ctx: LoweringContext, a: Any) -> list:
    """PyTorch's Taylor approximants of exp(a) of degree 1, 2, 4, 8, 12 and 18.

    All are computed and one is selected per matrix: cheaper than branching for small matrices,
    and matrix_exp is rarely hot.
    """
    mm = functools.partial(_exp_matmul, ctx)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    a2 = mm(a, a)
    a3 = mm(a, a2)
    x1, x2, x3, x4, x5, x6, x7, y2 = _t8_coefficients(a.real.dtype)
    a4 = mm(a2, _combine((x1, x2), [a, a2]))
    a8 = mm(_combine((x3, 1), [a2, a4]), _combine((x4, x5, x6, x7), [eye, a, a2, a4]))
    b12 = [_combine(row, [eye, a, a2, a3]) for row in _T12]
    a6 = b12[2] + mm(b12[3], b12[3])
    b18 = [_combine(row, [eye, a, a2, a3, mm(a3, a3)]) for row in _T18]
    a9 = mm(b18[0], b18[4]) + b18[3]
    return [
        eye + a,
        _combine((1, 1, 0.5), [eye, a, a2]),
        _combine((1, 1, 1), [eye, a, mm(a2, _combine((1 / 2, 1 / 6, 1 / 24), [eye, a, a2]))]),
        _combine((1, 1, y2, 1), [eye, a, a2, a8]),
        b12[0] + mm(b12[1] + a6, a6),
        b18[1] + mm(b18[2] + a9, a9),
    ]


@lowering("aten.linalg_matrix_exp.default")
def _linalg_matrix_exp(ctx, self):
    if self.shape[-1] <= 1:
        return jnp.exp(self)
    a = self
    if ctx.dtype in _LOW_PRECISION:
        # Eager CPU PyTorch returns inf/NaN in half precision; compute in float32 instead.
        a = self.astype(jnp.float32)
    real = np.dtype(a.real.dtype)
    thetas = jnp.asarray(_EXP_THETAS[real], real)
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)[..., None, None]
    squarings = jnp.maximum(0, jnp.ceil(jnp.log2(norm / thetas[5])))
    squarings = jnp.where(jnp.isnan(norm), 0, squarings)  # others in the batch still square
    approximants = _exp_taylor(ctx, a / 2**squarings)
    # Below the degree-12 bound no scaling happens (squarings is 0): degree i serves norms in
    # [thetas[i - 1], thetas[i]). A NaN norm matches no interval and eager leaves all NaN.
    degree = jnp.where(jnp.isnan(norm), -1, jnp.sum(norm >= thetas[:5], axis=-1, keepdims=True))
    nan = jnp.full_like(approximants[0], np.nan)
    result = jnp.select([degree == i for i in range(6)], approximants, nan)

    def square(i, m):
        return jnp.where(i < squarings, _exp_matmul(ctx, m, m), m)

    result = jax.lax.fori_loop(0, jnp.max(squarings, initial=0).astype(jnp.int32), square, result)
    return result.astype(ctx.dtype)


def _tolerance(atol: Any, rtol: Any, largest: Any, A: Any) -> Any:
    """PyTorch's pinv/matrix_rank cutoff ``max(atol, rtol * largest)`` for a batch of spectra.

    Without rtol, it is eps * max(m, n), or 0 where a positive atol is given.
    """
    real = largest.dtype
    eps = jnp.asarray(jnp.finfo(real).eps * max(A.shape[-2:]), real)
    if rtol is None:
        rtol = eps if atol is None else jnp.where(jnp.asarray(atol) > 0, 0, eps)
    atol = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    return jnp.maximum(atol[..., None], jnp.asarray(rtol, real)[..., None] * largest)


@lowering("aten.linalg_pinv.atol_rtol_tensor")
def _linalg_pinv(ctx, self, *, atol=None, rtol=None, hermitian=False):
    if hermitian:
        vectors, values = jax.lax.linalg.eigh(self, lower=True, symmetrize_input=False)
        magnitude = jnp.abs(values)
        cutoff = _tolerance(atol, rtol, jnp.max(magnitude, -1, keepdims=True, initial=0), self)
        inverse = jnp.where(magnitude > cutoff, 1 / values, 0).astype(self.dtype)
        return _matmul(ctx, vectors * inverse[..., None, :], _mH(vectors))
    u, s, vh = jax.lax.linalg.svd(self, full_matrices=False)
    cutoff = _tolerance(atol, rtol, s[..., :1], self)
    inverse = jnp.where(s > cutoff, 1 / s, 0).astype(self.dtype)
    return _matmul(ctx, _mH(vh) * inverse[..., None, :], _mH(u))


# ----------------------------------------------------------------------------------------- lstsq


@lowering("aten.linalg_lstsq.default")
def _linalg_lstsq(ctx, self, b, rcond=None, *, driver=None):
    """Least squares through the SVD, as LAPACK's gelsd; for full-rank inputs every driver's
    solution is this minimum-norm one.

    Which extra outputs are filled (and their shapes) follows the driver, as in PyTorch: rank
    unless gels, singular values for gelsd/gelss, residuals when m > n and the driver is not gelsy.
    """
    vector = b.ndim == self.ndim - 1
    B = b[..., None] if vector else b
    m, n = self.shape[-2:]
    # Rank and singular values keep A's own batch shape; products broadcast it against B's.
    u, s, vh = jax.lax.linalg.svd(self, full_matrices=False)
    if rcond is None or rcond < 0:
        rcond = jnp.finfo(s.dtype).eps * max(m, n) if rcond is None else jnp.finfo(s.dtype).eps
    # gels assumes full rank and keeps every singular value; the others cut off relative to s[0].
    kept = jnp.ones(s.shape, bool) if driver == "gels" else s > rcond * s[..., :1]
    inverse = jnp.where(kept, 1 / s, 0).astype(self.dtype)
    x = _matmul(ctx, _mH(vh), inverse[..., :, None] * _matmul(ctx, _mH(u), B))
    residual = _matmul(ctx, self, x) - B
    computed = (
        x[..., 0] if vector else x,
        jnp.sum(jnp.real(residual * jnp.conj(residual)), axis=-2),
        jnp.sum(kept, axis=-1),
        s,
    )
    # Outputs the driver leaves empty are zeros of their empty shape; XLA drops the unused work.
    return tuple(
        jnp.reshape(value, shape).astype(dtype) if math.prod(shape) else jnp.zeros(shape, dtype)
        for value, shape, dtype in zip(computed, ctx.shapes, ctx.dtypes)
    )


# ------------------------------------------------------------------------------------ distances


def _norm_of_differences(diff: Any, p: float) -> Any:
    """The p-norm along the last axis of ``diff = |a - b|``, as PyTorch's distance kernels take it.

    p = 0 counts the nonzero differences and p = inf takes the largest.
    """
    if p == 0:
        return jnp.sum(jnp.minimum(jnp.ceil(diff), 1), axis=-1)
    if p == 1:
        return jnp.sum(diff, axis=-1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, axis=-1))
    if np.isinf(p):
        return jnp.max(diff, axis=-1, initial=0)
    return jnp.sum(diff**p, axis=-1) ** (1 / p)


def _norm_gradient(diff: Any, grad: Any, dist: Any, p: float) -> Any:
    """d dist / d a times ``grad`` for each pair, ``diff = a - b``, as PyTorch's kernels define it
    (0 where the distance is 0, and the inf-norm gradient goes to every coordinate at the max)."""
    zero = jnp.zeros((), diff.dtype)
    sign = jnp.sign(diff)
    if p == 0:
        return jnp.zeros_like(diff)
    if p == 1:
        return grad * sign
    if np.isinf(p):
        return jnp.where(jnp.abs(diff) == dist, grad * sign, zero)
    if p == 2:
        return jnp.where(dist == 0, zero, grad * diff / dist)
    if p < 2:
        out = sign * jnp.abs(diff) ** (p - 1) * grad / dist ** (p - 1)
        out = jnp.where((diff == 0) & (p < 1), zero, out)
    else:
        out = diff * jnp.abs(diff) ** (p - 2) * grad / dist ** (p - 1)
    return jnp.where(dist == 0, zero, out)


def _euclidean_dist(ctx: LoweringContext, x1: Any, x2: Any) -> Any:
    """PyTorch's matmul form of Euclidean distances, |a|^2 - 2 a.b + |b|^2, with its rounding."""
    norm1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    norm2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    ones1, ones2 = jnp.ones_like(norm1), jnp.ones_like(norm2)
    left = jnp.concatenate([-2 * x1, norm1, ones1], axis=-1)
    right = jnp.concatenate([x2, ones2, norm2], axis=-1)
    return jnp.sqrt(jnp.maximum(_matmul(ctx, left, _mT(right)), 0))


@lowering("aten._cdist_forward.default")
def _cdist_forward(ctx, x1, x2, p, compute_mode):
    x1, x2 = _broadcast_batch(x1, x2)
    # compute_mode: None/0 use the matmul form for p=2 beyond 25 rows, 1 always, 2 never.
    mode = compute_mode or 0
    if p == 2 and (mode == 1 or (mode == 0 and max(x1.shape[-2], x2.shape[-2]) > 25)):
        return _euclidean_dist(ctx, x1, x2)
    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    return _norm_of_differences(diff, p)


@lowering("aten._cdist_backward.default")
def _cdist_backward(ctx, grad, x1, x2, p, cdist):
    # The gradient keeps x1's broadcast batch shape (autograd reduces it to x1's own), except
    # that PyTorch returns zeros shaped like x1 itself when any dimension is empty.
    if math.prod(ctx.shape) == 0 or 0 in x2.shape:
        return jnp.zeros(ctx.shape, ctx.dtype)
    x1, x2 = _broadcast_batch(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    terms = _norm_gradient(diff, grad[..., None], cdist[..., None], p)
    return jnp.broadcast_to(jnp.sum(terms, axis=-2), ctx.shape)


@lowering("aten._pdist_forward.default")
def _pdist_forward(ctx, self, p=2.0):
    i, j = np.triu_indices(self.shape[0], 1)
    return _norm_of_differences(jnp.abs(self[i] - self[j]), p)


@lowering("aten._pdist_backward.default")
def _pdist_backward(ctx, grad, self, p, pdist):
    # Each pair (i < j) pulls row i along its difference and pushes row j back.
    i, j = np.triu_indices(self.shape[0], 1)
    terms = _norm_gradient(self[i] - self[j], grad[:, None], pdist[:, None], p)
    return jnp.zeros_like(self).at[i].add(terms).at[j].add(-terms)
