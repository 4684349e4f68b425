"""Compile cut graphs to XLA executables (cached by graph key) and run them asynchronously."""

from __future__ import annotations

import atexit
import collections
import functools
import operator
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.monitoring
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from lazy_core.dump import ir_text
from lazy_core.graph import Graph, key_text
from runtime import config, history, interpret, metrics
from runtime.device import device, in_x64, platform_of
from runtime.donation import Donations
from runtime.launcher import Launch, Launcher, failed, is_ready, resolve
from runtime.program import ParamLayout, build_function


class GraphError(RuntimeError):
    """Compiling or running a graph failed; every tensor keeps its previous value."""


class Executable:
    __slots__ = ("compiled", "errors", "layout", "numbers", "restore")

    def __init__(
        self, compiled: Any, errors: list, layout: ParamLayout, order: tuple[int, ...] | None
    ):
        self.compiled = compiled
        self.errors = errors  # how to build the error of each runtime-check row (program.py)
        self.layout = layout  # the arguments of the graph's parameters
        # Per packed scalar argument: the bytes of its last value and, once a call passed the
        # same bytes again, their device copy (_param_values).
        self.numbers: list[tuple[bytes, Any]] = [(b"", None)] * len(layout.groups)
        # Takes the outputs from ``order`` (the executable's: position -> root) back to root
        # order; None when they come in it.
        self.restore = None if order is None else _restorer(order)


def _restorer(order: tuple[int, ...]) -> Callable[[list], tuple]:
    inverse = [0] * len(order)
    for position, k in enumerate(order):
        inverse[k] = position
    return tuple if len(inverse) == 1 else operator.itemgetter(*inverse)


# Least recently used first; at most config.EXECUTABLES.
_cache: collections.OrderedDict[Any, Executable] = collections.OrderedDict()
_donations = Donations()
_launcher = Launcher()
_in_flight: list[Any] = []  # the outputs of the last launch
# Asynchronous launches whose failure, if any, the next barrier has not raised yet.
_launched: list[Launch] = []

# Outputs of parameter-free graphs by key. Such a graph computes the same values every time
# (transformers checks a mask derived from an arange at every step), so a sync on it reuses them
# instead of waiting behind the work queued on the device. Their buffers are never donated.
_constant_results: collections.OrderedDict[int, tuple] = collections.OrderedDict()
_constant_buffers: set[int] = set()  # ids of the cached output buffers
_CONSTANT_RESULTS = 64  # most recently used kept


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


def _describe(graph: Graph) -> str:
    return f"graph {key_text(graph.key)} ({len(graph.nodes)} nodes)"


def _layout(graph: Graph) -> ParamLayout:
    return ParamLayout([(p.op, p.dtype) for p in graph.params])


def _param_specs(
    graph: Graph, layout: ParamLayout, device_index: int
) -> list[jax.ShapeDtypeStruct]:
    sharding = jax.sharding.SingleDeviceSharding(device(device_index))
    params = graph.params
    specs = [
        jax.ShapeDtypeStruct(params[i].shape, jax.numpy.dtype(params[i].dtype), sharding=sharding)
        for i in layout.data
    ]
    specs += [
        jax.ShapeDtypeStruct((len(members),), jax.numpy.dtype(dtype), sharding=sharding)
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
) -> tuple:
    outputs = graph.outputs()
    if order is not None:
        outputs = tuple(outputs[k] for k in order)
    fn = build_function(plan, outputs, layout, platform_of(device_index))
    specs = _param_specs(graph, layout, device_index)
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
) -> Executable:
    start = time.perf_counter()
    plan = graph.plan()
    layout = _layout(graph)
    lowered = None
    try:
        lowered, errors = _lower(graph, plan, layout, device_index, donate, order, spares)
        lowered_at = time.perf_counter()
        hits = _persistent_hits[0]
        compiled = lowered.compile()
    except Exception as e:
        _dump(graph, lowered, f"failed: {type(e).__name__}: {e}")
        raise GraphError(f"compiling {_describe(graph)} failed: {type(e).__name__}: {e}") from e
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
    return Executable(compiled, errors, layout, order)


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


def _recycles(device_index: int) -> bool:
    """Whether full barriers on this device get spare buffers (``config.RECYCLE``)."""
    if config.RECYCLE is not None:
        return config.RECYCLE
    return device(device_index).platform not in ("cpu", "tpu")


