"""Lowerings: resampling (upsample/interpolate, grid_sample, replication/reflection pad) and backwards.

Every resampling forward here is a gather of the input at source positions known when the graph
is built, times weights known at the same time (upsampling, padding) or computed from a tensor
(``grid_sample``). Index and weight tables are computed in numpy with PyTorch's CPU kernel
arithmetic (float32 for float32/half inputs, float64 for float64), so that floor and clamp
decisions land on the same side as in eager. Each ``*_backward`` op is lowered by one rule: the
vector-Jacobian product of its forward lowering (``_BACKWARDS``). Forwards are written so that
JAX's derivative picks PyTorch's subgradient at kinks (``where`` on the branch PyTorch takes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowerings.registry import LOWERINGS, LoweringContext, lowering


def _opmath(dtype: Any) -> np.dtype:
    """The dtype PyTorch's kernels compute in: float64 stays, everything else is float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


# ------------------------------------------------------------------------------------------------
# Per-axis source tables for upsampling: ``(index, weight)`` arrays of shape (out, taps);
# ``weight`` is None for nearest modes (one tap, weight 1).


def _compute_scale(in_size: int, out_size: int, align_corners: bool, scale: Any, dt: type) -> Any:
    """``area_pixel_compute_scale``: input pixels per output pixel."""
    if align_corners:
        return dt(in_size - 1) / dt(out_size - 1) if out_size > 1 else dt(0)
    if scale is not None and scale > 0:
        return dt(1.0 / scale)
    return dt(in_size) / dt(out_size)


def _source_index(scale: Any, dt: type, out_size: int, align_corners: bool, cubic: bool) -> Any:
    """``area_pixel_compute_source_index`` for every output position."""
    dst = np.arange(out_size).astype(dt)
    if align_corners:
        return scale * dst
    src = scale * (dst + dt(0.5)) - dt(0.5)
    return src if cubic else np.maximum(src, dt(0))


def _guard(src: Any, in_size: int, dt: type) -> tuple[Any, Any]:
    """``guard_index_and_lambda``: the floor index (at most in_size - 1) and the fraction past it."""
    index = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    frac = np.clip(src - index.astype(dt), dt(0), dt(1)).astype(dt)
    return index, frac


def _nearest_table(in_size: int, out_size: int, scale: Any, exact: bool, dt: type) -> tuple:
    f32 = np.float32
    s = f32(1.0 / scale) if scale is not None and scale > 0 else f32(in_size) / f32(out_size)
    dst = np.arange(out_size)
    if exact:
        # (dst + 0.5) is a double in the kernel; the product is rounded to float for floorf.
        src = np.floor(((dst + 0.5) * np.float64(s)).astype(f32))
    elif out_size == in_size:
        src = dst
    elif out_size == 2 * in_size:
        src = dst >> 1
    else:
        src = np.floor(dst.astype(f32) * s)
    return np.minimum(src.astype(np.int64), in_size - 1)[:, None], None


def _linear_table(in_size, out_size, scale, align_corners, dt):
    if in_size == out_size:
        return np.arange(out_size)[:, None], np.ones((out_size, 1), dt)
    s = _compute_scale(in_size, out_size, align_corners, scale, dt)
    i0, frac = _guard(_source_index(s, dt, out_size, align_corners, cubic=False), in_size, dt)
    i1 = i0 + (i0 < in_size - 1)
    return np.stack([i0, i1], 1), np.stack([dt(1) - frac, frac], 1)


def _cubic1(x, a):
    return ((a + 2) * x - (a + 3)) * x * x + 1


def _cubic2(x, a):
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a


_CUBIC_A = -0.75


def _cubic_table(in_size, out_size, scale, align_corners, dt):
    s = _compute_scale(in_size, out_size, align_corners, scale, dt)
    i0, t = _guard(_source_index(s, dt, out_size, align_corners, cubic=True), in_size, dt)
    a = dt(_CUBIC_A)
    one = dt(1)
    weights = np.stack([_cubic2(t + one, a), _cubic1(t, a), _cubic1(one - t, a), _cubic2(2 - t, a)])
    index = np.clip(i0[None, :] + np.arange(-1, 3)[:, None], 0, in_size - 1)
    return index.T, weights.T.astype(dt)


def _aa_linear_filter(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0)


def _aa_cubic_filter(x):
    # The antialiased cubic uses Keys' a = -0.5 (as PIL does), not the -0.75 of plain bicubic.
    x = np.abs(x)
    return np.where(x < 1, _cubic1(x, -0.5), np.where(x < 2, _cubic2(x, -0.5), 0))


