"""Lowerings: N-d convolution (normal and transposed) with its backward, and N-d pooling."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowerings.linalg import accumulation_dtype
from lowerings.registry import LoweringContext, lowering


def _expand(value: Any, n: int) -> tuple[int, ...]:
    """An ``int[n]`` argument as an n-tuple; PyTorch accepts one value for all dimensions."""
    if isinstance(value, (int, np.integer)):
        return (int(value),) * n
    value = tuple(int(v) for v in value)
    return value * n if len(value) == 1 else value


# --------------------------------------------------------------------------------------------
# Convolution
# --------------------------------------------------------------------------------------------


def _conv(
    ctx: LoweringContext,
    lhs: Any,
    rhs: Any,
    *,
    strides: Sequence[int],
    padding: Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    groups: int = 1,
    batch_groups: int = 1,
    specs: tuple[str, str, str] | None = None,
    acc: Any,
) -> Any:
    """One XLA convolution at the node's precision, accumulated in ``acc``."""
    n = lhs.ndim - 2
    if specs is not None:
        specs = lax.conv_dimension_numbers(lhs.shape, rhs.shape, specs)
    return lax.conv_general_dilated(
        lhs,
        rhs,
        window_strides=tuple(strides),
        padding=tuple(padding),
        lhs_dilation=tuple(lhs_dilation or (1,) * n),
        rhs_dilation=tuple(rhs_dilation or (1,) * n),
        dimension_numbers=specs,
        feature_group_count=groups,
        batch_group_count=batch_groups,
        precision=ctx.precision,
        preferred_element_type=acc,
    )


