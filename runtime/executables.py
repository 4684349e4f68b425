"""Compiled executables: a cut graph lowered to StableHLO and compiled by XLA, and the cache of
them (``ExecutableCache``); JAX's persistent cache keeps them across processes."""

from __future__ import annotations

import collections
import operator
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.monitoring
from jax.experimental.compilation_cache import compilation_cache

from lazy_core.dump import ir_text
from lazy_core.graph import Graph, key_text
from runtime import config, history, interpret, metrics
from runtime import spmd as spmd_
from runtime.device import device, in_x64, platform_of
from runtime.program import ParamLayout, build_function


class GraphError(RuntimeError):
    """Compiling or running a graph failed; every tensor keeps its previous value."""


class Executable:
    __slots__ = ("compiled", "errors", "layout", "numbers", "placements", "restore", "spmd")

    def __init__(
        self,
        compiled: Any,
        errors: list,
        layout: ParamLayout,
        order: tuple[int, ...] | None,
        spmd: spmd_.Spmd | None = None,
    ):
        self.compiled = compiled
        self.spmd = spmd  # how it runs on a mesh (runtime/spmd.py), or None
        self.errors = errors  # how to build the error of each runtime-check row (program.py)
        self.layout = layout  # the arguments of the graph's parameters
        # Per packed scalar argument: the bytes of its last value and, once a call passed the
        # same bytes again, their device copy (_param_values).
        self.numbers: list[tuple[bytes, Any]] = [(b"", None)] * len(layout.groups)
        # Takes the outputs from ``order`` (the executable's: position -> root) back to root
        # order; None when they come in it.
        self.restore = None if order is None else _restorer(order)
        # Each root's placement on the graph's mesh, in root order (runtime/spmd.py): what its
        # storage keeps for its next value. None off a mesh, and for a manual graph's outputs
        # (each process's own, on its device).
        self.placements: tuple | None = None


def _restorer(order: tuple[int, ...]) -> Callable[[list], tuple]:
    inverse = [0] * len(order)
    for position, k in enumerate(order):
        inverse[k] = position
    return tuple if len(inverse) == 1 else operator.itemgetter(*inverse)


# ----------------------------------------------------------------------------------------------
# The persistent cache: XLA executables survive the process in JAX's compilation cache, keyed by
# the StableHLO module, so a second process running the same program skips XLA compilation.

_persistent_hits = [0]


def _on_jax_event(name: str, **_: Any) -> None:
    if name == "/jax/compilation_cache/cache_hits":
        _persistent_hits[0] += 1


jax.monitoring.register_event_listener(_on_jax_event)


def set_cache_dir(path: str | os.PathLike | None) -> None:
    """Keep compiled executables in ``path`` (created if missing) for later processes, however
    fast they compiled; None turns the persistent cache off."""
    if path is not None:
        path = os.fspath(path)
        os.makedirs(path, exist_ok=True)
    compilation_cache.reset_cache()  # JAX reads the directory once, at its first compile
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


if config.CACHE_DIR:
    set_cache_dir(config.CACHE_DIR)


def describe(graph: Graph) -> str:
    return f"graph {key_text(graph.key)} ({len(graph.nodes)} nodes)"


def _layout(graph: Graph) -> ParamLayout:
    return ParamLayout([(p.op, p.dtype) for p in graph.params])


def _param_specs(
    graph: Graph, layout: ParamLayout, device_index: int, spmd: spmd_.Spmd | None = None
) -> list[jax.ShapeDtypeStruct]:
    """Each argument's shape, dtype and sharding: on the device, or on the graph's mesh (its
    parameter's placement; numbers replicated)."""
    single = jax.sharding.SingleDeviceSharding(device(device_index))
    params = graph.params
    if spmd is None:
        shardings = [single] * len(layout.data)
        numbers = single
    else:
        shardings = [spmd_.sharding_of(spmd.params[i]) for i in layout.data]
        numbers = spmd_.replicated(spmd.mesh)
    specs = [
        jax.ShapeDtypeStruct(params[i].shape, jax.numpy.dtype(params[i].dtype), sharding=s)
        for i, s in zip(layout.data, shardings)
    ]
    specs += [
        jax.ShapeDtypeStruct((len(members),), jax.numpy.dtype(dtype), sharding=numbers)
        for dtype, members in layout.groups
    ]
    return specs


@in_x64
def lower(graph: Graph, device_index: int, donate: tuple[int, ...] = ()) -> Any:
    """``jax.stages.Lowered`` of the graph (its StableHLO is ``.as_text()``)."""
    return _lower(graph, graph.plan(), _layout(graph), device_index, donate)[0]


