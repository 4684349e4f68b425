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
    __slots__ = ("compiled", "graph_size")

    def __init__(self, compiled: Any, graph_size: int):
        self.compiled = compiled
        self.graph_size = graph_size


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
    fn = build_function(graph.plan(), graph.outputs())
    return jax.jit(fn, donate_argnums=donate).lower(*_param_specs(graph, device_index))


def _compile(graph: Graph, device_index: int, donate: tuple[int, ...], cause: str) -> Executable:
    start = time.perf_counter()
    try:
        compiled = lower(graph, device_index, donate).compile()
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
    return Executable(compiled, len(graph.nodes))


def _param_values(graph: Graph) -> list[Any]:
    return [
        np.asarray(p.payload, dtype=jax.numpy.dtype(p.dtype)) if p.op == SCALAR else p.payload
        for p in graph.params
    ]


def run_graph(
    graph: Graph, device_index: int, donate: tuple[int, ...] = (), cause: str = "mark_step"
) -> tuple[jax.Array, ...]:
    """Run ``graph`` on device ``device_index``; returns its root buffers without waiting.

    ``graph.key`` must include the device (``cut_graph``'s salt). ``donate`` lists parameters
    whose buffers the caller will never read again: XLA may reuse them for outputs.
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
    return tuple(outputs)


def wait_device_ops() -> None:
    """Block until every dispatched execution has finished."""
    jax.block_until_ready(_in_flight)
    _in_flight.clear()


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
    "cache_size",
    "drop_cache",
    "executable_memory",
    "lower",
    "run_graph",
    "stablehlo_text",
    "wait_device_ops",
]