def _transposed_weight(weight: Any, groups: int) -> Any:
    """A transposed conv's ``(C_in, C_out/g, *k)`` weight as the ``(C_out, C_in/g, *k)`` weight
    of the equivalent normal convolution: in/out swapped within each group, kernel flipped."""
    c_in, c_out_g, *k = weight.shape
    w = weight.reshape(groups, c_in // groups, c_out_g, *k)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * c_out_g, c_in // groups, *k)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def _conv_forward(ctx, x, w, stride, padding, dilation, groups, acc):
    return _conv(
        ctx,
        x,
        w,
        strides=stride,
        padding=[(p, p) for p in padding],
        rhs_dilation=dilation,
        groups=groups,
        acc=acc,
    )


def _conv_transpose_forward(ctx, x, w, stride, padding, dilation, output_padding, groups, acc):
    """Transposed convolution as the input-gradient of a normal one: dilate the input by the
    stride and run the flipped, regrouped kernel over it (negative padding crops)."""
    k = w.shape[2:]
    pads = [
        (d * (kk - 1) - p, d * (kk - 1) - p + op)
        for kk, p, d, op in zip(k, padding, dilation, output_padding)
    ]
    return _conv(
        ctx,
        x,
        _transposed_weight(w, groups),
        strides=(1,) * len(k),
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        groups=groups,
        acc=acc,
    )


def _weight_grad(ctx, src, grad, kernel, stride, padding, dilation, groups, acc):
    """``gw[o, i, k] = sum_{n, y} src[n, g(o) * C/g + i, y * s - p + k * d] * grad[n, o, y]``.

    This is the weight gradient of a normal convolution of ``src`` (and, with the roles of input
    and output gradient swapped, of a transposed one). It is itself a convolution over the batch
    dimension: ``src`` and ``grad`` trade batch and feature roles, stride and dilation swap, and
    the groups split the batch (``batch_group_count``) rather than the features.
    """
    n = src.ndim - 2
    spatial = "".join(chr(ord("a") + i) for i in range(n))
    pads = []
    for kk, i, o, s, p, d in zip(kernel, src.shape[2:], grad.shape[2:], stride, padding, dilation):
        # The high padding makes the output exactly the kernel size (negative when the
        # forward convolution never reached the last input elements).
        pads.append((p, (kk - 1) * d + (o - 1) * s + 1 - i - p))
    return _conv(
        ctx,
        src,
        grad,
        strides=dilation,
        padding=pads,
        rhs_dilation=stride,
        batch_groups=groups,
        specs=("CN" + spatial, "IO" + spatial, "CN" + spatial),
        acc=acc,
    )


def _bias_shape(bias: Any, ndim: int) -> Any:
    return bias.reshape((1, -1) + (1,) * (ndim - 2))


@lowering("aten.convolution.default")
def _convolution(
    ctx, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
):
    n = weight.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    acc = accumulation_dtype(ctx.dtype)
    if transposed:
        out = _conv_transpose_forward(
            ctx, input, weight, stride, padding, dilation, _expand(output_padding, n), groups, acc
        )
    else:
        out = _conv_forward(ctx, input, weight, stride, padding, dilation, groups, acc)
    if bias is not None:
        out = out + _bias_shape(bias.astype(acc), out.ndim)
    return out.astype(ctx.dtype)


@lowering("aten.convolution_backward.default")
def _convolution_backward(
    ctx,
    grad_output,
    input,
    weight,
    bias_sizes,
    stride,
    padding,
    dilation,
    transposed,
    output_padding,
    groups,
    output_mask,
):
    n = weight.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    kernel = weight.shape[2:]
    acc = accumulation_dtype(input.dtype)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:
            gi = _conv_forward(ctx, grad_output, weight, stride, padding, dilation, groups, acc)
            # Rows the forward's output_padding added reach no input: drop what they produce.
            gi = gi[(slice(None), slice(None)) + tuple(slice(0, i) for i in input.shape[2:])]
        else:
            # The output padding that makes the transposed conv give back the input's size:
            # input rows the forward strides never reached.
            extra = [
                i - ((o - 1) * s - 2 * p + d * (kk - 1) + 1)
                for i, o, s, p, d, kk in zip(
                    input.shape[2:], grad_output.shape[2:], stride, padding, dilation, kernel
                )
            ]
            gi = _conv_transpose_forward(
                ctx, grad_output, weight, stride, padding, dilation, extra, groups, acc
            )
        grad_input = gi.astype(ctx.dtypes[0])
    if output_mask[1]:
        if transposed:
            gw = _weight_grad(
                ctx, grad_output, input, kernel, stride, padding, dilation, groups, acc
            )
        else:
            gw = _weight_grad(
                ctx, input, grad_output, kernel, stride, padding, dilation, groups, acc
            )
        grad_weight = gw.astype(ctx.dtypes[1])
    if output_mask[2]:
        axes = (0,) + tuple(range(2, grad_output.ndim))
        grad_bias = jnp.sum(grad_output.astype(acc), axis=axes).astype(ctx.dtypes[2])
    return grad_input, grad_weight, grad_bias


# --------------------------------------------------------------------------------------------
# Pooling
#
# A window is described per spatial dimension by a static (out, L) table of input positions and
# a mask of which are real (inside the input and the window). Max pooling gathers the windows and
# reduces over them; flat indices into each input plane come from the same tables, so they are
# compile-time constants.
# --------------------------------------------------------------------------------------------


def _regular_windows(
    sizes: Sequence[int],
    outs: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[np.ndarray, np.ndarray]]:
    tables = []
    for i, o, k, s, p, d in zip(sizes, outs, kernel, stride, padding, dilation):
        pos = np.arange(o)[:, None] * s - p + np.arange(k)[None, :] * d
        tables.append((pos, (pos >= 0) & (pos < i)))
    return tables


def _adaptive_bounds(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.arange(out)
    return (o * size) // out, -((-(o + 1) * size) // out)


def _adaptive_windows(sizes, outs) -> list[tuple[np.ndarray, np.ndarray]]:
    tables = []
    for i, o in zip(sizes, outs):
        start, end = _adaptive_bounds(i, o)
        pos = start[:, None] + np.arange(int(np.max(end - start)))[None, :]
        tables.append((pos, pos < end[:, None]))
    return tables


def _gather_windows(x: Any, tables: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """``x[..., *in]`` -> ``(x[..., *out, L], flat_index[*out, L], valid[*out, L])``."""
    n = len(tables)
    lead = x.ndim - n
    sizes = x.shape[lead:]
    for d, ((pos, _), size) in enumerate(zip(tables, sizes)):
        axis = lead + 2 * d
        x = jnp.take(x, np.clip(pos, 0, size - 1).reshape(-1), axis=axis)
        x = x.reshape(x.shape[:axis] + pos.shape + x.shape[axis + 1 :])
    outs = tuple(pos.shape[0] for pos, _ in tables)
    perm = (
        list(range(lead)) + [lead + 2 * d for d in range(n)] + [lead + 2 * d + 1 for d in range(n)]
    )
    x = jnp.transpose(x, perm).reshape(x.shape[:lead] + outs + (-1,))
    # Index and mask are broadcast from the per-dimension tables rather than spelled out as one
    # (out, L) constant, which would grow the program (and its hash) with the image size.
    flat, valid = jnp.zeros((), jnp.int64), jnp.ones((), bool)
    for d, (pos, mask) in enumerate(tables):
        shape = [1] * (2 * n)
        shape[d], shape[n + d] = pos.shape
        flat = flat + jnp.asarray(pos.reshape(shape) * math.prod(sizes[d + 1 :]), jnp.int64)
        valid = valid & jnp.asarray(mask.reshape(shape))
    return x, flat.reshape(outs + (-1,)), valid.reshape(outs + (-1,))


def _lowest(dtype: np.dtype) -> Any:
    if jnp.issubdtype(dtype, jnp.floating):
        return -np.inf
    return np.iinfo(dtype).min


def _window_max(x: Any, tables: list, index_dtype: Any) -> tuple[Any, Any]:
    """Max and its flat input index per window, with PyTorch's CPU scan semantics: the window is
    scanned in increasing index order and ``val > max or isnan(val)`` takes over, so ties go to
    the first element, NaN to the last NaN, and an all ``-inf`` window to its first element."""
    windows, flat, valid = _gather_windows(x, tables)
    lowest = jnp.asarray(_lowest(x.dtype), x.dtype)
    values = jnp.where(valid, windows, lowest)
    out = jnp.max(values, axis=-1)
    big = np.iinfo(np.int64).max
    first_max = jnp.min(jnp.where(valid & (values == out[..., None]), flat, big), axis=-1)
    index = first_max
    if jnp.issubdtype(x.dtype, jnp.floating):
        last_nan = jnp.max(jnp.where(valid & jnp.isnan(windows), flat, -1), axis=-1)
        index = jnp.where(jnp.isnan(out), last_nan, first_max)
    return out, index.astype(index_dtype)


def _scatter_to_indices(ctx: LoweringContext, grad_output: Any, self: Any, indices: Any, n: int):
    """Scatter-add each output gradient to the input element its recorded index names."""
    acc = accumulation_dtype(ctx.dtype)
    lead = self.shape[:-n]
    planes = math.prod(lead)
    plane = math.prod(self.shape[-n:])
    offsets = (jnp.arange(planes, dtype=indices.dtype) * plane)[:, None]
    flat_index = (indices.reshape(planes, -1) + offsets).reshape(-1)
    grad = jnp.zeros(planes * plane, acc).at[flat_index].add(grad_output.astype(acc).reshape(-1))
    return grad.reshape(ctx.shape).astype(ctx.dtype)


def _max_pool(ctx, self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, *, n):
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n) if len(stride) else kernel
    tables = _regular_windows(
        self.shape[-n:],
        ctx.shapes[0][-n:],
        kernel,
        stride,
        _expand(padding, n),
        _expand(dilation, n),
    )
    out, index = _window_max(self, tables, ctx.dtypes[1])
    return out.astype(ctx.dtypes[0]), index


def _max_pool_backward(
    ctx, grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices, *, n
):
    return _scatter_to_indices(ctx, grad_output, self, indices, n)


def _adaptive_max_pool(ctx, self, output_size, *, n):
    tables = _adaptive_windows(self.shape[-n:], _expand(output_size, n))
    out, index = _window_max(self, tables, ctx.dtypes[1])
    return out.astype(ctx.dtypes[0]), index


def _adaptive_max_pool_backward(ctx, grad_output, self, indices, *, n):
    return _scatter_to_indices(ctx, grad_output, self, indices, n)


def _avg_divisor(sizes, outs, kernel, stride, padding, count_include_pad) -> np.ndarray:
    """PyTorch's per-window divisor: the window clipped to the padded input (count_include_pad)
    or to the input itself; never zero, so empty windows give 0 as in PyTorch."""
    divisor = np.ones((), np.int64)
    for i, o, k, s, p in zip(sizes, outs, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, i + p)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, i)
        divisor = np.multiply.outer(divisor, np.maximum(end - start, 1))
    return divisor


def _avg_pool_sum(x: Any, outs, kernel, stride, padding) -> Any:
    """Window sums over the zero-padded input (``lax.pad`` crops where the high pad is negative,
    i.e. where no window reaches the end of the input)."""
    n = len(kernel)
    lead = x.ndim - n
    pads = [(0, 0, 0)] * lead
    for i, o, k, s, p in zip(x.shape[lead:], outs, kernel, stride, padding):
        pads.append((p, (o - 1) * s + k - i - p, 0))
    # A concrete zero init lets JAX see a plain window sum, which it knows how to differentiate.
    zero = np.zeros((), x.dtype)
    x = lax.pad(x, zero, pads)
    return lax.reduce_window(
        x,
        zero,
        lax.add,
        (1,) * lead + tuple(kernel),
        (1,) * lead + tuple(stride),
        "VALID",
    )


def _avg_pool(
    self, out_shape, n, kernel_size, stride, padding, count_include_pad, divisor_override, acc
):
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n) if len(stride) else kernel
    padding = _expand(padding, n)
    outs = out_shape[-n:]
    total = _avg_pool_sum(self.astype(acc), outs, kernel, stride, padding)
    if divisor_override is not None:
        divisor = np.asarray(divisor_override)
    else:
        divisor = _avg_divisor(self.shape[-n:], outs, kernel, stride, padding, count_include_pad)
    divisor = jnp.asarray(divisor, acc)
    if jnp.issubdtype(acc, jnp.integer):
        # Integer average pooling truncates toward zero, as C++ integer division does.
        return lax.div(total, jnp.broadcast_to(divisor, total.shape))
    return total / divisor


