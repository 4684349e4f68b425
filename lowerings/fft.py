"""Lowerings: FFTs (PyTorch's r2c/c2c/c2r primitives) and complex-number construction."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from lowerings.registry import lowering

# PyTorch's normalization codes: 0 none, 1 by 1/sqrt(n), 2 by 1/n (n = product of the sizes).


def _scale(x, n: int, normalization: int):
    if normalization == 1:
        return x * (1.0 / math.sqrt(n))
    if normalization == 2:
        return x * (1.0 / n)
    return x


def _dims(x, dim) -> tuple[int, ...]:
    return tuple(d % x.ndim for d in dim)


@lowering("aten._fft_r2c.default")
def _fft_r2c(ctx, self, dim, normalization, onesided):
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    if onesided:
        out = jnp.fft.rfftn(self, axes=dims)
    else:
        out = jnp.fft.fftn(self.astype(ctx.dtype), axes=dims)
    return _scale(out, n, normalization).astype(ctx.dtype)


@lowering("aten._fft_c2c.default")
def _fft_c2c(ctx, self, dim, normalization, forward):
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    # "forward" puts the 1/n on the forward transform, so the inverse comes out unscaled.
    out = (
        jnp.fft.fftn(self, axes=dims) if forward else jnp.fft.ifftn(self, axes=dims, norm="forward")
    )
    return _scale(out, n, normalization).astype(ctx.dtype)


@lowering("aten._fft_c2r.default")
def _fft_c2r(ctx, self, dim, normalization, last_dim_size):
    dims = _dims(self, dim)
    sizes = [self.shape[d] for d in dims[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=dims, norm="forward")
    return _scale(out, math.prod(sizes), normalization).astype(ctx.dtype)


@lowering("aten.complex.default")
def _complex(ctx, real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag).astype(ctx.dtype)


@lowering("aten.polar.default")
def _polar(ctx, abs, angle):
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle)).astype(ctx.dtype)


@lowering("aten.view_as_real.default")
def _view_as_real(ctx, self):
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1).astype(ctx.dtype)


@lowering("aten.view_as_complex.default")
def _view_as_complex(ctx, self):
    return lax.complex(self[..., 0], self[..., 1]).astype(ctx.dtype)


@lowering("aten._conj.default", "aten._conj_physical.default", "aten.conj_physical.default")
def _conj(ctx, self):
    return jnp.conj(self) if jnp.iscomplexobj(self) else self


@lowering("aten.real.default")
def _real(ctx, self):
    return jnp.real(self).astype(ctx.dtype)


@lowering("aten.imag.default")
def _imag(ctx, self):
    return jnp.imag(self).astype(ctx.dtype)
