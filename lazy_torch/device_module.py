"""``torch.lazy``: the device module of device type 'lazy', as ``torch.cuda`` is CUDA's.

PyTorch code that is generic over devices looks the module up by device type:
``torch.utils.checkpoint`` and ``torch.random.fork_rng`` save and restore the RNG state of the
input's devices through it, ``torch.get_device_module('lazy')`` returns it, and distributed code
asks it for ``device_count`` and ``set_device``. The RNG state is a lazy byte tensor: reading it
records no sync and does not change the draws that follow, and a state restored with
``set_rng_state`` draws the same values again.

>>> import torch, lazy_torch
>>> state = torch.lazy.get_rng_state()
>>> a = torch.rand(3, device="lazy").tolist()
>>> torch.lazy.set_rng_state(state)
>>> a == torch.rand(3, device="lazy").tolist()
True
"""

from __future__ import annotations

import inspect
import random
import warnings
from collections.abc import Iterable
from typing import Any

import torch

import runtime
from lazy_torch import rng
from lazy_torch.tensor import LazyTensor, dense_meta, fresh, from_cpu, to_cpu

_current = 0
# Checkpointing saves device RNG states only for a device module that says it is initialized;
# the lazy device needs no initialization (its RNG state is made at the first draw).
_initialized = True


def _index(device: Any) -> int:
    """The lazy device index named by ``device`` (an int, a string, a torch.device or None)."""
    if device is None:
        return _current
    if isinstance(device, int):
        return _current if device < 0 else device
    device = torch.device(device)
    if device.type != "lazy":
        raise ValueError(f"Expected a lazy device, but got: {device}")
    return _current if device.index is None else device.index


def is_available() -> bool:
    return device_count() > 0


def is_initialized() -> bool:
    return _initialized


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return len(runtime.devices())


def current_device() -> int:
    """The index that ``get_rng_state()`` and the other functions here use when given none."""
    return _current


def set_device(device: Any) -> None:
    global _current
    _current = _index(device)


class device:
    """Context manager that makes ``device`` the current lazy device, then restores it."""

    def __init__(self, device: Any):
        self.index = None if device is None else _index(device)
        self.previous = _current

    def __enter__(self) -> None:
        self.previous = _current
        if self.index is not None:
            set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        set_device(self.previous)


def synchronize(device: Any = None) -> None:
    """Wait for all dispatched work (``lazy_torch.wait_device_ops``); pending IR stays pending."""
    runtime.wait_device_ops()


def manual_seed(seed: int) -> None:
    """Seed every lazy device (``lazy_torch.manual_seed``; one seed covers them all)."""
    rng.manual_seed(seed)


manual_seed_all = manual_seed


def seed() -> None:
    """Seed every lazy device with a non-deterministic seed."""
    rng.manual_seed(random.getrandbits(64))


seed_all = seed


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device: Any = "lazy") -> torch.Tensor:
    """The RNG state of ``device`` as a lazy uint8 tensor (nothing is computed or synced)."""
    index = _index(device)
    node = rng.get_state(index)
    return fresh(node, index, dense_meta(node.shape, torch.uint8))


def set_rng_state(new_state: torch.Tensor, device: Any = "lazy") -> None:
    """Restore a state from ``get_rng_state`` (a lazy or CPU uint8 tensor)."""
    index = _index(device)
    shape = rng.state_shape(index)
    if new_state.dtype != torch.uint8:
        raise TypeError(f"RNG state must be a torch.ByteTensor, got {new_state.dtype}")
    if tuple(new_state.shape) != shape:
        raise RuntimeError(
            f"RNG state is wrong size: expected {shape[0]} bytes, got {new_state.numel()}"
        )
    if isinstance(new_state, LazyTensor) and new_state.device.index == index:
        node = new_state._lazy.node
    else:
        cpu = to_cpu(new_state) if isinstance(new_state, LazyTensor) else new_state
        node = from_cpu(cpu.contiguous(), index).node
    rng.set_state(index, node)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def register() -> None:
    """Make this module ``torch.lazy`` and let ``torch.manual_seed``/``torch.seed`` seed it."""
    import sys

    module = sys.modules[__name__]
    if getattr(torch, "lazy", None) is not module:
        torch._register_device_module("lazy", module)
    _seed_with_torch()


def _seed_with_torch() -> None:
    # torch.manual_seed and torch.seed seed CUDA, MPS, XPU and MTIA by name and then call
    # torch.random._seed_custom_device(seed), which seeds the privateuse1 backend's module only;
    # 'lazy' is a device type of its own, not privateuse1, so no public hook reaches it. This
    # wraps that one function (both callers go through it, whatever names the user imported).
    # Checked against torch 2.13: if a later torch drops or changes it, lazy_torch warns and
    # torch.manual_seed no longer seeds lazy devices (lazy_torch.manual_seed still does).
    original = getattr(torch.random, "_seed_custom_device", None)
    if getattr(original, "_seeds_lazy", False):
        return
    if original is None or list(inspect.signature(original).parameters) != ["seed"]:
        warnings.warn(
            "torch.manual_seed does not seed the lazy device in this version of PyTorch "
            f"({torch.__version__}); call lazy_torch.manual_seed as well",
            stacklevel=2,
        )
        return

    def _seed_custom_device(seed) -> None:
        original(seed)
        rng.manual_seed(seed)

    _seed_custom_device._seeds_lazy = True
    torch.random._seed_custom_device = _seed_custom_device