def _avg_pool_forward(
    ctx,
    self,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
    *,
    n,
):
    acc = accumulation_dtype(ctx.dtype)
    out = _avg_pool(
        self, ctx.shape, n, kernel_size, stride, padding, count_include_pad, divisor_override, acc
    )
    return out.astype(ctx.dtype)


def _avg_pool_backward(
    ctx,
    grad_output,
    self,
    kernel_size,
    stride,
    padding,
    ceil_mode,
    count_include_pad,
    divisor_override,
    *,
    n,
):
    acc = accumulation_dtype(ctx.dtype)

    def pool(x):
        return _avg_pool(
            x,
            grad_output.shape,
            n,
            kernel_size,
            stride,
            padding,
            count_include_pad,
            divisor_override,
            acc,
        )

    _, vjp = jax.vjp(pool, self.astype(acc))
    return vjp(grad_output.astype(acc))[0].astype(ctx.dtype)


def _adaptive_avg_pool(x: Any, outs: Sequence[int]) -> Any:
    """Window sums divided by each dimension's window length in turn, as PyTorch's CPU kernel
    does (``sum / kh / kw``)."""
    n = len(outs)
    sizes = x.shape[-n:]
    lead = x.ndim - n
    if all(i % o == 0 for i, o in zip(sizes, outs)):
        split = x.shape[:lead]
        for i, o in zip(sizes, outs):
            split += (o, i // o)
        total = jnp.sum(x.reshape(split), axis=tuple(lead + 2 * d + 1 for d in range(n)))
    else:
        windows, _, valid = _gather_windows(x, _adaptive_windows(sizes, outs))
        total = jnp.sum(jnp.where(valid, windows, jnp.zeros((), x.dtype)), axis=-1)
    for d, (i, o) in enumerate(zip(sizes, outs)):
        start, end = _adaptive_bounds(i, o)
        shape = (o,) + (1,) * (n - d - 1)
        total = total / jnp.asarray((end - start).reshape(shape), x.dtype)
    return total


def _adaptive_avg_pool_forward(ctx, self, output_size, *, n):
    if 0 in ctx.shape or self.size == 0:  # an empty output, or nothing to average
        return (
            jnp.zeros(ctx.shape, ctx.dtype)
            if 0 in ctx.shape
            else jnp.full(ctx.shape, jnp.nan, ctx.dtype)
        )
    acc = accumulation_dtype(ctx.dtype)
    return _adaptive_avg_pool(self.astype(acc), _expand(output_size, n)).astype(ctx.dtype)


def _adaptive_avg_pool_backward(ctx, grad_output, self, *, n):
    if grad_output.size == 0 or self.size == 0:
        return jnp.zeros(ctx.shape, ctx.dtype)
    acc = accumulation_dtype(ctx.dtype)
    outs = grad_output.shape[-n:]
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, outs), self.astype(acc))
    return vjp(grad_output.astype(acc))[0].astype(ctx.dtype)