def _lower(
    graph: Graph,
    plan: tuple,
    layout: ParamLayout,
    device_index: int,
    donate: tuple[int, ...],
    order: tuple[int, ...] | None = None,
    spares: tuple = (),
    spmd: spmd_.Spmd | None = None,
) -> tuple:
    outputs = graph.outputs()
    if order is not None:
        outputs = tuple(outputs[k] for k in order)
    platform = platform_of(device_index)
    if spmd is None:
        fn = build_function(plan, outputs, layout, platform)
    elif spmd.manual:  # each process's device runs it on its own values (runtime/spmd.py)
        mesh = spmd_.mesh_of(spmd.mesh)
        fn = build_function(plan, outputs, layout, platform, mesh)
        whole = jax.sharding.PartitionSpec()
        n_args = len(layout.data) + len(layout.groups)
        errors, fn = fn.errors, jax.shard_map(
            fn, mesh=mesh, in_specs=(whole,) * n_args, out_specs=(whole,) * (len(outputs) + 1),
            check_vma=False,
        )  # fmt: skip
        fn.errors = errors
    else:
        roots = spmd.roots if order is None else tuple(spmd.roots[k] for k in order)
        shardings = tuple(None if p is None else spmd_.sharding_of(p) for p in roots)
        fn = build_function(plan, outputs, layout, platform, spmd_.mesh_of(spmd.mesh), shardings)
    specs = _param_specs(graph, layout, device_index, spmd)
    argnums = layout.arguments(donate)
    if spares:  # unused arguments after the parameters', donated (donation.py)
        n = len(specs)
        sharding = jax.sharding.SingleDeviceSharding(device(device_index))
        specs += [
            jax.ShapeDtypeStruct(shape, jax.numpy.dtype(dtype), sharding=sharding)
            for shape, dtype in spares
        ]
        argnums += tuple(range(n, len(specs)))
    jitted = jax.jit(fn, donate_argnums=argnums, keep_unused=bool(spares))
    return jitted.lower(*specs), fn.errors


def _compile(
    graph: Graph,
    device_index: int,
    donate: tuple[int, ...],
    cause: str,
    site: str,
    order: tuple[int, ...] | None = None,
    spares: tuple = (),
    spmd: spmd_.Spmd | None = None,
) -> Executable:
    start = time.perf_counter()
    plan = graph.plan()
    layout = _layout(graph)
    lowered = None
    try:
        lowered, errors = _lower(graph, plan, layout, device_index, donate, order, spares, spmd)
        lowered_at = time.perf_counter()
        hits = _persistent_hits[0]
        compiled = lowered.compile()
    except Exception as e:
        _dump(graph, lowered, f"failed: {type(e).__name__}: {e}")
        raise GraphError(f"compiling {describe(graph)} failed: {type(e).__name__}: {e}") from e
    end = time.perf_counter()
    persistent = _persistent_hits[0] > hits
    metrics.count("persistent_cache_hits" if persistent else "compiles")
    metrics.time("compile_time", end - start)
    metrics.time("lowering_time", lowered_at - start)
    reason = history.record(site, graph, plan, donate, order, len(spares))
    if reason:
        metrics.count("recompiles")
    e = metrics.GraphEvent(
        "compile", cause, site, graph.key, len(graph.nodes), end - start,
        "persistent" if persistent else "miss", reason,
    )  # fmt: skip
    _dump(graph, lowered, e.line())
    metrics.event(e)
    exe = Executable(compiled, errors, layout, order, spmd)
    if spmd is not None and not spmd.manual:
        *shardings, _ = compiled.output_shardings
        if exe.restore is not None:
            shardings = exe.restore(shardings)
        exe.placements = tuple(
            spmd_.placement_of_sharding(s, len(r.shape)) for s, r in zip(shardings, graph.roots)
        )
    return exe


_dumped = [0]


def _dump(graph: Graph, lowered: Any, header: str) -> None:
    """With LAZY_DUMP_DIR, write a newly compiled graph's IR text and StableHLO, named by its
    compile order and graph hash."""
    if not config.DUMP_DIR:
        return
    os.makedirs(config.DUMP_DIR, exist_ok=True)
    _dumped[0] += 1
    stem = os.path.join(config.DUMP_DIR, f"{_dumped[0]:04d}-{key_text(graph.key)}")
    with open(stem + ".ir.txt", "w") as f:
        f.write(f"# {header}\n{ir_text(graph.roots)}\n")
    if lowered is not None:
        with open(stem + ".stablehlo.mlir", "w") as f:
            f.write(lowered.as_text())


class ExecutableCache:
    """Executables by ``(graph key, donated parameters, output order, spare buffers, layout on a
    mesh)``, least recently used first: at most ``config.EXECUTABLES``, and the older half shed
    when the process holds more than ``config.MAPPINGS`` memory mappings (their JIT code)."""

    def __init__(self) -> None:
        self._entries: collections.OrderedDict[tuple, Executable] = collections.OrderedDict()
        self._compiled = 0

    def get(self, key: tuple) -> Executable | None:
        exe = self._entries.get(key)
        if exe is not None:
            metrics.count("cache_hits")
            self._entries.move_to_end(key)
        return exe

    def compile(
        self,
        key: tuple,
        graph: Graph,
        device_index: int,
        cause: str,
        site: str,
        spmd: spmd_.Spmd | None = None,
    ) -> Executable:
        """Compile ``graph`` for ``key`` (its donation, order, spares and ``spmd``'s key) and
        keep it."""
        _, donate, order, spares, _ = key
        exe = _compile(graph, device_index, donate, cause, site, order, spares, spmd)
        self._entries[key] = exe
        self._bound()
        return exe

    def _bound(self) -> None:
        excess = len(self._entries) - config.EXECUTABLES
        self._compiled += 1
        if config.MAPPINGS and self._compiled % 16 == 0 and _mappings() > config.MAPPINGS:
            excess = max(excess, len(self._entries) // 2)
            interpret.shed(interpret.cache_size() // 2)
        for _ in range(excess):
            self._entries.popitem(last=False)
            metrics.count("executables_evicted")

    def memory(self) -> list[dict[str, int]]:
        """XLA's memory accounting of every cached executable: bytes of arguments, outputs,
        outputs aliased to donated arguments, temporaries, and the peak they imply."""
        out = []
        for exe in self._entries.values():
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

    def texts(self) -> list[str]:
        return [exe.compiled.as_text() for exe in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0
