"""Lowerings: the general eigendecomposition (geev) and LDL^T factorization (sytrf/hetrf, sytrs).

``linalg_eig`` goes through ``jax.lax.linalg.eig``, which calls LAPACK's geev as eager does, so the
eigenvalues come in geev's order and each eigenvector with geev's normalization (unit 2-norm, its
largest component real). On the CPU platform this runs in the executable; on GPU, JAX runs the
same LAPACK routine on the host (its default), so the op stays lowered there too, at the cost of
a device-host round trip.

The LDL^T factorization is LAPACK's unblocked Bunch-Kaufman (sytf2/hetf2, lower triangle), step
for step: the same pivot tests, interchanges and updates, so pivots match eager's exactly and the
factors to rounding. LAPACK's blocked sytrf only takes its blocked path from 64 columns up, where
its pivot choices are the same and its rounding slightly differs.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from lowerings.registry import lowering

# Bunch-Kaufman's threshold (1 + sqrt(17)) / 8 between 1x1 and 2x2 pivots.
_ALPHA = (1.0 + math.sqrt(17.0)) / 8.0


# ------------------------------------------------------------------------------------------ eig


def _eig(ctx: Any, A: Any) -> tuple[Any, Any]:
    n = A.shape[-1]
    if n == 0 or math.prod(A.shape) == 0:
        return jnp.zeros(ctx.shapes[0], ctx.dtypes[0]), jnp.zeros(A.shape, ctx.dtypes[0])
    values, vectors = jax.lax.linalg.eig(A, compute_left_eigenvectors=False)
    return values.astype(ctx.dtypes[0]), vectors.astype(ctx.dtypes[0])


@lowering("aten.linalg_eig.default")
def _linalg_eig(ctx, self):
    return _eig(ctx, self)


@lowering("aten._linalg_eigvals.default")
def _linalg_eigvals(ctx, self):
    return _eig(ctx, self)[0]


# ------------------------------------------------------------------------------------------ LDL


def _cabs1(x: Any) -> Any:
    """LAPACK's pivot size: |x| for real x, |re| + |im| for complex x."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.abs(x.real) + jnp.abs(x.imag)
    return jnp.abs(x)


def _mirror(a: Any, hermitian: bool) -> Any:
    """The full symmetric (Hermitian) matrix that the lower triangle of ``a`` defines."""
    lower = jnp.tril(a, -1)
    upper = jnp.conj(lower.T) if hermitian else lower.T
    diagonal = jnp.diagonal(a)
    if hermitian:
        diagonal = diagonal.real.astype(a.dtype)
    return lower + upper + jnp.diag(diagonal)


def _swap(a: Any, i: Any, j: Any, axis: int) -> Any:
    """``a`` with rows (``axis=0``) or columns (``axis=1``) ``i`` and ``j`` exchanged."""
    index = jnp.arange(a.shape[axis])
    order = jnp.where(index == i, j, jnp.where(index == j, i, index))
    return jnp.take(a, order, axis=axis)


