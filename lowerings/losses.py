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
    """Per-target class weight (0 where ignored) and a target safe to index with (an out-of-range
    target raises eager's error through bounds.TARGETS; clipping only keeps the gathers defined)."""
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


# ------------------------------------------------------------------------------------------------
# Multi-class margin losses. Inputs are ``(N, C)`` or one unbatched ``(C,)`` sample; the hinge
# counts only where its argument is strictly positive, in the forward and in the gradient.


def _batched(x: Any, target: Any) -> tuple[Any, Any]:
    """``x`` as (N, C) rows (a 0-d or 1-d input is one sample) and ``target`` with N rows."""
    x = x.reshape(-1, x.shape[-1] if x.ndim else 1)
    return x, target.reshape(x.shape[0], -1)


def _per_sample(ctx: Any, losses: Any, reduction: int) -> Any:
    """(N,) losses reduced; unreduced losses of an unbatched sample keep the scalar shape."""
    return _reduce(ctx, losses, reduction).reshape(ctx.shape)


def _sample_grad_scale(grad_output: Any, n: int, reduction: int) -> Any:
    """The incoming gradient per sample, shape (N, 1)."""
    g = grad_output.reshape(-1, 1) if reduction == _NONE else grad_output.reshape(1, 1)
    return g / n if reduction == _MEAN else g


def _multi_margin_terms(x, target, p, margin, weight):
    """Per-class hinge terms (N, C) and their derivative in ``x[i]``, both 0 at the target.

    ``target`` is (N, 1).
    """
    classes = x.shape[1]
    picked = jnp.take_along_axis(x, target, axis=1, mode="clip")
    z = margin - picked + x
    active = (z > 0) & (jnp.arange(classes)[None, :] != target)
    # p is 1 or 2 (a parameter when 2), so both branches are evaluated and selected.
    term = jnp.where(active, jnp.where(p == 1, z, z * z), 0)
    slope = jnp.where(active, jnp.where(p == 1, 1, 2 * z), 0)
    if weight is not None:
        w = jnp.take(weight, target, mode="clip")
        term, slope = term * w, slope * w
    return term / classes, slope / classes


@lowering("aten.multi_margin_loss.default")
def _multi_margin_loss(ctx, x, target, p=1, margin=1, weight=None, reduction=_MEAN):
    (xf, weight) = _acc(x, weight)
    xf, target = _batched(xf, target)
    term, _ = _multi_margin_terms(xf, target, p, margin, weight)
    return _per_sample(ctx, jnp.sum(term, axis=1), reduction)


@lowering("aten.multi_margin_loss_backward.default")
def _multi_margin_loss_backward(ctx, grad_output, x, target, p, margin, weight=None, reduction=1):
    grad_output, xf, weight = _acc(grad_output, x, weight)
    xf, target = _batched(xf, target)
    _, slope = _multi_margin_terms(xf, target, p, margin, weight)
    onehot = jnp.arange(xf.shape[1])[None, :] == target
    grad = slope - jnp.where(onehot, jnp.sum(slope, axis=1, keepdims=True), 0)
    grad = grad * _sample_grad_scale(grad_output, xf.shape[0], reduction)
    return grad.reshape(x.shape).astype(ctx.dtype)


def _multilabel_hinges(x, target, is_target):
    """Active hinge mask (N, K, C): target slot k (before the first -1) against non-target i."""
    valid = jnp.cumsum(target < 0, axis=1) == 0
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, safe, axis=1, mode="clip")
    z = 1 - picked[:, :, None] + x[:, None, :]
    active = (z > 0) & valid[:, :, None] & (is_target[:, None, :] == 0)
    return z, active, safe


def _is_target(target: Any, classes: int, dtype: Any) -> Any:
    valid = jnp.cumsum(target < 0, axis=1) == 0
    hits = (target[:, :, None] == jnp.arange(classes)[None, None, :]) & valid[:, :, None]
    return jnp.any(hits, axis=1).astype(dtype)