def _aa_table(in_size, out_size, scale, align_corners, dt, taps, kernel):
    """Antialiased weights: the filter stretched by the downscale factor, normalized per output."""
    s = _compute_scale(in_size, out_size, align_corners, scale, dt)
    support = (taps * 0.5) * s if s >= 1 else dt(taps * 0.5)
    support = dt(support)
    width = math.ceil(support) * 2 + 1
    invscale = dt(1) / s if s >= 1 else dt(1)
    index = np.zeros((out_size, width), np.int64)
    weight = np.zeros((out_size, width), dt)
    # The kernel mixes float and double: (i + 0.5) and the + 0.5 terms are doubles.
    for i in range(out_size):
        center = dt(np.float64(s) * (i + 0.5))
        lo = max(int(np.float64(center - support) + 0.5), 0)
        size = min(int(np.float64(center + support) + 0.5), in_size) - lo
        size = min(max(size, 0), width)
        j = np.arange(size)
        offset = (j + lo).astype(dt) - center
        w = kernel(((offset.astype(np.float64) + 0.5) * np.float64(invscale)).astype(dt)).astype(dt)
        total = w.sum(dtype=dt)
        index[i, :size] = j + lo
        weight[i, :size] = w / total if total != 0 else w
    return index, weight


_TABLES: dict[str, Callable[..., tuple]] = {
    "nearest": lambda i, o, s, ac, dt: _nearest_table(i, o, s, False, dt),
    "nearest_exact": lambda i, o, s, ac, dt: _nearest_table(i, o, s, True, dt),
    "linear": _linear_table,
    "cubic": _cubic_table,
    "linear_aa": lambda *a: _aa_table(*a, 2, _aa_linear_filter),
    "cubic_aa": lambda *a: _aa_table(*a, 4, _aa_cubic_filter),
}


def _gather_axis(x: Any, axis: int, index: Any, weight: Any) -> Any:
    """``sum_k x.take(index[:, k], axis) * weight[:, k]``, the weight broadcast along ``axis``."""
    if weight is None:
        return jnp.take(x, jnp.asarray(index[:, 0]), axis=axis, mode="clip")
    shape = [1] * x.ndim
    shape[axis] = index.shape[0]
    out = None
    for k in range(index.shape[1]):
        w = jnp.asarray(weight[:, k].reshape(shape), x.dtype)
        term = jnp.take(x, jnp.asarray(index[:, k]), axis=axis, mode="clip") * w
        out = term if out is None else out + term
    return out


def _upsample(ctx: LoweringContext, x: Any, mode: str, align_corners: bool, scales: Any) -> Any:
    """Resample the trailing dims of ``x`` to ``ctx.shape``'s, one axis at a time."""
    out_sizes = ctx.shape[2:]
    scales = tuple(scales) if scales is not None else (None,) * len(out_sizes)
    nearest = mode.startswith("nearest")
    dt = _opmath(x.dtype).type
    y = x if nearest else x.astype(dt)
    for k, (out_size, scale) in enumerate(zip(out_sizes, scales)):
        axis = 2 + k
        index, weight = _TABLES[mode](x.shape[axis], out_size, scale, align_corners, dt)
        y = _gather_axis(y, axis, index, weight)
    return y.astype(ctx.dtype)


# aten name -> (mode, takes align_corners)
_UPSAMPLES = {
    "upsample_nearest1d": ("nearest", False),
    "upsample_nearest2d": ("nearest", False),
    "upsample_nearest3d": ("nearest", False),
    "_upsample_nearest_exact1d": ("nearest_exact", False),
    "_upsample_nearest_exact2d": ("nearest_exact", False),
    "_upsample_nearest_exact3d": ("nearest_exact", False),
    "upsample_linear1d": ("linear", True),
    "upsample_bilinear2d": ("linear", True),
    "upsample_trilinear3d": ("linear", True),
    "upsample_bicubic2d": ("cubic", True),
    "_upsample_bilinear2d_aa": ("linear_aa", True),
    "_upsample_bicubic2d_aa": ("cubic_aa", True),
}


def _register_upsample(name: str, mode: str, aligned: bool) -> None:
    if aligned:

        @lowering(f"aten.{name}.default")
        def forward(ctx, x, output_size, align_corners, *scales):
            return _upsample(ctx, x, mode, align_corners, scales or None)

        @lowering(f"aten.{name}.vec")
        def forward_vec(ctx, x, output_size, align_corners, scale_factors):
            return _upsample(ctx, x, mode, align_corners, scale_factors)

    else:

        @lowering(f"aten.{name}.default")
        def forward(ctx, x, output_size, *scales):
            return _upsample(ctx, x, mode, False, scales or None)

        @lowering(f"aten.{name}.vec")
        def forward_vec(ctx, x, output_size, scale_factors):
            return _upsample(ctx, x, mode, False, scale_factors)


