"""Lowerings: batch, layer, group and RMS normalization with their backward ops.

Statistics and the normalized values are computed in float32 for bfloat16/float16 inputs (float64
stays float64), as PyTorch's CPU kernels do, and cast once to the node's output dtypes.

``native_batch_norm`` and ``_native_batch_norm_legit`` update ``running_mean``/``running_var`` in
place in eager PyTorch. The IR holds no mutation, so their lowerings return only the three aten
outputs; the running-stat update is expressed by the functional variants
(``_native_batch_norm_legit_functional``, ``_batch_norm_with_update_functional``), whose extra
outputs are the new running statistics, and by the lazy layer's in-place substitution.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
from jax import lax

from lowerings.registry import lowering


def _acc_dtype(x: Any) -> Any:
    """The dtype PyTorch accumulates ``x`` in: float32 for half types, else the dtype itself."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _fit(ctx: Any, i: int, value: Any) -> Any:
    """Output ``i`` in the node's shape and dtype; aten's undefined/empty outputs become empty."""
    shape, dtype = ctx.shapes[i], ctx.dtypes[i]
    if value is None or math.prod(shape) == 0:
        return jnp.zeros(shape, dtype)
    return jnp.reshape(value, shape).astype(dtype)


def _masked(ctx: Any, output_mask: tuple[bool, ...], values: tuple[Any, ...]) -> tuple[Any, ...]:
    """Backward outputs: None where ``output_mask`` asks for no gradient (an undefined tensor)."""
    return tuple(
        _fit(ctx, i, v) if wanted else None
        for i, (wanted, v) in enumerate(zip(output_mask, values))
    )


# ------------------------------------------------------------------------------------------------
# Batch norm: channels are dim 1, statistics reduce over every other dim.


def _channel(v: Any, ndim: int, dtype: Any) -> Any:
    """A per-channel vector ``(C,)`` shaped to broadcast against an ``(N, C, *)`` input."""
    return jnp.reshape(v, (1, -1) + (1,) * (ndim - 2)).astype(dtype)


def _bn_axes(x: Any) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """All batch-norm results by name; each aten variant picks the ones it returns."""
    acc = _acc_dtype(x)
    xf = x.astype(acc)
    axes = _bn_axes(x)
    new_mean, new_var = running_mean, running_var
    if training:
        mean = jnp.mean(xf, axes)
        var = jnp.mean(jnp.square(xf - _channel(mean, x.ndim, acc)), axes)
        invstd = lax.rsqrt(var + eps)
        n = x.size // x.shape[1]
        # The running variance takes the unbiased estimate although normalization uses the
        # biased one, as PyTorch does.
        if running_mean is not None:
            new_mean = momentum * mean + (1 - momentum) * running_mean.astype(acc)
        if running_var is not None:
            # One value per channel gives aten's 0 / 0 = nan.
            unbiased = var * (n / (n - 1)) if n > 1 else var * jnp.inf
            new_var = momentum * unbiased + (1 - momentum) * running_var.astype(acc)
        saved_mean, saved_invstd = mean, invstd
    else:
        mean = running_mean.astype(acc)
        invstd = lax.rsqrt(running_var.astype(acc) + eps)
        saved_mean = saved_invstd = None
    out = (xf - _channel(mean, x.ndim, acc)) * _channel(invstd, x.ndim, acc)
    if weight is not None:
        out = out * _channel(weight, x.ndim, acc)
    if bias is not None:
        out = out + _channel(bias, x.ndim, acc)
    return {
        "out": out,
        "save_mean": saved_mean,
        "save_invstd": saved_invstd,
        "reserve": None,
        "running_mean": new_mean,
        "running_var": new_var,
    }


_SAVED = ("out", "save_mean", "save_invstd")
_FUNCTIONAL = _SAVED + ("running_mean", "running_var")


def _pick(ctx, names, results):
    return tuple(_fit(ctx, i, results[name]) for i, name in enumerate(names))


@lowering("aten.native_batch_norm.default", "aten._native_batch_norm_legit.default")
def _native_batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    results = _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return _pick(ctx, _SAVED, results)


