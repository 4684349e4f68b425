"""PyTorch on XLA through lazy tensors: ``model.to('lazy')``, train, ``lazy_torch.mark_step()``.

>>> import torch, lazy_torch
>>> x = torch.randn(4, 3, device=lazy_torch.device())
>>> y = (x @ x.T).relu().sum()
>>> lazy_torch.mark_step()
>>> y.item() >= 0
True
"""

from __future__ import annotations

import torch

import runtime
from lazy_torch import (  # noqa: F401
    amp,
    attention,
    control_flow,  # torch.cond, while_loop and scan on lazy tensors
    data_dependent,
    debug,
    device_module,
    dispatch,
    distributed,  # registers torch.distributed's backend "lazy"
    dynamo,  # registers torch.compile's backend "lazy" (Dynamo is imported on first use)
    fused,
    hf_generate,
    import_hooks,
    meta_kernels,
    metrics,
    ops,
    optim_support,
    scalar_checks,
    serialization,
)
from lazy_torch.compiled import compile
from lazy_torch.data import DeviceLoader, to_device
from lazy_torch.generation import generate
from lazy_torch.rng import manual_seed
from lazy_torch.sync import mark_step
from lazy_torch.tensor import LazyTensor

optim_support.install()
import_hooks.after_import("transformers.generation.utils", hf_generate.install)
device_module.register()
# Last: it wraps the handlers the modules above registered.
dispatch.check_values(scalar_checks.CHECKS.values())


def device(index: int = 0) -> torch.device:
    """``torch.device('lazy:index')``; ``lazy:N`` runs on the N-th device of the JAX platform."""
    return torch.device("lazy", index)


def device_count() -> int:
    """Devices a mesh can span (lazy_torch.distributed): every device of the platform, in every
    process of a multi-process run; ``lazy:N`` names this process's N-th
    (``torch.lazy.device_count()`` counts those)."""
    return len(runtime.global_devices())


def set_cache_dir(path: str | None) -> None:
    """Keep compiled executables in ``path``, so a later process running the same program skips
    XLA compilation (counted as ``persistent_cache_hits``); ``LAZY_CACHE_DIR=path`` does the same
    from the environment, and None turns it off."""
    runtime.set_cache_dir(path)


def wait_device_ops() -> None:
    """Block until every dispatched graph has finished running."""
    runtime.wait_device_ops()


__all__ = [
    "DeviceLoader",
    "LazyTensor",
    "amp",
    "compile",
    "generate",
    "debug",
    "device",
    "device_count",
    "manual_seed",
    "mark_step",
    "metrics",
    "set_cache_dir",
    "to_device",
    "wait_device_ops",
]
