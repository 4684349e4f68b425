"""Lowerings: ops whose output size depends on data, in their static-size forms.

``nonzero``, ``unique``, ``bincount``, ``masked_select`` and friends have output shapes that
depend on values. lazy_torch syncs the one number that decides the size (a count, a maximum) and
records the static-size op lowered here, so the data itself never leaves the device.
"""

from __future__ import annotations

import jax.numpy as jnp

from lowerings.registry import lowering


@lowering("aten.nonzero_static.default")
def _nonzero_static(ctx, x, *, size, fill_value=-1):
    """The first ``size`` coordinates of nonzero elements in row-major order, then ``fill_value``."""
    if x.ndim == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(coords, axis=1).astype(ctx.dtype)