def _param_values(graph: Graph, exe: Executable, device_index: int) -> list[Any]:
    """The call's arguments: the buffer parameters, then an array per packed scalar dtype.

    A packed array the call passed last time too (a constant learning rate) is passed as its
    device copy, made once: a host array costs the call a transfer each time. One that changes
    (Adam's bias corrections) goes as the host array, as the call would copy it anyway.
    """
    params = graph.params
    layout = exe.layout
    values = [params[i].payload for i in layout.data]
    for g, (dtype, members) in enumerate(layout.groups):
        array = np.array([params[i].payload for i in members], dtype=jax.numpy.dtype(dtype))
        raw = array.tobytes()  # bytes: -0.0 and 0.0 differ, equal NaNs match
        last, copy = exe.numbers[g]
        if raw != last:
            exe.numbers[g] = (raw, None)
            values.append(array)
            continue
        if copy is None:
            copy = jax.device_put(array, device(device_index))
            exe.numbers[g] = (raw, copy)
        values.append(copy)
    return values


@in_x64  # the IR's 64-bit types, while the user's own JAX keeps its mode
def run_graph(
    graph: Graph,
    device_index: int,
    donate: tuple[int, ...] = (),
    cause: str = "mark_step",
    defer_checks: bool = False,
    site: str = "<unknown>",
    partners: dict[int, int] | None = None,
    held: set[int] | None = None,
) -> tuple[jax.Array, ...]:
    """Run ``graph`` on device ``device_index``; returns its root buffers (``Deferred`` while
    an asynchronous launch is queued: ``resolve`` reads them).

    ``graph.key`` must include the device (``cut_graph``'s salt). ``donate`` lists parameters
    whose buffers the caller will never read again (none of ``reused_buffers()``): XLA may reuse
    them for outputs, and ``partners`` maps a donated parameter to the root that should reuse its
    buffer (the new value of what it held). At a full barrier, ``held`` holds the ids of the
    buffers live storages hold: the outputs of the device's previous full barrier outside it go
    to this graph's outputs as spare buffers (donation.py; ``LAZY_RECYCLE``).
    ``cause`` and ``site`` (the user's ``file:line``) say what cut the graph, for metrics and
    LAZY_DEBUG.

    A graph with runtime checks waits for them and raises eager's error (an out-of-range index,
    an integer division by zero) before returning, so the caller keeps every previous value; with
    ``defer_checks`` it returns without waiting and ``check_errors`` raises the error later.
    """
    if not graph.params:
        found = _constant_results.get(graph.key)
        if found is not None and failed(found[0]):
            _forget_constant(graph.key)  # its launch failed: run the graph again
            found = None
        if found is not None:
            _constant_results.move_to_end(graph.key)
            metrics.count("constant_results_reused")
            if metrics.listening():
                n = len(graph.nodes)
                metrics.event(
                    metrics.GraphEvent("execute", cause, site, graph.key, n, 0.0, "reuse")
                )
            return found
    recycles = held is not None and _recycles(device_index)
    plan = _donations.plan(
        graph, device_index, donate, partners, held if recycles else None, _constant_buffers
    )
    donate, order, spares = plan.donate, plan.order, plan.spares
    key = (graph.key, donate, order, spares)
    exe = _cache.get(key)
    if exe is None and _interprets(graph.key, site):
        steps = interpret.Steps(graph, device_index)
        if steps.missing <= max(_FEW_NEW_OPS, len(steps.steps) // 8):
            return _interpreted(graph, steps, device_index, cause, site, defer_checks)
    hit = exe is not None
    if hit:
        metrics.count("cache_hits")
        _cache.move_to_end(key)
    else:
        exe = _cache[key] = _compile(graph, device_index, donate, cause, site, order, spares)
        _site_graphs[site] = _site_graphs.get(site, 0) + 1
        _bound_cache()
        if recycles:
            _donations.compiled(graph.key, plan)
    values = [*_param_values(graph, exe, device_index), *plan.values]
    if _launcher.threaded is None:
        threaded = config.LAUNCH_THREAD
        _launcher.threaded = device(0).platform != "cpu" if threaded is None else threaded
    # Listeners (LAZY_DEBUG) get each execution's line, with its dispatch time, in order.
    asynchronous = _launcher.threaded and defer_checks and not metrics.listening()
    launch, outputs = _launcher.submit(
        functools.partial(_execute, exe, values, graph), len(graph.roots) + 1
    )
    if not asynchronous:
        launch.wait()  # a failed call raises here, before any storage takes its results
    metrics.count("executions")
    if donate:
        metrics.count("donated_buffers", len(donate))
    if spares:
        metrics.count("spare_buffers", len(spares))
    metrics.size("graph_nodes", len(graph.nodes))
    if metrics.listening():
        n = len(graph.nodes)
        kind = "hit" if hit else "new"
        metrics.event(
            metrics.GraphEvent("execute", cause, site, graph.key, n, launch.seconds, kind)
        )
    *outputs, checks = outputs
    _in_flight[:] = outputs
    if recycles and graph.params:
        _donations.remember(device_index, graph, outputs)
    if asynchronous:
        _launched.append(launch)
    if exe.errors:
        _unchecked.append((checks, exe.errors))
        if not defer_checks:
            check_errors()
    elif not graph.params:
        _keep_constant(graph.key, tuple(outputs))
    return tuple(outputs)


# Per user call site: how many graphs were compiled whole for it. Per graph key: whether it ran
# op by op once already (a graph that comes back is compiled).
_site_graphs: dict[str, int] = {}
_interpreted_once: collections.OrderedDict[int, None] = collections.OrderedDict()


def _interprets(key: int, site: str) -> bool:
    """Whether a graph new to the cache runs op by op (``config.INTERPRET_AFTER``)."""
    limit = config.INTERPRET_AFTER
    if not limit or _site_graphs.get(site, 0) < limit or site == "<unknown>":
        return False
    if key in _interpreted_once:
        del _interpreted_once[key]
        return False
    _interpreted_once[key] = None
    if len(_interpreted_once) > config.EXECUTABLES:
        _interpreted_once.popitem(last=False)
    return True


# A graph runs op by op only if it needs at most this many new op executables (or an eighth of
# its nodes' worth): each costs about as much to compile as a small graph.
_FEW_NEW_OPS = 16


def _interpreted(
    graph: Graph,
    steps: interpret.Steps,
    device_index: int,
    cause: str,
    site: str,
    defer_checks: bool,
) -> tuple[jax.Array, ...]:
    start = time.perf_counter()
    platform = platform_of(device_index)
    outputs, checks, errors = interpret.interpret(graph, steps, device_index, platform)
    seconds = time.perf_counter() - start
    metrics.count("executions")
    metrics.count("interpreted_graphs")
    metrics.size("graph_nodes", len(graph.nodes))
    if metrics.listening():
        n = len(graph.nodes)
        e = metrics.GraphEvent("execute", cause, site, graph.key, n, seconds, "op by op")
        metrics.event(e)
    _in_flight[:] = outputs
    if errors:
        _unchecked.append((checks, errors))
        if not defer_checks:
            check_errors()
    return outputs


_compiled = [0]


def _bound_cache() -> None:
    """Keep at most ``config.EXECUTABLES`` executables, and shed the least recently used half when
    the process holds more than ``config.MAPPINGS`` memory mappings (their JIT code)."""
    excess = len(_cache) - config.EXECUTABLES
    _compiled[0] += 1
    if config.MAPPINGS and _compiled[0] % 16 == 0 and _mappings() > config.MAPPINGS:
        excess = max(excess, len(_cache) // 2)
        interpret.shed(interpret.cache_size() // 2)
    for _ in range(excess):
        _cache.popitem(last=False)
        metrics.count("executables_evicted")


def _mappings() -> int:
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


@in_x64  # the launch thread's own mode: packed int64 and float64 scalars stay 64-bit
def _execute(exe: Executable, values: list, graph: Graph) -> tuple:
    """Call ``exe`` (on the launch thread): its roots, in root order, then its check rows."""
    start = time.perf_counter()
    try:
        *outputs, checks = exe.compiled(*[resolve(v) for v in values])
    except GraphError:
        raise  # an earlier launch's, read from its result
    except Exception as e:
        raise GraphError(f"running {_describe(graph)} failed: {type(e).__name__}: {e}") from e
    dispatched = time.perf_counter()
    if exe.restore is not None:
        outputs = exe.restore(outputs)
    metrics.time("dispatch_time", dispatched - start)
    _timer.watch(start, checks)
    if exe.errors:
        checks.copy_to_host_async()  # read at a later barrier without waiting for the transfer
    return (*outputs, checks)


def reused_buffers() -> set[int]:
    """Ids of the buffers that later syncs reuse as results of parameter-free graphs: never to be
    donated (the caller's ``held``; read-only)."""
    return _constant_buffers


def _keep_constant(key: int, outputs: tuple) -> None:
    _constant_results[key] = outputs
    _constant_buffers.update(id(o) for o in outputs)
    if len(_constant_results) > _CONSTANT_RESULTS:
        _forget_constant(next(iter(_constant_results)))


def _forget_constant(key: int) -> None:
    _constant_buffers.difference_update(id(o) for o in _constant_results.pop(key))


class _ExecutionTimer:
    """Times executions on the device: a background thread waits for a timed one's check rows (an
    output nobody else holds, so donation never races with the wait) and records the time from
    its dispatch, or from the end of the previous one, to its end.

    Each wake of that thread takes the GIL from the tracing thread: timing every execution made a
    small CPU training step measurably slower (figures: benchmarks/RESULTS.md, "Execution timing").
    So it times two consecutive executions in every ``config.TIME_EXECUTIONS`` launches, and every
    one while anything listens to graph events. An execution is recorded only when its start is
    known: the previous launch was timed too, or had finished when this one was dispatched; back to
    back, that is the second of each pair."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._launches = 0
        self._untimed: jax.Array | None = None  # the previous launch's rows, if it went untimed
        atexit.register(self.stop)

    def watch(self, start: float, rows: jax.Array) -> None:
        """Called for each launch, in launch order, from the thread that launches."""
        n, self._launches = self._launches, self._launches + 1
        if n % config.TIME_EXECUTIONS > 1 and not metrics.listening():
            self._untimed = rows
            return
        previous, self._untimed = self._untimed, None
        known = previous is None or previous.is_ready()  # else it may still be running
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lazy-exec-timer", daemon=True)
            self._thread.start()
        self._queue.put((start, rows, known))

    def drain(self) -> None:
        """Wait until every execution watched so far has been timed."""
        self._queue.join()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        last = 0.0
        while (item := self._queue.get()) is not None:
            start, rows, known = item
            try:
                rows.block_until_ready()
                end = time.perf_counter()
                if known:
                    metrics.time("execute_time", end - max(start, last))
                last = end
            except Exception:  # noqa: BLE001, S110 (a failed execution raises where it is observed)
                pass
            finally:
                self._queue.task_done()
        self._queue.task_done()


_timer = _ExecutionTimer()


# Runtime checks of dispatched executions nobody has looked at yet: (device rows, error builders).
_unchecked: list[tuple[jax.Array, list]] = []


def raise_interrupt() -> None:
    """Raise the interrupt (Ctrl-C) that came while a launch was handed over, if one did: the
    caller has given the launch's results to their storages (launcher.Launcher._hand_over)."""
    interrupted = _launcher.take_interrupt()
    if interrupted is not None:
        raise interrupted


def check_errors(wait: bool = True) -> None:
    """Raise the first error an asynchronous step reported: a failed launch, or a runtime check
    (out-of-range index, division by zero). Each is raised once.

    With ``wait=False`` launches and executions still running are left for a later call."""
    launched = list(_launched)
    _launched.clear()
    for i, launch in enumerate(launched):
        if not wait and not launch.done():
            _launched.extend(launched[i:])
            break
        if launch.wait_quietly() is not None:
            _launched.extend(launched[i + 1 :])
            raise launch.error
    pending = list(_unchecked)
    _unchecked.clear()
    for i, (checks, errors) in enumerate(pending):
        if failed(checks):
            continue  # the failed launch itself was raised
        if not wait and not (is_ready(checks) and resolve(checks).is_ready()):
            _unchecked.append(pending[i])
            continue
        rows = np.asarray(resolve(checks))
        for (bad, index), (bound, dim, size) in zip(rows.tolist(), errors):
            if bad:
                raise bound.error(index, dim, size)


def wait_device_ops() -> None:
    """Block until every dispatched execution has finished and has been timed (and raise what it
    reported)."""
    _launcher.drain()
    jax.block_until_ready([resolve(o) for o in _in_flight if not failed(o)])
    _in_flight.clear()
    _timer.drain()
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
    """Forget every compiled executable, reused result and the recompile history of this
    process."""
    _cache.clear()
    _constant_results.clear()
    _constant_buffers.clear()
    _site_graphs.clear()
    _interpreted_once.clear()
    interpret.drop_cache()
    history.reset()


__all__ = [
    "GraphError",
    "cache_size",
    "check_errors",
    "drop_cache",
    "executable_memory",
    "lower",
    "reused_buffers",
    "run_graph",
    "set_cache_dir",
    "stablehlo_text",
    "wait_device_ops",
]


if config.DEBUG:
    metrics.listen(lambda e: print(e.line(), file=sys.stderr))