def _ldl_one(a: Any, hermitian: bool) -> tuple[Any, Any, Any]:
    """sytf2/hetf2 (uplo='L') on one matrix: packed L and D, 1-based pivots, info."""
    n = a.shape[-1]
    conj = jnp.conj if hermitian else (lambda x: x)
    rows = jnp.arange(n)
    real = a.real.dtype
    alpha = jnp.asarray(_ALPHA, real)

    def step(state):
        a, pivots, k, info = state
        absakk = _cabs1(a[k, k]) if not hermitian else jnp.abs(a[k, k].real)
        column = jnp.where(rows > k, _cabs1(a[:, k]), -1)
        imax = jnp.argmax(column)
        colmax = jnp.maximum(column[imax], 0)
        # The largest off-diagonal entry of row/column imax within the trailing block.
        row_imax = jnp.where((rows >= k) & (rows != imax), _cabs1(a[imax, :]), 0)
        rowmax = jnp.max(row_imax)
        diag_imax = jnp.abs(a[imax, imax].real) if hermitian else _cabs1(a[imax, imax])
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        one_by_one = singular | keep | (diag_imax >= alpha * rowmax)
        kp = jnp.where(singular | keep, k, imax)
        kstep = jnp.where(one_by_one, 1, 2)
        kk = k + kstep - 1
        # Exchange kk and kp in the trailing block only (earlier columns of L stay: LAPACK's
        # L is a product of permutations and unit triangular factors).
        trailing = (rows[:, None] >= k) & (rows[None, :] >= k)
        swapped = _swap(_swap(a, kk, kp, 0), kk, kp, 1)
        a = jnp.where(trailing, swapped, a)
        a = jnp.where(singular, a, jnp.where(kstep == 1, _update1(a, k, hermitian, conj), a))
        a = jnp.where(kstep == 2, _update2(a, k, hermitian, conj), a)
        pivot = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        pivots = pivots.at[k].set(pivot)
        pivots = jnp.where((kstep == 2) & (rows == k + 1), pivot, pivots)
        info = jnp.where((info == 0) & singular, k + 1, info).astype(jnp.int32)
        return a, pivots, k + kstep, info

    start = (
        _mirror(a, hermitian),
        jnp.zeros(n, jnp.int32),
        jnp.asarray(0),
        jnp.asarray(0, jnp.int32),
    )
    a, pivots, _, info = jax.lax.while_loop(lambda s: s[2] < n, step, start)
    return jnp.tril(a), pivots, info


def _update1(a: Any, k: Any, hermitian: bool, conj: Any) -> Any:
    """A 1x1 pivot at k: ``A22 -= x (x / d)^T`` (syr/her), then ``x /= d``."""
    rows = jnp.arange(a.shape[-1])
    d11 = 1 / (a[k, k].real if hermitian else a[k, k])
    x = jnp.where(rows > k, a[:, k], 0)
    temp = -d11 * conj(x)
    below = (rows[:, None] > k) & (rows[None, :] > k)
    updated = a + x[:, None] * temp[None, :]
    if hermitian:
        updated = jnp.where(rows[:, None] == rows[None, :], updated.real.astype(a.dtype), updated)
    a = jnp.where(below, updated, a)
    scaled = jnp.where(rows > k, x * d11, a[:, k])
    a = a.at[:, k].set(scaled)
    return _mirror(a, hermitian)


def _update2(a: Any, k: Any, hermitian: bool, conj: Any) -> Any:
    """A 2x2 pivot at (k, k + 1): sytf2/hetf2's update of the trailing block and the two columns
    of L, with their operation order."""
    n = a.shape[-1]
    rows = jnp.arange(n)
    k1 = jnp.minimum(k + 1, n - 1)
    ak, ak1 = a[:, k], a[:, k1]
    if hermitian:
        d = jnp.abs(a[k1, k])
        d11 = a[k1, k1].real / d
        d22 = a[k, k].real / d
        tt = 1 / (d11 * d22 - 1)
        d21 = a[k1, k] / d
        d = tt / d
        wk = d * (d11 * ak - d21 * ak1)
        wkp1 = d * (d22 * ak1 - jnp.conj(d21) * ak)
    else:
        d21 = a[k1, k]
        d11 = a[k1, k1] / d21
        d22 = a[k, k] / d21
        t = 1 / (d11 * d22 - 1)
        d21 = t / d21
        wk = d21 * (d11 * ak - ak1)
        wkp1 = d21 * (d22 * ak1 - ak)
    beyond = rows > k + 1
    wk, wkp1 = jnp.where(beyond, wk, 0), jnp.where(beyond, wkp1, 0)
    updated = a - ak[:, None] * conj(wk)[None, :] - ak1[:, None] * conj(wkp1)[None, :]
    if hermitian:
        updated = jnp.where(rows[:, None] == rows[None, :], updated.real.astype(a.dtype), updated)
    a = jnp.where(beyond[:, None] & beyond[None, :], updated, a)
    a = a.at[:, k].set(jnp.where(beyond, wk, ak))
    a = a.at[:, k1].set(jnp.where(beyond, wkp1, a[:, k1]))
    return _mirror(a, hermitian)


