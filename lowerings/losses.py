"""Lowerings: loss functions (nll, mse, smooth L1, Huber, BCE, soft margin) and their backward ops.

``reduction`` is aten's int: 0 none, 1 mean, 2 sum. Elementwise terms are computed in float32 for
bfloat16/float16 inputs and rounded to the input dtype before a reduction, which accumulates in
float32: the order PyTorch's CPU kernels use. ``l1_loss`` and ``kl_div`` are composite in PyTorch
(they decompose before dispatch), so no lowering is registered for them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from lowerings.registry import lowering

_NONE, _MEAN, _SUM = 0, 1, 2


def _acc(*xs: Any) -> tuple[Any, ...]:
    """``xs`` in their common compute dtype (float32 for half types); ``None`` stays ``None``."""
    dtype = jnp.promote_types(jnp.result_type(*(x for x in xs if x is not None)), jnp.float32)
    return tuple(None if x is None else jnp.asarray(x).astype(dtype) for x in xs)


def _reduce(ctx: Any, loss: Any, reduction: int) -> Any:
    loss = loss.astype(ctx.dtype)
    if reduction == _MEAN:
        loss = jnp.mean(loss)
    elif reduction == _SUM:
        loss = jnp.sum(loss)
    return loss.astype(ctx.dtype)


def _grad_scale(grad_output: Any, x: Any, reduction: int) -> Any:
    """The incoming gradient per element of ``x``: mean spreads it over every element."""
    return grad_output / x.size if reduction == _MEAN else grad_output


def _backward_result(ctx: Any, grad: Any) -> Any:
    return jnp.broadcast_to(grad, ctx.shape).astype(ctx.dtype)


# ------------------------------------------------------------------------------------------------
# Pointwise regression losses: one table entry gives the loss term and its derivative in
# ``d = input - target``; the lowering and its backward are built from it.


def _mse(d, _):
    return d * d


def _mse_grad(d, _):
    return 2 * d


def _smooth_l1(d, beta):
    z = jnp.abs(d)
    return jnp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta)


def _smooth_l1_grad(d, beta):
    # The comparisons are non-strict, so beta == 0 gives sign(d) with -1 at d == 0, as in aten.
    return jnp.where(d <= -beta, -1.0, jnp.where(d >= beta, 1.0, d / beta))


def _huber(d, delta):
    z = jnp.abs(d)
    return jnp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta))


def _huber_grad(d, delta):
    return jnp.where(d <= -delta, -delta, jnp.where(d >= delta, delta, d))


_POINTWISE = {
    "mse_loss": (_mse, _mse_grad, None),
    "smooth_l1_loss": (_smooth_l1, _smooth_l1_grad, 1.0),
    "huber_loss": (_huber, _huber_grad, 1.0),
}


def _register_pointwise(name: str, term: Any, grad: Any, default: float | None) -> None:
    @lowering(f"aten.{name}.default")
    def forward(ctx, x, target, reduction=_MEAN, param=default):
        x, target = _acc(x, target)
        return _reduce(ctx, term(x - target, param), reduction)

    @lowering(f"aten.{name}_backward.default")
    def backward(ctx, grad_output, x, target, reduction, param=default):
        grad_output, x, target = _acc(grad_output, x, target)
        return _backward_result(
            ctx, _grad_scale(grad_output, x, reduction) * grad(x - target, param)
        )


for _name, (_term, _grad, _default) in _POINTWISE.items():
    _register_pointwise(_name, _term, _grad, _default)


# ------------------------------------------------------------------------------------------------
# Binary classification losses


# aten clamps log terms at -100 so that a probability of exactly 0 or 1 gives a finite loss.
_LOG_FLOOR = -100.0
_BCE_EPSILON = 1e-12


@lowering("aten.binary_cross_entropy.default")
def _binary_cross_entropy(ctx, x, target, weight=None, reduction=_MEAN):
    x, target, weight = _acc(x, target, weight)
    loss = (target - 1) * jnp.maximum(jnp.log1p(-x), _LOG_FLOOR) - target * jnp.maximum(
        jnp.log(x), _LOG_FLOOR
    )
    if weight is not None:
        loss = loss * weight
    return _reduce(ctx, loss, reduction)


@lowering("aten.binary_cross_entropy_backward.default")
def _binary_cross_entropy_backward(ctx, grad_output, x, target, weight=None, reduction=_MEAN):
    grad_output, x, target, weight = _acc(grad_output, x, target, weight)
    grad = (x - target) / jnp.maximum((1 - x) * x, _BCE_EPSILON)
    if weight is not None:
        grad = grad * weight
    return _backward_result(ctx, _grad_scale(grad_output, x, reduction) * grad)


@lowering("aten.binary_cross_entropy_with_logits.default")
def _binary_cross_entropy_with_logits(
    ctx, x, target, weight=None, pos_weight=None, reduction=_MEAN
):
    x, target, weight, pos_weight = _acc(x, target, weight, pos_weight)
    # log_sigmoid keeps large |x| finite where log(sigmoid(x)) would not.
    log_sigmoid = jax.nn.log_sigmoid(x)
    if pos_weight is not None:
        log_sigmoid = ((pos_weight - 1) * target + 1) * log_sigmoid
    loss = (1 - target) * x - log_sigmoid
    if weight is not None:
        loss = loss * weight
    return _reduce(ctx, loss, reduction)


@lowering("aten.soft_margin_loss.default")
def _soft_margin_loss(ctx, x, target, reduction=_MEAN):
    x, target = _acc(x, target)
    return _reduce(ctx, jnp.log1p(jnp.exp(-target * x)), reduction)


@lowering("aten.soft_margin_loss_backward.default")
def _soft_margin_loss_backward(ctx, grad_output, x, target, reduction):
    grad_output, x, target = _acc(grad_output, x, target)
    z = jnp.exp(-target * x)
    return _backward_result(ctx, _grad_scale(grad_output, x, reduction) * (-target * z / (1 + z)))


# ------------------------------------------------------------------------------------------------
# Negative log likelihood: the class dim is 1 (0 for a single unbatched sample). ``nll_loss2d``
# is the same computation for ``(N, C, H, W)`` inputs.


def _class_axis(x: Any) -> int:
    return 0 if x.ndim == 1 else 1


def _target_weights(target, weight, ignore_index, dtype):
    """Per-target class weight (0 where ignored) and a target safe to index with."""
    ignored = target == ignore_index
    safe = jnp.where(ignored, 0, target)
    w = jnp.ones(safe.shape, dtype) if weight is None else jnp.take(weight, safe, mode="clip")
    return jnp.where(ignored, 0, w.astype(dtype)), safe


@lowering("aten.nll_loss_forward.default", "aten.nll_loss2d_forward.default")
def _nll_loss_forward(ctx, x, target, weight, reduction, ignore_index):
    dtype = ctx.dtypes[0]
    (xf,) = _acc(x)
    w, safe = _target_weights(target, weight, ignore_index, xf.dtype)
    axis = _class_axis(x)
    picked = jnp.squeeze(
        jnp.take_along_axis(xf, jnp.expand_dims(safe, axis), axis, mode="clip"), axis
    )
    losses = (-w * picked).astype(dtype)
    if reduction == _NONE and x.ndim > 1:
        # aten leaves total_weight at 0 when it returns per-sample losses.
        return losses, jnp.zeros(ctx.shapes[1], ctx.dtypes[1])
    total_weight = jnp.sum(w)
    loss = jnp.sum(losses.astype(xf.dtype))
    if reduction == _MEAN:
        loss = loss / total_weight
    return loss.astype(dtype), total_weight.astype(ctx.dtypes[1])


@lowering("aten.nll_loss_backward.default", "aten.nll_loss2d_backward.default")
def _nll_loss_backward(ctx, grad_output, x, target, weight, reduction, ignore_index, total_weight):
    (grad_output,) = _acc(grad_output)
    w, safe = _target_weights(target, weight, ignore_index, grad_output.dtype)
    if reduction == _MEAN:
        grad_output = grad_output / total_weight.astype(grad_output.dtype)
    axis = _class_axis(x)
    grad = jnp.expand_dims(-w * grad_output, axis)
    classes = jax.lax.broadcasted_iota(safe.dtype, x.shape, axis)
    # Ignored targets get no gradient even where 0 / total_weight is nan.
    hit = (classes == jnp.expand_dims(safe, axis)) & jnp.expand_dims(target != ignore_index, axis)
    return jnp.where(hit, grad, 0).astype(ctx.dtype)
