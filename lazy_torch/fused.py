"""Fused optimizer steps (``aten._fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``) and GradScaler's
two ops (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``): one node a call.

With ``fused=True``, PyTorch's Adam, AdamW and SGD make one call per parameter group (and dtype)
where their foreach path makes one per arithmetic step, each over every parameter. Here that call
records one ``fused_adam`` or ``fused_sgd`` node over the tensors of every parameter
(lowerings/optim.py), and each tensor the step updates (the parameter, its moments or momentum
buffer, its gradient when a ``grad_scale`` unscales it) takes its output as its new value.
Learning rate, betas, epsilon and weight decay are graph scalars: changing them never recompiles.
GradScaler's ops stay on the device too, so a float16 training step with a scaler needs no sync.
"""

from __future__ import annotations

from typing import Any

import torch

from lazy_torch.dispatch import record_update, special

aten = torch.ops.aten


def _bound(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Every argument of the call by its schema name, defaults included."""
    values = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args):
            values[a.name] = args[i]
        elif a.name in kwargs:
            values[a.name] = kwargs[a.name]
        else:
            values[a.name] = a.default_value
    return values


def _check_lists(name: str, lists: dict[str, list]) -> int:
    """The element count of equally long lists whose tensors' shapes match the params' (each
    tensor's device is checked as it becomes an operand)."""
    params = lists["self"]
    for key, tensors in lists.items():
        if len(tensors) != len(params):
            raise RuntimeError(
                f"{name}: expected {key} to have {len(params)} tensors like self, got {len(tensors)}"
            )
        for p, t in zip(params, tensors):
            if key != "state_steps" and t.shape != p.shape:
                raise RuntimeError(
                    f"{name}: {key} holds a tensor of shape {tuple(t.shape)} for a parameter of "
                    f"shape {tuple(p.shape)}"
                )
    return len(params)


def _record(
    op: str, name: str, lists: dict[str, list], updated: list[str], b: dict, scalars: tuple
) -> None:
    """Record ``op`` over ``lists`` (every element's tensors, list by list), then ``scalars``, then
    ``grad_scale`` and ``found_inf`` if given; the tensors of ``updated`` take its outputs."""
    n = _check_lists(name, lists)
    if n == 0:
        return
    extras = tuple(k for k in ("grad_scale", "found_inf") if b[k] is not None)
    values = [t for tensors in lists.values() for t in tensors]
    values += [b[k] for k in (*scalars, *extras)]
    flags = tuple(sorted((k, v) for k, v in b.items() if type(v) is bool))
    attrs = (n, tuple(lists), tuple(updated), extras, flags)
    record_update(op, values, attrs, [t for key in updated for t in lists[key]])


@special(
    aten._fused_adam_.default,
    aten._fused_adam_.tensor_lr,
    aten._fused_adamw_.default,
    aten._fused_adamw_.tensor_lr,
)
def _fused_adam(func: Any, args: tuple, kwargs: dict) -> None:
    b = _bound(func, args, kwargs)
    keys = ["self", "grads", "exp_avgs", "exp_avg_sqs"]
    if b["amsgrad"]:
        keys.append("max_exp_avg_sqs")
    lists = {k: list(b[k]) for k in (*keys, "state_steps")}
    updated = keys if b["grad_scale"] is not None else [k for k in keys if k != "grads"]
    b["decoupled"] = "adamw" in func._schema.name
    scalars = ("lr", "beta1", "beta2", "weight_decay", "eps")
    _record("fused_adam", func._schema.name, lists, updated, b, scalars)


@special(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def _fused_sgd(func: Any, args: tuple, kwargs: dict) -> None:
    b = _bound(func, args, kwargs)
    keys = ["self", "grads"]
    if b["momentum_buffer_list"]:
        keys.append("momentum_buffer_list")
    lists = {k: list(b[k]) for k in keys}
    updated = keys if b["grad_scale"] is not None else [k for k in keys if k != "grads"]
    scalars = ("lr", "weight_decay", "momentum", "dampening")
    _record("fused_sgd", func._schema.name, lists, updated, b, scalars)


@special(aten._amp_foreach_non_finite_check_and_unscale_.default)
def _unscale(func: Any, args: tuple, kwargs: dict) -> None:
    b = _bound(func, args, kwargs)
    grads = list(b["self"])
    if grads:
        values = [*grads, b["found_inf"], b["inv_scale"]]
        record_update("amp_unscale", values, (len(grads),), [*grads, b["found_inf"]])


@special(aten._amp_update_scale_.default)
def _update_scale(func: Any, args: tuple, kwargs: dict) -> Any:
    b = _bound(func, args, kwargs)
    keys = ("self", "growth_tracker", "found_inf", "scale_growth_factor", "scale_backoff_factor")
    values = [b[k] for k in (*keys, "growth_interval")]
    record_update("amp_update_scale", values, (), [b["self"], b["growth_tracker"]])
    return b["self"]