@lowering("aten._native_batch_norm_legit_functional.default")
def _batch_norm_functional(
    ctx, x, weight, bias, running_mean, running_var, training, momentum, eps
):
    results = _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)
    return _pick(ctx, _FUNCTIONAL, results)


@lowering("aten._native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(ctx, x, weight, bias, training, momentum, eps):
    return _pick(ctx, _SAVED, _batch_norm(x, weight, bias, None, None, training, momentum, eps))


@lowering("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    results = _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return _pick(ctx, _SAVED, results)


@lowering("aten._batch_norm_with_update_functional.default")
def _batch_norm_with_update(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    results = _batch_norm(x, weight, bias, running_mean, running_var, True, momentum, eps)
    return _pick(ctx, _SAVED + ("reserve", "running_mean", "running_var"), results)


@lowering("aten._batch_norm_no_update.default")
def _batch_norm_no_update(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    results = _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return _pick(ctx, _SAVED + ("reserve",), results)


def _batch_norm_grads(
    grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps
):
    acc = _acc_dtype(x)
    xf, dy = x.astype(acc), grad_out.astype(acc)
    axes = _bn_axes(x)
    if train:
        mean, invstd = save_mean.astype(acc), save_invstd.astype(acc)
    else:
        mean, invstd = running_mean.astype(acc), lax.rsqrt(running_var.astype(acc) + eps)
    centered = xf - _channel(mean, x.ndim, acc)
    sum_dy = jnp.sum(dy, axes)
    dot = jnp.sum(dy * centered, axes)
    scale = invstd if weight is None else invstd * weight.astype(acc)
    if train:
        n = x.size // x.shape[1]
        proj = centered * _channel(dot * invstd * invstd / n, x.ndim, acc)
        grad_input = (dy - proj - _channel(sum_dy / n, x.ndim, acc)) * _channel(scale, x.ndim, acc)
    else:
        grad_input = dy * _channel(scale, x.ndim, acc)
    return grad_input, dot * invstd, sum_dy


@lowering("aten.native_batch_norm_backward.default")
def _native_batch_norm_backward(
    ctx, grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, mask
):
    grads = _batch_norm_grads(
        grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps
    )
    return _masked(ctx, mask, grads)


@lowering("aten.batch_norm_backward.default")
def _batch_norm_backward(
    ctx, grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps, mask, _
):
    # Despite its name, ``save_var`` holds the saved inverse standard deviation. The last
    # argument, cuDNN's reserve space, means nothing here.
    grads = _batch_norm_grads(
        grad_out, x, weight, running_mean, running_var, save_mean, save_var, update, eps
    )
    return _masked(ctx, mask, grads)


# ------------------------------------------------------------------------------------------------
# Layer norm and RMS norm: statistics over the trailing ``normalized_shape`` dims.


def _trailing(x: Any, normalized_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def _stat_shape(x: Any, normalized_shape: tuple[int, ...]) -> tuple[int, ...]:
    lead = x.ndim - len(normalized_shape)
    return tuple(x.shape[:lead]) + (1,) * len(normalized_shape)


def _lead_sum(v: Any, normalized_shape: tuple[int, ...]) -> Any:
    """``v`` summed over the leading (non-normalized) dims: a weight's or bias's gradient."""
    return jnp.sum(v, tuple(range(v.ndim - len(normalized_shape))))


@lowering("aten.native_layer_norm.default")
def _native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    acc = _acc_dtype(x)
    xf = x.astype(acc)
    axes = _trailing(x, normalized_shape)
    mean = jnp.mean(xf, axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight.astype(acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return _fit(ctx, 0, out), _fit(ctx, 1, mean), _fit(ctx, 2, rstd)


@lowering("aten.native_layer_norm_backward.default")
def _native_layer_norm_backward(
    ctx, grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask
):
    acc = _acc_dtype(x)
    xf, dy = x.astype(acc), grad_out.astype(acc)
    axes = _trailing(x, normalized_shape)
    stat_shape = _stat_shape(x, normalized_shape)
    rstd = jnp.reshape(rstd, stat_shape).astype(acc)
    xhat = (xf - jnp.reshape(mean, stat_shape).astype(acc)) * rstd
    g = dy if weight is None else dy * weight.astype(acc)
    grad_input = rstd * (
        g - jnp.mean(g, axes, keepdims=True) - xhat * jnp.mean(g * xhat, axes, keepdims=True)
    )
    grad_weight = _lead_sum(dy * xhat, normalized_shape)
    grad_bias = _lead_sum(dy, normalized_shape)
    return _masked(ctx, output_mask, (grad_input, grad_weight, grad_bias))


def _rms_eps(x: Any, eps: float | None) -> float:
    # PyTorch's default is the machine epsilon of the compute dtype, not of the input dtype.
    return float(jnp.finfo(_acc_dtype(x)).eps) if eps is None else eps


@lowering("aten._fused_rms_norm.default")
def _fused_rms_norm(ctx, x, normalized_shape, weight, eps):
    acc = _acc_dtype(x)
    xf = x.astype(acc)
    axes = _trailing(x, normalized_shape)
    rstd = lax.rsqrt(jnp.mean(jnp.square(xf), axes, keepdims=True) + _rms_eps(x, eps))
    out = xf * rstd
    if weight is not None:
        out = out * weight.astype(acc)
    return _fit(ctx, 0, out), _fit(ctx, 1, rstd)


@lowering("aten._fused_rms_norm_backward.default")
def _fused_rms_norm_backward(ctx, grad_out, x, normalized_shape, rstd, weight, output_mask):
    acc = _acc_dtype(x)
    xf, dy = x.astype(acc), grad_out.astype(acc)
    axes = _trailing(x, normalized_shape)
    rstd = jnp.reshape(rstd, _stat_shape(x, normalized_shape)).astype(acc)
    xhat = xf * rstd
    g = dy if weight is None else dy * weight.astype(acc)
    grad_input = rstd * (g - xhat * jnp.mean(g * xhat, axes, keepdims=True))
    return _masked(ctx, output_mask, (grad_input, _lead_sum(dy * xhat, normalized_shape)))


# ------------------------------------------------------------------------------------------------
# Group norm: ``(N, C, *)`` viewed as ``(N, group, C // group * HxW)``; statistics per (n, group).


@lowering("aten.native_group_norm.default")
def _native_group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    acc = _acc_dtype(x)
    xg = jnp.reshape(x.astype(acc), (n, group, -1))
    mean = jnp.mean(xg, -1, keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), -1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = jnp.reshape((xg - mean) * rstd, (n, c, hxw))
    if weight is not None:
        out = out * jnp.reshape(weight, (1, c, 1)).astype(acc)
    if bias is not None:
        out = out + jnp.reshape(bias, (1, c, 1)).astype(acc)
    return _fit(ctx, 0, out), _fit(ctx, 1, mean), _fit(ctx, 2, rstd)


@lowering("aten.native_group_norm_backward.default")
def _native_group_norm_backward(
    ctx, grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask
):
    acc = _acc_dtype(x)
    dy = jnp.reshape(grad_out.astype(acc), (n, c, hxw))
    mean = jnp.reshape(mean, (n, group, 1)).astype(acc)
    rstd = jnp.reshape(rstd, (n, group, 1)).astype(acc)
    xhat_g = (jnp.reshape(x.astype(acc), (n, group, -1)) - mean) * rstd
    g = dy if weight is None else dy * jnp.reshape(weight, (1, c, 1)).astype(acc)
    g = jnp.reshape(g, (n, group, -1))
    grad_input = rstd * (
        g - jnp.mean(g, -1, keepdims=True) - xhat_g * jnp.mean(g * xhat_g, -1, keepdims=True)
    )
    xhat = jnp.reshape(xhat_g, (n, c, hxw))
    grad_weight = jnp.sum(dy * xhat, (0, 2))
    grad_bias = jnp.sum(dy, (0, 2))
    return _masked(ctx, output_mask, (grad_input, grad_weight, grad_bias))