# The 2d and 3d ops differ only in the number of pooled dimensions, which their (optionally
# unbatched) operands do not tell apart, so each name binds its own n.
for _n in (2, 3):
    for _name, _fn in (
        (f"max_pool{_n}d_with_indices", _max_pool),
        (f"max_pool{_n}d_with_indices_backward", _max_pool_backward),
        (f"avg_pool{_n}d", _avg_pool_forward),
        (f"avg_pool{_n}d_backward", _avg_pool_backward),
        (f"adaptive_max_pool{_n}d", _adaptive_max_pool),
        (f"adaptive_max_pool{_n}d_backward", _adaptive_max_pool_backward),
        (f"_adaptive_avg_pool{_n}d", _adaptive_avg_pool_forward),
        (f"_adaptive_avg_pool{_n}d_backward", _adaptive_avg_pool_backward),
    ):
        lowering(f"aten.{_name}.default")(partial(_fn, n=_n))


# --------------------------------------------------------------------------------------------
# Fractional max pooling: windows start at pseudo-random offsets drawn per plane from
# ``random_samples`` (a ``torch.rand`` of the device RNG), so the window tables are traced values.
# --------------------------------------------------------------------------------------------


def _fractional_starts(sample: Any, size: int, out: int, pool: int) -> Any:
    """PyTorch's interval sequence: ``int((i + u) * alpha) - int(u * alpha)`` in the sample's
    dtype, with ``alpha = (size - pool) / (out - 1)`` and the last window flush with the end."""
    last = jnp.full(sample.shape + (1,), size - pool, jnp.int64)
    if out == 1:
        return last
    dt = sample.dtype
    alpha = jnp.asarray(size - pool, dt) / jnp.asarray(out - 1, dt)
    i = jnp.arange(out - 1, dtype=dt)
    u = sample[..., None]
    starts = ((i + u) * alpha).astype(jnp.int64) - (u * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, last], axis=-1)


