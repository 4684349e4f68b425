"""Fused optimizer steps (``aten._fused_adam_``, ``_fused_adamw_``, ``_fused_sgd_``) and
GradScaler's two ops (``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``):
one node a call.

With ``fused=True``, PyTorch's Adam, AdamW and SGD make one call per parameter group (and dtype)
where their foreach path makes one per arithmetic step, each over every parameter. Here that call
records one ``lazy.fused_adam`` or ``lazy.fused_sgd`` node over the tensors of every parameter
(lowerings/optim.py), and each tensor the step updates (the parameter, its moments or momentum
buffer, its gradient when a ``grad_scale`` unscales it) takes its output as its new value.
Learning rate, betas, epsilon and weight decay are graph scalars: changing them never recompiles.
GradScaler's ops stay on the device too, so a float16 training step with a scaler needs no sync.

PyTorch's default for these optimizers on lazy parameters is their foreach path, one foreach call
per arithmetic step. Where the fused step computes the same (float32 and float64 parameters: in
reduced precision each foreach op rounds its result), that call runs as the fused step instead
(``lazy_torch/optim_support.py`` routes it there; ``LAZY_FUSE_FOREACH_STEPS=0`` turns it off).
Per-element work is the host's cost of an optimizer step: AdamW's eight foreach calls over its
lists take a large share of ``opt.step()``'s host time, and recording the one fused step a small
part of it (figures: benchmarks/RESULTS.md, "Optimizer steps").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lazy_core import scalar_leaf
from lazy_torch import step_state
from lazy_torch._dtypes import dtype_name
from lazy_torch.dispatch import special
from lazy_torch.recording import bound_arguments, record_update
from lazy_torch.tensor import LazyTensor, extension

aten = torch.ops.aten


def _check_lists(name: str, lists: dict[str, list]) -> int:
    """The element count of equally long lists whose tensors' shapes match the params' (each
    tensor's device is checked as it becomes an operand)."""
    params = lists["self"]
    shapes = _shapes(params)
    for key, tensors in lists.items():
        if len(tensors) != len(params):
            raise RuntimeError(
                f"{name}: expected {key} to have {len(params)} tensors like self, got "
                f"{len(tensors)}"
            )
        if key == "state_steps" or _shapes(tensors) == shapes:
            continue
        for shape, t in zip(shapes, tensors):
            if tuple(t.shape) != shape:
                raise RuntimeError(
                    f"{name}: {key} holds a tensor of shape {tuple(t.shape)} for a parameter of "
                    f"shape {shape}"
                )
    return len(params)


def _shapes(tensors: list) -> list[tuple[int, ...]]:
    return [t._meta.shape if type(t) is LazyTensor else tuple(t.shape) for t in tensors]


def _record(
    op: str, name: str, lists: dict[str, list], updated: list[str], b: dict, scalars: tuple
) -> None:
    """Record ``op`` over ``lists`` (every element's tensors, list by list), then ``scalars``, then
    ``grad_scale`` and ``found_inf`` if given; the tensors of ``updated`` take its outputs."""
    n = _check_lists(name, lists)
    if n == 0:
        return
    if step_state.watching is not None:  # a compiled step's capture: each replay reads them
        step_state.watching.read_scalars(b, scalars, lists["self"])
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
    b = bound_arguments(func, args, kwargs)
    keys = ["self", "grads", "exp_avgs", "exp_avg_sqs"]
    if b["amsgrad"]:
        keys.append("max_exp_avg_sqs")
    lists = {k: list(b[k]) for k in (*keys, "state_steps")}
    updated = keys if b["grad_scale"] is not None else [k for k in keys if k != "grads"]
    b["decoupled"] = "adamw" in func._schema.name
    scalars = ("lr", "beta1", "beta2", "weight_decay", "eps")
    _record("lazy.fused_adam", func._schema.name, lists, updated, b, scalars)


@special(aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def _fused_sgd(func: Any, args: tuple, kwargs: dict) -> None:
    b = bound_arguments(func, args, kwargs)
    keys = ["self", "grads"]
    if b["momentum_buffer_list"]:
        keys.append("momentum_buffer_list")
    lists = {k: list(b[k]) for k in keys}
    updated = keys if b["grad_scale"] is not None else [k for k in keys if k != "grads"]
    scalars = ("lr", "weight_decay", "momentum", "dampening")
    _record("lazy.fused_sgd", func._schema.name, lists, updated, b, scalars)


@special(aten._amp_foreach_non_finite_check_and_unscale_.default)
def _unscale(func: Any, args: tuple, kwargs: dict) -> None:
    b = bound_arguments(func, args, kwargs)
    grads = list(b["self"])
    if grads:
        values = [*grads, b["found_inf"], b["inv_scale"]]
        record_update("lazy.amp_unscale", values, (len(grads),), [*grads, b["found_inf"]])


@special(aten._amp_update_scale_.default)
def _update_scale(func: Any, args: tuple, kwargs: dict) -> Any:
    b = bound_arguments(func, args, kwargs)
    keys = ("self", "growth_tracker", "found_inf", "scale_growth_factor", "scale_backoff_factor")
    values = [b[k] for k in (*keys, "growth_interval")]
    record_update("lazy.amp_update_scale", values, (), [b["self"], b["growth_tracker"]])
    return b["self"]


# ----------------------------------------------------------------------------------------------
# PyTorch's foreach Adam, AdamW and SGD as their fused step.

# Where a fused step computes what the foreach ops do: in reduced precision each foreach op
# rounds its result to the parameter's dtype, while the fused step rounds once.
_EXACT = (torch.float32, torch.float64)


def _one_group(params: list, *lists: list) -> bool:
    """Whether every tensor of ``params`` and ``lists`` is a lazy tensor on the first parameter's
    device with its dtype, float32 or float64."""
    if not params or type(params[0]) is not LazyTensor:
        return False
    dtype, device = params[0]._meta.dtype, params[0]._lazy.device
    return dtype in _EXACT and all(
        type(t) is LazyTensor and t._meta.dtype is dtype and t._lazy.device == device
        for tensors in (params, *lists)
        for t in tensors
    )


def _steps(steps: list, capturable: bool, device: int) -> list | None:
    """Adam's step counts as the fused step's operands, after counting this step: lazy step
    tensors as they are, CPU ones as graph scalars of their values, one per distinct value (none a
    constant: a count of 1 would make a graph of its own); None where the foreach path must run
    (``capturable``: it checks the parameters' device type)."""
    if capturable:
        return None
    if all(type(s) is LazyTensor and s._lazy.device == device and not s.dim() for s in steps):
        torch._foreach_add_(steps, 1)
        return steps
    values = extension.count_steps(steps)  # None where not all of one dtype on the CPU
    if values is not None:  # of one dtype
        dtype = dtype_name(steps[0].dtype)
        return _shared_leaves(values, lambda v: scalar_leaf(v, dtype))
    if not all(type(s) is torch.Tensor and s.device.type == "cpu" and not s.dim() for s in steps):
        return None
    watching = step_state.watching  # a compiled step's capture: each replay counts them
    if watching is not None:
        watching.claim(steps)
    torch._foreach_add_(steps, 1)
    keys = [(s.item(), dtype_name(s.dtype)) for s in steps]
    leaves = _shared_leaves(keys, lambda k: scalar_leaf(*k))
    if watching is not None:
        watching.counted(steps, leaves)
    return leaves


def _shared_leaves(keys: list, leaf: Callable[[Any], Any]) -> list:
    """``leaf(k)`` for each of ``keys``, made once per distinct key."""
    made = {k: leaf(k) for k in set(keys)}
    return [made[k] for k in keys]


def adam_step(b: dict) -> bool:
    """A foreach Adam or AdamW call as one ``lazy.fused_adam`` node; False where it does not fit."""
    lists = [b["grads"], b["exp_avgs"], b["exp_avg_sqs"]]
    if b["amsgrad"]:
        lists.append(b["max_exp_avg_sqs"])
    if (
        b["has_complex"]
        or b["differentiable"]
        or b["grad_scale"] is not None
        or b["found_inf"] is not None
        or any(isinstance(b[k], torch.Tensor) for k in ("lr", "beta1", "beta2"))
        or not _one_group(b["params"], *lists)
    ):
        return False
    steps = _steps(b["state_steps"], b["capturable"], b["params"][0]._lazy.device)
    if steps is None:
        return False
    func = aten._fused_adamw_ if b["decoupled_weight_decay"] else aten._fused_adam_
    args = (b["params"], *lists[:3], b["max_exp_avg_sqs"], steps)
    keys = ("lr", "beta1", "beta2", "weight_decay", "eps", "amsgrad", "maximize")
    _fused_adam(func.default, args, {k: b[k] for k in keys})
    return True


def sgd_step(b: dict) -> bool:
    """A foreach SGD call as one ``lazy.fused_sgd`` node; False where it does not fit."""
    grads, buffers = b["grads"], b["momentum_buffer_list"]
    first = b["momentum"] != 0 and all(t is None for t in buffers)
    held = [] if b["momentum"] == 0 or first else [buffers]
    if (
        b["grad_scale"] is not None
        or b["found_inf"] is not None
        or b["has_sparse_grad"]
        or isinstance(b["lr"], torch.Tensor)
        or not _one_group(b["params"], grads, *held)
    ):
        return False
    if first:  # the step sets each buffer to its gradient, as the foreach path's clones do
        for i, g in enumerate(grads):
            buffers[i] = torch.empty_like(g)
    keys = ("weight_decay", "momentum", "lr", "dampening", "nesterov", "maximize")
    kwargs = {k: b[k] for k in keys}
    args = (b["params"], grads, buffers if b["momentum"] != 0 else [])
    _fused_sgd(aten._fused_sgd_.default, args, {**kwargs, "is_first_step": first})
    return True