@lowering("aten.multilabel_margin_loss_forward.default")
def _multilabel_margin_loss_forward(ctx, x, target, reduction):
    (xf,) = _acc(x)
    xf, target = _batched(xf, target)
    classes = xf.shape[1]
    is_target = _is_target(target, classes, xf.dtype)
    z, active, _ = _multilabel_hinges(xf, target, is_target)
    losses = jnp.sum(jnp.where(active, z, 0), axis=(1, 2)) / classes
    return _per_sample(ctx, losses, reduction), is_target.reshape(x.shape).astype(ctx.dtypes[1])


@lowering("aten.multilabel_margin_loss_backward.default")
def _multilabel_margin_loss_backward(ctx, grad_output, x, target, reduction, is_target):
    grad_output, xf, is_target = _acc(grad_output, x, is_target)
    xf, target = _batched(xf, target)
    is_target = is_target.reshape(xf.shape)
    classes = xf.shape[1]
    _, active, safe = _multilabel_hinges(xf, target, is_target)
    active = active.astype(xf.dtype) / classes
    # +1 for each non-target class i of an active hinge, -1 for the target class it compares to.
    onehot = (safe[:, :, None] == jnp.arange(classes)[None, None, :]).astype(xf.dtype)
    grad = jnp.sum(active, axis=1) - jnp.sum(onehot * jnp.sum(active, axis=2, keepdims=True), 1)
    grad = grad * _sample_grad_scale(grad_output, xf.shape[0], reduction)
    return grad.reshape(x.shape).astype(ctx.dtype)


# ------------------------------------------------------------------------------------------------
# CTC: the alpha recursion over time in log space (lax.scan), over the extended label sequence
# blank, l1, blank, l2, ..., blank. The backward is the vector-Jacobian product of the negative
# log likelihood plus aten's extra ``exp(log_probs)`` term: aten returns the gradient as if
# ``log_probs`` came from log_softmax, whose backward cancels that term.


def _logsumexp(*xs: Any) -> Any:
    """log(sum(exp(xs))) that is -inf, with zero (not nan) gradients, when every term is -inf."""
    stacked = jnp.stack(xs)
    top = jax.lax.stop_gradient(jnp.max(stacked, axis=0))
    top = jnp.where(jnp.isfinite(top), top, 0)
    total = jnp.sum(jnp.exp(stacked - top), axis=0)
    positive = total > 0
    return jnp.where(positive, top + jnp.log(jnp.where(positive, total, 1)), -jnp.inf)


def _shift(x: Any, k: int) -> Any:
    """``x`` moved ``k`` places right along the last axis, -inf shifted in."""
    return jnp.concatenate([jnp.full(x.shape[:-1] + (k,), -jnp.inf, x.dtype), x[..., :-k]], -1)


def _padded_targets(targets: Any, target_lengths: Any, longest: int) -> Any:
    """(N, longest) targets from the padded (N, S) form or the concatenated 1-d form."""
    if targets.ndim == 2:
        return targets[:, :longest]
    starts = jnp.cumsum(target_lengths) - target_lengths
    return jnp.take(targets, starts[:, None] + jnp.arange(longest)[None, :], mode="clip")