def _fractional_max_pool(ctx, self, kernel_size, output_size, random_samples, *, n):
    kernel, outs = _expand(kernel_size, n), _expand(output_size, n)
    lead = self.shape[:-n]
    sizes = self.shape[-n:]
    samples = random_samples.reshape(lead + (n,))
    # The 2-d op reads its samples as (w, h), the 3-d op as (t, h, w).
    order = (1, 0) if n == 2 else (0, 1, 2)
    # Flat plane index of every (output position, window offset), broadcast over the dims.
    flat = jnp.zeros(lead + (1,) * (2 * n), jnp.int64)
    for d in range(n):
        starts = _fractional_starts(samples[..., order[d]], sizes[d], outs[d], kernel[d])
        pos = starts[..., :, None] + jnp.arange(kernel[d], dtype=jnp.int64)
        shape = [1] * (2 * n)
        shape[d], shape[n + d] = outs[d], kernel[d]
        flat = flat + pos.reshape(lead + tuple(shape)) * math.prod(sizes[d + 1 :])
    flat = jnp.broadcast_to(flat, lead + tuple(outs) + tuple(kernel))
    flat = flat.reshape(lead + tuple(outs) + (-1,))
    planes = self.reshape(lead + (-1,))
    windows = jnp.take_along_axis(planes, flat.reshape(lead + (-1,)), axis=-1).reshape(flat.shape)
    # PyTorch's scan: ties go to the first element, NaN to the last NaN in the window.
    out = jnp.max(windows, axis=-1)
    index = jnp.min(jnp.where(windows == out[..., None], flat, np.iinfo(np.int64).max), axis=-1)
    if jnp.issubdtype(self.dtype, jnp.floating):
        # NaN is found separately: XLA:CPU's max reduction can drop NaN on some shapes.
        last_nan = jnp.max(jnp.where(jnp.isnan(windows), flat, -1), axis=-1)
        out = jnp.where(last_nan >= 0, jnp.asarray(jnp.nan, out.dtype), out)
        index = jnp.where(last_nan >= 0, last_nan, index)
    return out.astype(ctx.dtypes[0]), index.astype(ctx.dtypes[1])


def _fractional_max_pool_backward(ctx, grad_output, self, kernel_size, output_size, indices, *, n):
    return _scatter_to_indices(ctx, grad_output, self, indices, n)


for _n in (2, 3):
    lowering(f"aten.fractional_max_pool{_n}d.default")(partial(_fractional_max_pool, n=_n))
    lowering(f"aten.fractional_max_pool{_n}d_backward.default")(
        partial(_fractional_max_pool_backward, n=_n)
    )