for _name, (_mode, _aligned) in _UPSAMPLES.items():
    _register_upsample(_name, _mode, _aligned)


# ------------------------------------------------------------------------------------------------
# Replication and reflection padding: a gather along each padded axis. Negative padding crops.


def _pad_index(in_size: int, before: int, after: int, reflect: bool) -> Any:
    src = np.arange(in_size + before + after) - before
    if reflect:
        src = np.abs(src)
        src = np.where(src > in_size - 1, 2 * (in_size - 1) - src, src)
    return np.clip(src, 0, in_size - 1)


def _register_pad(name: str, dims: int, reflect: bool) -> None:
    @lowering(f"aten.{name}.default")
    def forward(ctx, x, padding):
        for k in range(dims):
            axis = x.ndim - 1 - k
            index = _pad_index(x.shape[axis], padding[2 * k], padding[2 * k + 1], reflect)
            x = jnp.take(x, jnp.asarray(index), axis=axis, mode="clip")
        return x


for _dims in (1, 2, 3):
    _register_pad(f"replication_pad{_dims}d", _dims, reflect=False)
    _register_pad(f"reflection_pad{_dims}d", _dims, reflect=True)


# ------------------------------------------------------------------------------------------------
# grid_sample: interpolation_mode 0 bilinear, 1 nearest, 2 bicubic; padding_mode 0 zeros,
# 1 border, 2 reflection. The grid's last dim holds (x, y[, z]) for the (W, H[, D]) axes.


def _clip(x: Any, size: int) -> Any:
    # Borders count as out of range for the gradient (grad 0), as in aten.
    return jnp.where(x <= 0, 0, jnp.where(x >= size - 1, size - 1, x)).astype(x.dtype)


