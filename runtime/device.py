"""Device selection and host<->device transfers."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

import jax
import numpy as np

from runtime import config, metrics


@cache
def devices() -> tuple[Any, ...]:
    """The JAX devices of the configured platform; ``lazy:N`` is the N-th."""
    return tuple(jax.devices(config.PLATFORM) if config.PLATFORM else jax.devices())


def device(index: int = 0) -> Any:
    devs = devices()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"lazy device index {index} out of range: {len(devs)} device(s) on platform "
            f"{devs[0].platform!r}"
        )
    return devs[index]


def to_device(array: np.ndarray, index: int, dtype: str | None = None) -> jax.Array:
    """Start copying a host array to device ``index`` (asynchronous).

    ``dtype`` names the element type when the host array carries its bit pattern only (bfloat16
    travels as uint16 from frameworks without a numpy bfloat16).
    """
    if dtype is not None and array.dtype.name != dtype:
        array = array.view(jax.numpy.dtype(dtype))
    start = time.perf_counter()
    # The host array usually shares a framework tensor's memory, which the caller may overwrite
    # as soon as this returns (a reused batch buffer). JAX may alias such an array on the CPU
    # platform (even with may_alias=False) or read it after returning, so it gets its own copy.
    out = jax.device_put(np.array(array, copy=True), device(index))
    metrics.count("transfers_to_device")
    metrics.time("transfer_to_device_time", time.perf_counter() - start)
    metrics.size("transfer_to_device_bytes", array.nbytes)
    return out


def to_host(buffer: jax.Array) -> np.ndarray:
    """Wait for ``buffer`` and copy it to the host (timed with the wait)."""
    start = time.perf_counter()
    out = np.asarray(buffer)
    metrics.count("transfers_from_device")
    metrics.time("transfer_from_device_time", time.perf_counter() - start)
    metrics.size("transfer_from_device_bytes", out.nbytes)
    return out
