"""Lowerings: memory windows (lazy_core/window.py), a view read from another tensor's value by
address and written back into it.

``lazy.memory_window(source_value, source, window)`` gathers, for each element of the layout ``window``,
the element of ``source_value`` (laid out as ``source``) at the same address;
``lazy.memory_window_scatter(source_value, value, source, window)`` writes ``value`` there. Positions are
computed from iotas where the layouts nest (every view op's do), else baked as a constant.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from lazy_core import window as w
from lowerings.registry import lowering


def _positions(source: w.Layout, window: w.Layout):
    found = w.positions(source, window)
    if found is None:  # lazy_torch only makes windows inside their source
        raise ValueError(f"window {window} reads memory outside its source {source}")
    if not w.arithmetic(source, window, found):
        return jnp.asarray(found.astype(np.int32 if found.size < 2**31 else np.int64))
    sizes, strides, offset = window
    address = jnp.asarray(offset, jnp.int64)
    for n, st in zip(sizes, strides):
        address = address[..., None] + jnp.arange(n, dtype=jnp.int64) * st
    return w.digit_positions(source, address.reshape(-1), jnp)


@lowering("lazy.memory_window")
def _window(ctx, self, source, window):
    if not w.numel(window[0]):
        return jnp.zeros(ctx.shape, ctx.dtype)
    return jnp.reshape(self, (-1,))[_positions(source, window)].reshape(ctx.shape)


@lowering("lazy.memory_window_scatter")
def _window_scatter(ctx, self, value, source, window):
    if not w.numel(window[0]):
        return self
    flat = jnp.reshape(self, (-1,))
    flat = flat.at[_positions(source, window)].set(jnp.reshape(value, (-1,)).astype(self.dtype))
    return flat.reshape(self.shape)
