"""Device selection and host<->device transfers."""

from __future__ import annotations

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
    metrics.count("transfers_to_device")
    return jax.device_put(array, device(index))


def to_host(buffer: jax.Array) -> np.ndarray:
    """Wait for ``buffer`` and copy it to the host."""
    metrics.count("transfers_from_device")
    return np.asarray(buffer)
