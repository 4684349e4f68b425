"""Every change this package makes to ``torch.optim``, in one place, checked against the torch it
runs on. PyTorch has no registration hook for any of them; each is what PyTorch itself does for
CUDA, done for 'lazy'.

- Foreach support: optimizers take their foreach path (one call per arithmetic step over every
  parameter) on device types that ``_get_foreach_kernels_supported_devices`` lists and tensor types
  in ``_foreach_supported_types``; lazy is added to both (``lazy_torch/foreach.py`` records the
  calls).
- Fused support: ``fused=True`` Adam, AdamW and SGD accept the device types that
  ``_get_fused_kernels_supported_devices`` lists; lazy is added (``lazy_torch/fused.py``).
- Fused routing: the foreach functions of Adam (AdamW's too) and SGD, called with lazy
  parameters, run as the fused step where it computes the same (``fused.adam_step``,
  ``fused.sgd_step``); every other call goes to PyTorch's function unchanged.

``install`` applies a patch only where this torch has its target in the form the patch was written
for (the module attribute, the list, the function's arguments). A patch whose target differs is
left out, named in ``skipped`` with the reason, and warned about once: the optimizers then take the
path PyTorch picks for them, which computes the same values, op by op or per parameter.
``tests/lazy_torch/test_optim_support.py`` checks each patch on the installed torch.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import runtime
from lazy_torch import fused
from lazy_torch.tensor import LazyTensor

# The patches that could not be applied to this torch: (patch, reason).
skipped: list[tuple[str, str]] = []


def _skip(patch: str, reason: str) -> None:
    skipped.append((patch, reason))
    warnings.warn(
        f"lazy_torch: not applying {patch} to this torch ({reason}); optimizers on lazy "
        "parameters take the path PyTorch picks for them (same values, slower)",
        RuntimeWarning,
        stacklevel=3,
    )


def _list_lazy(name: str, module_names: tuple[str, ...]) -> None:
    """Make each module's ``name`` (a function listing supported device types) list 'lazy' too."""
    for module_name in module_names:
        module = importlib.import_module(module_name)
        devices = getattr(module, name, None)
        if not callable(devices):
            _skip(f"{module_name}.{name}", "no such function")
            continue
        if "lazy" in devices():
            continue

        def supported(devices: Callable[[], list[str]] = devices) -> list[str]:
            return [*devices(), "lazy"]

        supported.__doc__ = devices.__doc__
        supported.lazy_original = devices  # type: ignore[attr-defined]
        setattr(module, name, supported)


def _declare_tensor_type() -> None:
    for module_name in ("torch.utils._foreach_utils", "torch.optim.optimizer"):
        types = getattr(importlib.import_module(module_name), "_foreach_supported_types", None)
        if not isinstance(types, list):
            _skip(f"{module_name}._foreach_supported_types", "not a list")
        elif LazyTensor not in types:
            types.append(LazyTensor)


# Module, foreach function, the function that runs a call of it as the fused step, and the
# arguments that function reads.
_ROUTES = (
    (
        "torch.optim.adam",
        "_multi_tensor_adam",
        fused.adam_step,
        (
            "params grads exp_avgs exp_avg_sqs max_exp_avg_sqs state_steps grad_scale found_inf "
            "amsgrad has_complex beta1 beta2 lr weight_decay eps maximize capturable "
            "differentiable decoupled_weight_decay"
        ),
    ),
    (
        "torch.optim.sgd",
        "_multi_tensor_sgd",
        fused.sgd_step,
        (
            "params grads momentum_buffer_list grad_scale found_inf weight_decay momentum lr "
            "dampening nesterov maximize has_sparse_grad"
        ),
    ),
)


def _binder(function: Callable) -> Callable[[tuple, dict], dict | None]:
    """What ``inspect.signature(function).bind`` and ``apply_defaults`` give, as a dict of the
    arguments by name (None for a call that does not bind); inspect's made a small step measurably
    slower (figures: benchmarks/RESULTS.md, "Optimizer steps")."""
    parameters = inspect.signature(function).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    names = {p.name for p in parameters}

    def bind(args: tuple, kwargs: dict) -> dict | None:
        given = positional[: len(args)]
        if len(args) > len(positional) or any(name in kwargs for name in given):
            return None
        bound = {**defaults, **dict(zip(given, args)), **kwargs}
        return bound if len(bound) == len(names) and names.issuperset(kwargs) else None

    return bind


def _routed(original: Callable, step: Callable[[dict], bool]) -> Callable:
    bind = _binder(original)

    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> None:
        # Other tensors' calls (CUDA ones in a torch.compile'd step too) go straight through;
        # so does a call that does not bind, for the original to raise its error.
        params = args[0] if args else kwargs.get("params")
        if params and type(params[0]) is LazyTensor and runtime.config.FUSE_FOREACH_STEPS:
            bound = bind(args, kwargs)
            if bound is not None and step(bound):
                return
        original(*args, **kwargs)

    routed.lazy_original = original  # type: ignore[attr-defined]
    return routed


def _route_foreach_steps() -> None:
    for module_name, name, step, reads in _ROUTES:
        module = importlib.import_module(module_name)
        original = getattr(module, name, None)
        if hasattr(original, "lazy_original"):
            continue
        if not callable(original):
            _skip(f"{module_name}.{name}", "no such function")
            continue
        missing = set(reads.split()) - set(inspect.signature(original).parameters)
        if missing:
            _skip(f"{module_name}.{name}", f"no argument {', '.join(sorted(missing))}")
            continue
        setattr(module, name, _routed(original, step))


def install() -> None:
    """Apply every patch this torch has the target of (once; called by ``import lazy_torch``)."""
    _declare_tensor_type()
    foreach_lists = ("torch.utils._foreach_utils", "torch.optim.optimizer", "torch.optim.swa_utils")
    _list_lazy("_get_foreach_kernels_supported_devices", foreach_lists)
    _list_lazy("_get_fused_kernels_supported_devices", foreach_lists[:2])
    _route_foreach_steps()