def _ctc_alpha(log_probs, targets, input_lengths, target_lengths, blank, width):
    """Negative log likelihood (N,) and log alpha (N, T, width) for (T, N, C) ``log_probs``."""
    steps, batch, _ = log_probs.shape
    longest = (width - 1) // 2
    s = jnp.arange(width)
    if longest == 0:
        extended = jnp.full((batch, width), blank, jnp.int64)
    else:
        labels = _padded_targets(targets, target_lengths, longest)
        slot = jnp.broadcast_to(jnp.clip((s - 1) // 2, 0, longest - 1), (batch, width))
        picked = jnp.take_along_axis(labels, slot, axis=1, mode="clip")
        extended = jnp.where(s % 2 == 0, blank, picked).astype(jnp.int64)
    # A label may follow the previous label directly (skipping the blank) when they differ.
    skip = (s % 2 == 1) & (s >= 2) & (extended != jnp.roll(extended, 2, axis=1))
    in_sequence = s[None, :] < 2 * target_lengths[:, None] + 1
    lp = jnp.take_along_axis(
        log_probs, jnp.broadcast_to(extended, (steps, batch, width)), axis=2, mode="clip"
    )
    init = jnp.where((s[None, :] <= 1) & in_sequence, lp[0], -jnp.inf)

    def step(alpha, inputs):
        t, lp_t = inputs
        skipped = jnp.where(skip, _shift(alpha, 2), -jnp.inf)
        new = _logsumexp(alpha, _shift(alpha, 1), skipped) + lp_t
        new = jnp.where(in_sequence, new, -jnp.inf)
        # Past a sample's input length its alphas stay those of its last step.
        new = jnp.where((t < input_lengths)[:, None], new, alpha)
        return new, new

    final, alphas = jax.lax.scan(step, init, (jnp.arange(1, steps), lp[1:]))
    log_alpha = jnp.concatenate([init[None], alphas]).transpose(1, 0, 2)
    end = 2 * target_lengths[:, None]
    last = jnp.take_along_axis(final, end, axis=1, mode="clip")[:, 0]
    before = jnp.take_along_axis(final, jnp.maximum(end - 1, 0), axis=1, mode="clip")[:, 0]
    before = jnp.where(target_lengths > 0, before, -jnp.inf)
    return -_logsumexp(last, before), log_alpha


def _ctc_operands(log_probs, targets, input_lengths, target_lengths):
    """Batched (T, N, C) operands in the compute dtype; lengths as int64 arrays."""
    (lp,) = _acc(log_probs)
    if lp.ndim == 2:
        lp, targets = lp[:, None], targets[None]
    lengths = [jnp.asarray(v, jnp.int64).reshape(-1) for v in (input_lengths, target_lengths)]
    return lp, targets, *lengths


@lowering("aten._ctc_loss.default", "aten._ctc_loss.Tensor")
def _ctc_loss(ctx, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    lp, targets, input_lengths, target_lengths = _ctc_operands(
        log_probs, targets, input_lengths, target_lengths
    )
    width = ctx.shapes[1][-1]
    nll, log_alpha = _ctc_alpha(lp, targets, input_lengths, target_lengths, blank, width)
    return (
        nll.reshape(ctx.shapes[0]).astype(ctx.dtypes[0]),
        log_alpha.reshape(ctx.shapes[1]).astype(ctx.dtypes[1]),
    )


@lowering("aten._ctc_loss_backward.default", "aten._ctc_loss_backward.Tensor")
def _ctc_loss_backward(
    ctx,
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    neg_log_likelihood,
    log_alpha,
    blank,
    zero_infinity=False,
):
    lp, targets, input_lengths, target_lengths = _ctc_operands(
        log_probs, targets, input_lengths, target_lengths
    )
    width = log_alpha.shape[-1]
    (grad,) = _acc(grad)
    grad = grad.reshape(-1)

    def nll(lp):
        return _ctc_alpha(lp, targets, input_lengths, target_lengths, blank, width)[0]

    _, pullback = jax.vjp(nll, lp)
    (true_grad,) = pullback(grad)
    result = jnp.exp(lp) * grad[None, :, None] + true_grad
    live = jnp.arange(lp.shape[0])[:, None] < input_lengths[None, :]
    if zero_infinity:
        live = live & (neg_log_likelihood.reshape(-1) != jnp.inf)[None, :]
    result = jnp.where(live[:, :, None], result, 0)
    return result.reshape(ctx.shape).astype(ctx.dtype)
