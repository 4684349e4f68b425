"""CPU fallback: run an op without a lowering in eager CPU PyTorch on materialized inputs."""

from __future__ import annotations

from typing import Any

import torch

import runtime
from lazy_torch import tensor as _tensor
from lazy_torch.sites import user_site


def _flat_tensors(v: Any, lazy: list, other: list) -> None:
    if isinstance(v, _tensor.LazyTensor):
        lazy.append(v)
    elif isinstance(v, torch.Tensor):
        other.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _flat_tensors(x, lazy, other)


def _to_cpu(v: Any) -> Any:
    if isinstance(v, _tensor.LazyTensor):
        return _tensor.to_cpu(v, cause="fallback")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x) for x in v)
    if isinstance(v, torch.device) and v.type == "lazy":
        return torch.device("cpu")
    return v


def _to_lazy(v: Any, device: int) -> Any:
    if isinstance(v, torch.Tensor):
        return _tensor.upload(v, device)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_lazy(x, device) for x in v)
    return v


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """Materialize lazy inputs, run ``func`` on CPU, and move results (and mutations) back."""
    name = f"fallback::{func}"
    runtime.metrics.count(name)
    runtime.metrics.site(name, user_site())
    lazy_inputs: list = []
    other_inputs: list = []
    _flat_tensors((args, tuple(kwargs.values())), lazy_inputs, other_inputs)
    stray = [t for t in other_inputs if t.dim() > 0]
    if lazy_inputs and stray:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"{lazy_inputs[0].device} and {stray[0].device}!"
        )
    _tensor.materialize(lazy_inputs, cause="fallback")
    device = lazy_inputs[0]._lazy.device if lazy_inputs else _device_index(kwargs)
    cpu_args = _to_cpu(args)
    cpu_kwargs = {k: _to_cpu(v) for k, v in kwargs.items()}
    out = func(*cpu_args, **cpu_kwargs)

    # Write mutated arguments back, and return the lazy tensor itself where the op returns it.
    returned: dict[int, Any] = {}
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if a.kwarg_only:
            lazy_arg, cpu_arg = kwargs.get(a.name), cpu_kwargs.get(a.name)
        else:
            if i >= len(args):
                continue
            lazy_arg, cpu_arg = args[i], cpu_args[i]
        if isinstance(lazy_arg, _tensor.LazyTensor):
            _tensor.assign_cpu(lazy_arg, cpu_arg)
            returned[id(cpu_arg)] = lazy_arg
    if isinstance(out, torch.Tensor) and id(out) in returned:
        return returned[id(out)]
    if isinstance(out, (tuple, list)):
        return type(out)(returned[id(o)] if id(o) in returned else _to_lazy(o, device) for o in out)
    return _to_lazy(out, device)


def _device_index(kwargs: dict) -> int:
    device = kwargs.get("device")
    return (torch.device(device).index or 0) if device is not None else 0
