"""Device selection and host<->device transfers."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from runtime import config, metrics
from runtime.launcher import Staged, resolve

# Host arrays of at most this many bytes go to the device when a program first takes them
# (``stage``): a transfer's fixed cost (0.2-0.3 ms on the CPU and GPU platforms) dwarfs theirs.
_STAGED_BYTES = 1024


def x64() -> Any:
    """JAX's 64-bit mode, in this thread, for a ``with`` block: the runtime lowers, compiles,
    transfers and calls executables in it, so the IR's int64 and float64 stay 64-bit while a
    user's own JAX code keeps its own mode (``import lazy_torch`` changes no setting of JAX's)."""
    return jax.enable_x64(True)


def in_x64(fn: Callable) -> Callable:
    """``fn``, run in JAX's 64-bit mode (``x64``): the runtime's entry points that lower, compile,
    transfer or call executables."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with jax.enable_x64(True):
            return fn(*args, **kwargs)

    return run


@cache
def global_devices() -> tuple[Any, ...]:
    """Every device of the configured platform, in every process of a multi-process run
    (``lazy_torch.distributed.initialize``): what a mesh's device ids index."""
    configure()
    return tuple(jax.devices(config.PLATFORM) if config.PLATFORM else jax.devices())


@cache
def configure() -> None:
    """Give JAX the settings that must precede its first use of a device (once)."""
    if config.CPU_DEVICES:
        try:
            jax.config.update("jax_num_cpu_devices", config.CPU_DEVICES)
        except RuntimeError as e:
            raise RuntimeError(
                f"LAZY_CPU_DEVICES={config.CPU_DEVICES} must take effect before JAX first uses a "
                f"device, but this process's JAX had started its devices already: {e}"
            ) from None


@cache
def devices() -> tuple[Any, ...]:
    """This process's devices of the configured platform; ``lazy:N`` is the N-th."""
    everything = global_devices()
    here = jax.process_index()
    return tuple(d for d in everything if d.process_index == here)


def device(index: int = 0) -> Any:
    devs = devices()
    if not 0 <= index < len(devs):
        raise RuntimeError(
            f"lazy device index {index} out of range: {len(devs)} device(s) on platform "
            f"{devs[0].platform!r}"
        )
    return devs[index]


@cache
def _single(index: int) -> Any:
    """Device ``index`` as a sharding: ``device_put`` resolves a sharding in about half the host
    time it takes to make one of a device, and small uploads are mostly that time."""
    return jax.sharding.SingleDeviceSharding(device(index))


def platform_of(index: int = 0) -> str:
    """The platform of device ``index`` as lowerings name it: "cpu", "tpu", "cuda" or "rocm"
    (JAX calls both GPU platforms "gpu" and tells them apart by the client's version)."""
    dev = device(index)
    if dev.platform != "gpu":
        return dev.platform
    return "rocm" if "rocm" in dev.client.platform_version.lower() else "cuda"


@in_x64
def to_device(
    array: np.ndarray,
    index: int,
    dtype: str | None = None,
    sharding: Any = None,
    parts: bool = False,
) -> jax.Array:
    """Start copying a host array to device ``index`` (asynchronous), or laid out as
    ``sharding`` over several devices (runtime/spmd.py's ``sharding_of``). Over other processes'
    devices too, ``array`` is the whole value (every process gives it), or with ``parts`` this
    process's part of it (its batch of a data-parallel step): the value is all processes' parts.

    ``dtype`` names the element type when the host array carries its bit pattern only (bfloat16
    travels as uint16 from frameworks without a numpy bfloat16).
    """
    if dtype is not None and array.dtype.name != dtype:
        array = array.view(jax.numpy.dtype(dtype))
    start = time.perf_counter()
    # The host array usually shares a framework tensor's memory, which the caller may overwrite
    # as soon as this returns (a reused batch buffer). JAX may alias such an array on the CPU
    # platform (even with may_alias=False) or read it after returning, so it gets its own copy.
    copy = np.array(array, copy=True)
    if sharding is None:
        out = jax.device_put(copy, _single(index))
    elif parts and not sharding.is_fully_addressable:
        out = jax.make_array_from_process_local_data(sharding, copy)
    else:
        out = place(copy, sharding)
    metrics.count("transfers_to_device")
    metrics.time("transfer_to_device_time", time.perf_counter() - start)
    metrics.size("transfer_to_device_bytes", array.nbytes)
    return out


def stage(array: np.ndarray, index: int, dtype: str | None = None) -> Any:
    """``to_device`` for one device, deferred for a small array: the payload is a ``Staged``
    whose upload waits until a program takes it (``resolve``), and whose read (``to_host``)
    gives back the host copy. A value made on the host to be read on the host (transformers'
    input checks, a host read's result) never travels."""
    if array.nbytes > _STAGED_BYTES:
        return to_device(array, index, dtype)
    if dtype is not None and array.dtype.name != dtype:
        array = array.view(jax.numpy.dtype(dtype))
    host = np.array(array, copy=True)
    host.flags.writeable = False
    metrics.count("staged_to_device")
    return Staged(host, functools.partial(to_device, host, index))


def place(value: Any, sharding: Any) -> jax.Array:
    """A host array, or a buffer on one of this process's devices, laid out as ``sharding``. On
    other processes' devices too, each process gives the whole value (every process runs the same
    program) and keeps the parts on its own devices."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda where: host[where])


def to_host(buffer: Any) -> np.ndarray:
    """Wait for ``buffer`` (a device array, or a launch's ``Deferred`` output) and copy it to the
    host (timed with the wait); a ``Staged`` one's host copy, read-only, needs neither. A value split over devices of several processes is gathered
    from all of them: every process reads it at the same point of the program."""
    if type(buffer) is Staged:
        return buffer.host
    start = time.perf_counter()
    buffer = resolve(buffer)
    if not buffer.is_fully_addressable and not buffer.is_fully_replicated:
        out = np.asarray(multihost_utils.process_allgather(buffer, tiled=True))
    else:
        out = np.asarray(buffer)
    metrics.count("transfers_from_device")
    metrics.time("transfer_from_device_time", time.perf_counter() - start)
    metrics.size("transfer_from_device_bytes", out.nbytes)
    return out