def _batched(fn: Any, batch: int) -> Any:
    for _ in range(batch):
        fn = jax.vmap(fn)
    return fn


@lowering("aten.linalg_ldl_factor_ex.default")
def _linalg_ldl_factor_ex(ctx, self, *, hermitian=False, check_errors=False):
    hermitian = hermitian and jnp.issubdtype(self.dtype, jnp.complexfloating)
    if math.prod(self.shape) == 0:
        return self, jnp.zeros(ctx.shapes[1], jnp.int32), jnp.zeros(ctx.shapes[2], jnp.int32)
    factor = _batched(lambda a: _ldl_one(a, hermitian), self.ndim - 2)
    return factor(self)


def _ldl_solve_one(ld: Any, pivots: Any, b: Any, hermitian: bool) -> Any:
    """sytrs/hetrs (uplo='L'): solve ``A X = B`` from sytrf's packed factors and pivots."""
    n = ld.shape[-1]
    rows = jnp.arange(n)
    conj = jnp.conj if hermitian else (lambda x: x)

    def forward(state):
        b, k = state
        two = pivots[k] < 0
        kp = jnp.where(two, -pivots[k], pivots[k]) - 1
        k1 = jnp.minimum(k + 1, n - 1)
        b = _swap(b, jnp.where(two, k1, k), kp, 0)
        # L solve with column k (and k + 1 for a 2x2 block).
        first = jnp.where(rows > k + two, ld[:, k], 0)
        b = b - first[:, None] * b[k][None, :]
        second = jnp.where(two & (rows > k + 1), ld[:, k1], 0)
        b = b - second[:, None] * b[k1][None, :]
        # D solve.
        if hermitian:
            one = b.at[k].set(b[k] * (1 / ld[k, k].real))
            akm1k = ld[k1, k]
            akm1 = ld[k, k] / jnp.conj(akm1k)
            ak = ld[k1, k1] / akm1k
            bkm1 = b[k] / jnp.conj(akm1k)
        else:
            one = b.at[k].set(b[k] * (1 / ld[k, k]))
            akm1k = ld[k1, k]
            akm1 = ld[k, k] / akm1k
            ak = ld[k1, k1] / akm1k
            bkm1 = b[k] / akm1k
        denom = akm1 * ak - 1
        bk = b[k1] / akm1k
        block = b.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return jnp.where(two, block, one), k + jnp.where(two, 2, 1)

    b, _ = jax.lax.while_loop(lambda s: s[1] < n, forward, (b, jnp.asarray(0)))

    def backward(state):
        b, k = state
        two = (pivots[k] < 0) & (k > 0)
        km1 = jnp.maximum(k - 1, 0)
        below = rows > k
        b = b.at[k].add(-(conj(jnp.where(below, ld[:, k], 0)) @ b))
        other = b.at[km1].add(-(conj(jnp.where(below, ld[:, km1], 0)) @ b))
        b = jnp.where(two, other, b)
        kp = jnp.where(pivots[k] < 0, -pivots[k], pivots[k]) - 1
        b = _swap(b, k, kp, 0)
        return b, k - jnp.where(two, 2, 1)

    b, _ = jax.lax.while_loop(lambda s: s[1] >= 0, backward, (b, jnp.asarray(n - 1)))
    return b


@lowering("aten.linalg_ldl_solve.default")
def _linalg_ldl_solve(ctx, LD, pivots, B, *, hermitian=False):
    hermitian = hermitian and jnp.issubdtype(LD.dtype, jnp.complexfloating)
    if math.prod(ctx.shape) == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    batch = ctx.shape[:-2]
    LD = jnp.broadcast_to(LD, batch + LD.shape[-2:])
    pivots = jnp.broadcast_to(pivots, batch + pivots.shape[-1:])
    B = jnp.broadcast_to(B, ctx.shape)
    solve = _batched(lambda ld, p, b: _ldl_solve_one(ld, p, b, hermitian), len(batch))
    return solve(LD, pivots, B).astype(ctx.dtype)
