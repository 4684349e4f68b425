"""Fused optimizer steps: ``lazy.fused_adam`` (Adam, AdamW) and ``lazy.fused_sgd`` over every
parameter; and GradScaler's ``lazy.amp_unscale`` and ``lazy.amp_update_scale``, as PyTorch's CPU
kernels compute them.

Operands: each list's tensors, list by list (``lists`` names them; every list has ``n``), then the
step's scalars, then ``grad_scale`` and ``found_inf`` when given (``extras``). Outputs: the new
values of the ``updated`` lists, list by list. Arithmetic follows PyTorch's fused kernels: in
float32 for reduced-precision parameters; a ``grad_scale`` unscales the gradients (which are
updated with their unscaled values); a ``found_inf`` of 1 leaves every tensor as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

from lowerings.registry import LoweringContext, lowering


def _opmath(dtype: Any) -> Any:
    return jnp.float32 if jnp.dtype(dtype).itemsize < 4 else dtype


def _zero(scalar: Any) -> bool:
    """A scalar recorded as the constant 0 (weight decay off): its term is left out, as eager's
    kernels do, so an infinite parameter does not become NaN."""
    return type(scalar) in (int, float) and scalar == 0


Element = Callable[[dict, dict, tuple, Any], dict]


def _fused(name: str, n_scalars: int) -> Callable[[Element], Element]:
    """Register the lowering of ``name``, a fused step over every parameter whose update is
    ``element(flags, values, scalars, math)``: one parameter's entries of every list (in
    ``math``, the opmath dtype) to its entries of the updated lists."""

    def register(element: Element) -> Element:
        @lowering(name)
        def lower(
            ctx: LoweringContext,
            operands: tuple,
            n: int,
            lists: tuple[str, ...],
            updated: tuple[str, ...],
            extras: tuple[str, ...],
            flags: tuple,
        ) -> tuple:
            f = dict(flags)
            by_list = {key: operands[k * n : (k + 1) * n] for k, key in enumerate(lists)}
            rest = operands[len(lists) * n :]
            scalars, extra = rest[:n_scalars], dict(zip(extras, rest[n_scalars:]))
            skip = extra.get("found_inf")
            outputs: dict[str, list] = {key: [] for key in updated}
            for i in range(n):
                math = _opmath(by_list["self"][i].dtype)
                values = {key: by_list[key][i].astype(math) for key in lists}
                if "grad_scale" in extra:
                    values["grads"] = values["grads"] / extra["grad_scale"].astype(math)
                new = element(f, values, scalars, math)
                new.setdefault("grads", values["grads"])
                for key in updated:
                    out = new[key].astype(by_list[key][i].dtype)
                    if skip is not None:
                        out = jnp.where(skip == 1, by_list[key][i], out)
                    outputs[key].append(out)
            return tuple(out for key in updated for out in outputs[key])

        return element

    return register


@_fused("lazy.fused_adam", 5)
def _adam(f: dict, v: dict, scalars: tuple, math: Any) -> dict:
    lr, beta1, beta2, weight_decay, eps = (jnp.asarray(s, math) for s in scalars)
    param, grad = v["self"], -v["grads"] if f["maximize"] else v["grads"]
    if _zero(scalars[3]):
        pass
    elif f["decoupled"]:
        param = param * (1 - lr * weight_decay)
    else:
        grad = grad + weight_decay * param
    exp_avg = v["exp_avgs"] + (1 - beta1) * (grad - v["exp_avgs"])
    exp_avg_sq = beta2 * v["exp_avg_sqs"] + (1 - beta2) * grad * grad
    step = v["state_steps"]
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = jnp.sqrt(1 - beta2**step)
    new = {"exp_avgs": exp_avg, "exp_avg_sqs": exp_avg_sq}
    if f["amsgrad"]:
        exp_avg_sq = new["max_exp_avg_sqs"] = jnp.maximum(v["max_exp_avg_sqs"], exp_avg_sq)
    denom = jnp.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    new["self"] = param - (lr / bias_correction1) * exp_avg / denom
    return new


@_fused("lazy.fused_sgd", 4)
def _sgd(f: dict, v: dict, scalars: tuple, math: Any) -> dict:
    lr, weight_decay, momentum, dampening = (jnp.asarray(s, math) for s in scalars)
    param = v["self"]
    grad = -v["grads"] if f["maximize"] else v["grads"]
    if not _zero(scalars[1]):
        grad = grad + weight_decay * param
    new = {}
    if "momentum_buffer_list" in v:
        if f["is_first_step"]:
            buf = grad
        else:
            buf = momentum * v["momentum_buffer_list"] + (1 - dampening) * grad
        new["momentum_buffer_list"] = buf
        grad = grad + momentum * buf if f["nesterov"] else buf
    new["self"] = param - lr * grad
    return new


@lowering("lazy.amp_unscale")
def _amp_unscale(ctx: LoweringContext, operands: tuple, n: int) -> tuple:
    """Each gradient times ``inv_scale``; ``found_inf`` becomes 1 if any gradient held a
    non-finite value (it is never reset here)."""
    grads, found_inf, inv_scale = operands[:n], operands[n], operands[n + 1]
    outputs, bad = [], jnp.asarray(False)
    for g in grads:
        bad = bad | ~jnp.all(jnp.isfinite(g))
        outputs.append((g.astype(_opmath(g.dtype)) * inv_scale).astype(g.dtype))
    return (*outputs, jnp.where(bad, jnp.ones_like(found_inf), found_inf))


@lowering("lazy.amp_update_scale")
def _amp_update_scale(ctx: LoweringContext, operands: tuple) -> tuple:
    """Back off the scale after a step with non-finite gradients; grow it after
    ``growth_interval`` clean steps in a row, unless the grown scale would not be finite."""
    scale, tracker, found_inf, growth, backoff, interval = operands
    found = found_inf != 0
    successful = tracker + 1
    grow = successful == interval
    grown = (scale * growth).astype(scale.dtype)
    grown = jnp.where(jnp.isfinite(grown), grown, scale)
    new_scale = jnp.where(
        found, (scale * backoff).astype(scale.dtype), jnp.where(grow, grown, scale)
    )
    zero = jnp.zeros_like(tracker)
    new_tracker = jnp.where(found | grow, zero, successful.astype(tracker.dtype))
    return new_scale, new_tracker
