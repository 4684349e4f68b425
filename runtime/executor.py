"""Compile cut graphs to XLA executables (cached by graph key) and run them asynchronously."""

from __future__ import annotations

import sys
import time
from typing import Any

import jax
import numpy as np

from lazy_core.graph import Graph
from lazy_core.ir import SCALAR
from runtime import config, metrics
from runtime.device import device
from runtime.program import build_function


class GraphError(RuntimeError):
    """Compiling or running a graph failed; every tensor keeps its previous value."""


class Executable:
    __slots__ = ("compiled", "errors", "graph_size")

    def __init__(self, compiled: Any, graph_size: int, errors: list):
        self.compiled = compiled
        self.graph_size = graph_size
        self.errors = errors  # how to build the error of each runtime-check row (program.py)


_cache: dict[Any, Executable] = {}
if config.CACHE_DIR:
    # XLA executables persist across processes in JAX's compilation cache.
    jax.config.update("jax_compilation_cache_dir", config.CACHE_DIR)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
_in_flight: list[jax.Array] = []


def _describe(graph: Graph) -> str:
    return f"graph {graph.key & 0xFFFFFFFFFFFFFFFF:016x} ({len(graph.nodes)} nodes)"


def _param_specs(graph: Graph, device_index: int) -> list[jax.ShapeDtypeStruct]:
    sharding = jax.sharding.SingleDeviceSharding(device(device_index))
    return [
        jax.ShapeDtypeStruct(p.shape, jax.numpy.dtype(p.dtype), sharding=sharding)
        for p in graph.params
    ]


def lower(graph: Graph, device_index: int, donate: tuple[int, ...] = ()) -> Any:
    """``jax.stages.Lowered`` of the graph (its StableHLO is ``.as_text()``)."""
    return _lower(graph, device_index, donate)[0]


def _lower(graph: Graph, device_index: int, donate: tuple[int, ...]) -> tuple[Any, list]:
    fn = build_function(graph.plan(), graph.outputs())
    lowered = jax.jit(fn, donate_argnums=donate).lower(*_param_specs(graph, device_index))
    return lowered, fn.errors


def _compile(graph: Graph, device_index: int, donate: tuple[int, ...], cause: str) -> Executable:
    start = time.perf_counter()
    try:
        lowered, errors = _lower(graph, device_index, donate)
        compiled = lowered.compile()
    except Exception as e:
        raise GraphError(f"compiling {_describe(graph)} failed: {type(e).__name__}: {e}") from e
    elapsed = time.perf_counter() - start
    metrics.count("compiles")
    metrics.time("compile_time", elapsed)
    if config.DEBUG:
        print(
            f"[lazy] compile {_describe(graph)} cause={cause} in {elapsed * 1e3:.1f}ms",
            file=sys.stderr,
        )
    return Executable(compiled, len(graph.nodes), errors)


def _param_values(graph: Graph) -> list[Any]:
    return [
        np.asarray(p.payload, dtype=jax.numpy.dtype(p.dtype)) if p.op == SCALAR else p.payload
        for p in graph.params
    ]


def run_graph(
    graph: Graph,
    device_index: int,
    donate: tuple[int, ...] = (),
    cause: str = "mark_step",
    defer_checks: bool = False,
) -> tuple[jax.Array, ...]:
    """Run ``graph`` on device ``device_index``; returns its root buffers.

    ``graph.key`` must include the device (``cut_graph``'s salt). ``donate`` lists parameters
    whose buffers the caller will never read again: XLA may reuse them for outputs.

    A graph with runtime checks waits for them and raises eager's error (an out-of-range index,
    an integer division by zero) before returning, so the caller keeps every previous value; with ``defer_checks``
    it returns without waiting and ``check_errors`` raises the error later.
    """
    key = (graph.key, donate)
    exe = _cache.get(key)
    if exe is None:
        exe = _cache[key] = _compile(graph, device_index, donate, cause)
    else:
        metrics.count("cache_hits")
    start = time.perf_counter()
    try:
        outputs = exe.compiled(*_param_values(graph))
    except Exception as e:
        raise GraphError(f"running {_describe(graph)} failed: {type(e).__name__}: {e}") from e
    metrics.count("executions")
    if donate:
        metrics.count("donated_buffers", len(donate))
    metrics.time("dispatch_time", time.perf_counter() - start)
    if config.DEBUG:
        print(f"[lazy] execute {_describe(graph)} cause={cause}", file=sys.stderr)
    _in_flight[:] = [o for o in outputs if isinstance(o, jax.Array)]
    if exe.errors:
        checks, outputs = outputs[-1], outputs[:-1]
        _unchecked.append((checks, exe.errors))
        if not defer_checks:
            check_errors()
    return tuple(outputs)


# Runtime checks of dispatched executions nobody has looked at yet: (device rows, error builders).
_unchecked: list[tuple[jax.Array, list]] = []


def check_errors(wait: bool = True) -> None:
    """Raise the first error (out-of-range index, division by zero) an execution reported.

    With ``wait=False`` executions still running are left for a later call."""
    pending = list(_unchecked)
    _unchecked.clear()
    for i, (checks, errors) in enumerate(pending):
        if not wait and not checks.is_ready():
            _unchecked.append(pending[i])
            continue
        rows = np.asarray(checks)
        for (bad, index), (bound, dim, size) in zip(rows.tolist(), errors):
            if bad:
                raise bound.error(index, dim, size)


def wait_device_ops() -> None:
    """Block until every dispatched execution has finished (and raise what it reported)."""
    jax.block_until_ready(_in_flight)
    _in_flight.clear()
    check_errors()


def executable_memory() -> list[dict[str, int]]:
    """XLA's memory accounting of every cached executable: bytes of arguments, outputs, outputs
    aliased to donated arguments, temporaries, and the peak they imply."""
    out = []
    for exe in _cache.values():
        m = exe.compiled.memory_analysis()
        sizes = {
            "arguments": m.argument_size_in_bytes,
            "outputs": m.output_size_in_bytes,
            "aliased": m.alias_size_in_bytes,
            "temporaries": m.temp_size_in_bytes,
        }
        sizes["peak"] = (
            sizes["arguments"] + sizes["outputs"] - sizes["aliased"] + sizes["temporaries"]
        )
        out.append(sizes)
    return out


def cache_size() -> int:
    return len(_cache)


def stablehlo_text(graph: Graph, device_index: int) -> str:
    return lower(graph, device_index).as_text()


def drop_cache() -> None:
    _cache.clear()


__all__ = [
    "GraphError",
    "check_errors",
    "cache_size",
    "drop_cache",
    "executable_memory",
    "lower",
    "run_graph",
    "stablehlo_text",
    "wait_device_ops",
]