def _reflect(x: Any, twice_low: int, twice_high: int) -> Any:
    if twice_low == twice_high:
        return jnp.zeros_like(x)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = x - low
    x = jnp.where(x < 0, -x, x)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(x / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(x: Any, size: int, padding_mode: int, align_corners: bool) -> Any:
    if padding_mode == 1:
        return _clip(x, size)
    if padding_mode == 2:
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        return _clip(x, size)
    return x


def _unnormalize(coord: Any, size: int, align_corners: bool) -> Any:
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _corner_weights(t: Any, mode: int) -> list[Any]:
    """Weights of the taps at floor(x) + offset for fraction ``t``, offsets from ``_OFFSETS``."""
    if mode == 0:
        return [1 - t, t]
    a = _CUBIC_A
    return [_cubic2(t + 1, a), _cubic1(t, a), _cubic1(1 - t, a), _cubic2(2 - t, a)]


_OFFSETS = {0: (0, 1), 2: (-1, 0, 1, 2)}


def _grid_sample(ctx, x, grid, mode, padding_mode, align_corners):
    dt = _opmath(ctx.dtype)
    x, grid = x.astype(dt), grid.astype(dt)
    n, c, *sizes = x.shape
    nd = len(sizes)
    flat = x.reshape(n, c, -1)
    out_spatial = grid.shape[1:-1]
    # coords[k] indexes spatial axis k (grid's last dim is in reverse axis order).
    coords = [_unnormalize(grid[..., nd - 1 - k], sizes[k], align_corners) for k in range(nd)]
    if mode != 2:
        coords = [_pad_coordinate(v, s, padding_mode, align_corners) for v, s in zip(coords, sizes)]
    if mode == 1:
        taps = [[(jnp.round(v), None)] for v in coords]
    else:
        taps = []
        for v, s in zip(coords, sizes):
            base = jnp.floor(v)
            ws = _corner_weights(v - base, mode)
            taps.append([(base + o, w) for o, w in zip(_OFFSETS[mode], ws)])
    out = jnp.zeros((n, c, math.prod(out_spatial)), dt)
    for corner in itertools.product(*taps):
        inside = jnp.ones(grid.shape[:-1], bool)
        linear = jnp.zeros(grid.shape[:-1], jnp.int64)
        weight = jnp.ones(grid.shape[:-1], dt)
        for k, (pos, w) in enumerate(corner):
            if mode == 2:
                # Bicubic pads each tap's position, not the sampling point.
                pos = _pad_coordinate(pos, sizes[k], padding_mode, align_corners)
            pos = jnp.trunc(pos)
            inside &= (pos >= 0) & (pos <= sizes[k] - 1)
            idx = jnp.clip(pos, 0, sizes[k] - 1).astype(jnp.int64)
            linear = linear * sizes[k] + idx
            if w is not None:
                weight = weight * w
        weight = jnp.where(inside, weight, 0).reshape(n, 1, -1)
        values = jnp.take_along_axis(flat, linear.reshape(n, 1, -1), axis=2, mode="clip")
        out = out + values * weight
    return out.reshape(n, c, *out_spatial).astype(ctx.dtype)


lowering("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default")(_grid_sample)


# ------------------------------------------------------------------------------------------------
# aten._trilinear (nn.functional.bilinear): unsqueeze each operand at its expand dims, multiply,
# sum over sumdim. Written as one einsum so the broadcast product is never materialized.


@lowering("aten._trilinear.default")
def _trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    ops = [jnp.expand_dims(t, tuple(e)) for t, e in zip((i1, i2, i3), (expand1, expand2, expand3))]
    total = ops[0].ndim
    # A dim's size is its one non-1 size (0 included): size-1 operands broadcast along it.
    sizes = [next((o.shape[d] for o in ops if o.shape[d] != 1), 1) for d in range(total)]
    letters = [chr(ord("a") + d) for d in range(total)]
    subscripts, operands = [], []
    for o in ops:
        keep = [d for d in range(total) if o.shape[d] == sizes[d]]
        operands.append(o.reshape([o.shape[d] for d in keep]))
        subscripts.append("".join(letters[d] for d in keep))
    out = "".join(letters[d] for d in range(total) if d not in set(sumdim))
    spec = ",".join(subscripts) + "->" + out
    result = jnp.einsum(spec, *operands, precision=ctx.precision)
    return jnp.broadcast_to(result, ctx.shape).astype(ctx.dtype)


# ------------------------------------------------------------------------------------------------
# Backward ops: the vector-Jacobian product of the forward lowering.


def _upsample_unpack(grad_output, output_size, input_size, *rest):
    """(grad_output, output_size, input_size, *rest) -> forward args (input, output_size, *rest)."""
    primal = jnp.zeros(tuple(input_size), grad_output.dtype)
    return grad_output, (primal, output_size, *rest), (0,), (True,)


def _pad_unpack(grad_output, x, padding):
    return grad_output, (x, padding), (0,), (True,)


def _grid_unpack(grad_output, x, grid, mode, padding_mode, align_corners, output_mask):
    return grad_output, (x, grid, mode, padding_mode, align_corners), (0, 1), tuple(output_mask)


def _register_vjp(backward: str, forward: str, unpack: Callable[..., tuple]) -> None:
    """Lower ``backward`` as ``jax.vjp`` of ``forward``'s lowering.

    ``unpack(*backward_args)`` gives ``(grad_output, forward_args, wrt, output_mask)``: the
    cotangent, the forward's arguments, which of them the outputs are gradients of, and which
    outputs the op produces (None for the others).
    """
    forward_fn = LOWERINGS[forward]

    @lowering(backward)
    def lower(ctx, *args):
        grad_output, fargs, wrt, mask = unpack(*args)
        fctx = LoweringContext(shapes=(grad_output.shape,), dtypes=(grad_output.dtype.name,))

        def f(*diff):
            full = list(fargs)
            for i, d in zip(wrt, diff):
                full[i] = d
            return forward_fn(fctx, *full)

        primals = [fargs[i] for i in wrt]
        _, pullback = jax.vjp(f, *primals)
        grads = pullback(grad_output)
        outs = tuple(g.astype(dtype) if m else None for g, m, dtype in zip(grads, mask, ctx.dtypes))
        return outs if len(outs) > 1 else outs[0]


_BACKWARDS: dict[str, tuple[str, Callable[..., tuple]]] = {
    **{
        f"aten.{name}_backward.default": (f"aten.{name}.default", _upsample_unpack)
        for name in _UPSAMPLES
    },
    **{
        f"aten.{kind}_pad{d}d_backward.default": (f"aten.{kind}_pad{d}d.default", _pad_unpack)
        for kind in ("replication", "reflection")
        for d in (1, 2, 3)
    },
    "aten.grid_sampler_2d_backward.default": ("aten.grid_sampler_2d.default", _grid_unpack),
    "aten.grid_sampler_3d_backward.default": ("aten.grid_sampler_3d.default", _grid_unpack),
}

for _backward, (_forward, _unpack) in _BACKWARDS.items():
    _register_vjp(_backward, _forward, _unpack)
