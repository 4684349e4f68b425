"""CPU fallback: run an op without a lowering in eager CPU PyTorch on materialized inputs."""

from __future__ import annotations

from typing import Any

import torch

import runtime
from lazy_torch import tensor as _tensor
from lazy_torch._dtypes import dtype_name
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


def run_in_memory(func: Any, args: tuple, kwargs: dict) -> bool:
    """Run in-place or out= ``func`` in eager CPU PyTorch on one CPU copy of the memory of each
    storage it writes, every lazy argument on such a storage a view of the copy laid out as it
    is, and give those storages the memory eager leaves. False, with nothing run, where a tensor on
    a written storage views it as another dtype, or ``func`` draws random numbers (the CPU
    generator's).

    For writes into a tensor whose elements share memory (overlapping unfold windows): eager
    writes its elements in the order of its loops, each reading what earlier ones wrote, so the
    memory it leaves (or its error) is the answer."""
    written: list = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            value = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
            _flat_tensors((value,), written, [])
    lazy_inputs: list = []
    other_inputs: list = []
    _flat_tensors((args, tuple(kwargs.values())), lazy_inputs, other_inputs)
    storages = {id(t._lazy.storage): t._lazy.storage for t in written}
    shared = [t for t in lazy_inputs if id(t._lazy.storage) in storages]
    if (
        torch.Tag.nondeterministic_seeded in func.tags
        or any(t.dim() > 0 for t in other_inputs)  # the usual path raises the device error
        or any(t._lazy.storage.node.dtype != dtype_name(t.dtype) for t in shared)
    ):
        return False
    name = f"fallback::{func}"
    runtime.metrics.count(name)
    runtime.metrics.site(name, user_site())
    dtypes = {id(t._lazy.storage): t.dtype for t in shared}
    wholes = {
        k: _tensor.wrap(s, _tensor.dense_meta(s.node.shape, dtypes[k])) for k, s in storages.items()
    }
    _tensor.materialize(lazy_inputs + list(wholes.values()), cause="fallback")
    memory = {k: _tensor.to_cpu(w, cause="fallback") for k, w in wholes.items()}

    def cpu(v: Any) -> Any:
        if isinstance(v, _tensor.LazyTensor) and id(v._lazy.storage) in memory:
            shape, stride, offset, dtype = v._meta
            on = memory[id(v._lazy.storage)].untyped_storage()
            return torch.empty(0, dtype=dtype).set_(on, offset, shape, stride)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        return _to_cpu(v)

    func(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})
    for k, s in storages.items():
        s.set(_tensor.from_cpu(memory[k], s.device).node)
    return True


def _device_index(kwargs: dict) -> int:
    device = kwargs.get("device")
    return (torch.device(device).index or 0) if device is not None else 0
