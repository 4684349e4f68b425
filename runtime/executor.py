"""Run cut graphs: their executable from the cache (executables.py) or compiled, or op by op
(interpret.py); arguments, donation and spare buffers (donation.py), the launch (launcher.py), and
the results of parameter-free graphs, which are reused."""

from __future__ import annotations

import collections
import functools
import sys
import time
from typing import Any

import jax
import numpy as np

from lazy_core.graph import Graph
from runtime import checks, config, history, interpret, metrics, processes
from runtime import spmd as spmd_
from runtime.checks import check_errors
from runtime.device import device, in_x64, platform_of
from runtime.donation import Donations
from runtime.executables import (
    Executable,
    ExecutableCache,
    GraphError,
    describe,
    lower,
    set_cache_dir,
)
from runtime.launcher import Launcher, failed, resolve
from runtime.timer import TIMER

_cache = ExecutableCache()
_donations = Donations()
_launcher = Launcher()
_in_flight: list[Any] = []  # the outputs of the last launch

# Outputs of parameter-free graphs by key. Such a graph computes the same values every time
# (transformers checks a mask derived from an arange at every step), so a sync on it reuses them
# instead of waiting behind the work queued on the device. Their buffers are never donated.
_constant_results: collections.OrderedDict[int, tuple] = collections.OrderedDict()
_constant_buffers: set[int] = set()  # ids of the cached output buffers
_CONSTANT_RESULTS = 64  # most recently used kept


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
    placements: tuple | None = None,
    layouts: list | None = None,
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
    LAZY_DEBUG. ``placements`` (one per root, or None) are the layouts on a mesh that roots must
    have (runtime/spmd.py): a graph on a mesh is compiled for its arguments' and outputs' layouts.
    ``layouts``, where given, gets the placement each root's output has (None: on one device).

    A graph with runtime checks waits for them and raises eager's error (an out-of-range index,
    an integer division by zero) before returning, so the caller keeps every previous value; with
    ``defer_checks`` it returns without waiting and ``check_errors`` raises the error later.
    """
    spmd = spmd_.layout(graph, placements)
    single = spmd is None
    if layouts is not None:
        layouts[:] = (None,) * len(graph.roots)
    if not single and processes.spans_processes(spmd.mesh[0]):
        processes.agree(graph, spmd.key)  # or raise: never a collective that waits forever
    reused = _reused_constant(graph, cause, site) if not graph.params and single else None
    if reused is not None:
        return reused
    recycles = held is not None and single and _recycles(device_index)
    plan = _donations.plan(
        graph, device_index, donate, partners, held if recycles else None, _constant_buffers
    )
    key = (graph.key, plan.donate, plan.order, plan.spares, None if single else spmd.key)
    exe = _cache.get(key)
    if exe is None and single and _interprets(graph.key, site):
        steps = interpret.Steps(graph, device_index)
        if steps.missing <= max(_FEW_NEW_OPS, len(steps.steps) // 8):
            return _interpreted(graph, steps, device_index, cause, site, defer_checks)
    hit = exe is not None
    if not hit:
        exe = _cache.compile(key, graph, device_index, cause, site, spmd)
        _site_graphs[site] = _site_graphs.get(site, 0) + 1
        if recycles:
            _donations.compiled(graph.key, plan)
    elif site in _site_graphs:
        del _site_graphs[site]  # its graphs come back: a new one is worth compiling whole
    if layouts is not None and exe.placements is not None:
        layouts[:] = exe.placements
    values = [*_param_values(graph, exe, device_index, spmd), *plan.values]
    # Listeners (LAZY_DEBUG) get each execution's line, with its dispatch time, in order.
    asynchronous = _threaded() and defer_checks and not metrics.listening()
    launch, outputs = _launcher.submit(
        functools.partial(_execute, exe, values, graph), len(graph.roots) + 1
    )
    if not asynchronous:
        launch.wait()  # a failed call raises here, before any storage takes its results
    _count_execution(graph, plan, cause, site, launch, "hit" if hit else "new")
    *outputs, rows = outputs
    _in_flight[:] = outputs
    if recycles and graph.params:
        _donations.remember(device_index, graph, outputs)
    if asynchronous:
        checks.launched(launch)
    if exe.errors:
        checks.dispatched(rows, exe.errors, wait=not defer_checks)
    elif not graph.params and single:
        _keep_constant(graph.key, tuple(outputs))
    return tuple(outputs)


def _reused_constant(graph: Graph, cause: str, site: str) -> tuple | None:
    """The outputs a parameter-free graph computed before, if they are kept and its launch did
    not fail."""
    found = _constant_results.get(graph.key)
    if found is not None and failed(found[0]):
        _forget_constant(graph.key)  # its launch failed: run the graph again
        return None
    if found is not None:
        _constant_results.move_to_end(graph.key)
        metrics.count("constant_results_reused")
        if metrics.listening():
            n = len(graph.nodes)
            metrics.event(metrics.GraphEvent("execute", cause, site, graph.key, n, 0.0, "reuse"))
    return found


def _threaded() -> bool:
    """Whether executables are called from the launch thread (``config.LAUNCH_THREAD``; unset:
    off the CPU platform)."""
    if _launcher.threaded is None:
        threaded = config.LAUNCH_THREAD
        _launcher.threaded = device(0).platform != "cpu" if threaded is None else threaded
    return _launcher.threaded


def _count_execution(
    graph: Graph, plan: Any, cause: str, site: str, launch: Any, kind: str
) -> None:
    metrics.count("executions")
    if plan.donate:
        metrics.count("donated_buffers", len(plan.donate))
    if plan.spares:
        metrics.count("spare_buffers", len(plan.spares))
    metrics.size("graph_nodes", len(graph.nodes))
    if metrics.listening():
        n = len(graph.nodes)
        e = metrics.GraphEvent("execute", cause, site, graph.key, n, launch.seconds, kind)
        metrics.event(e)


def _recycles(device_index: int) -> bool:
    """Whether full barriers on this device get spare buffers (``config.RECYCLE``)."""
    if config.RECYCLE is not None:
        return config.RECYCLE
    return device(device_index).platform not in ("cpu", "tpu")


def _param_values(
    graph: Graph, exe: Executable, device_index: int, spmd: spmd_.Spmd | None
) -> list[Any]:
    """The call's arguments: the buffer parameters, then an array per packed scalar dtype. On a
    mesh, one-device buffers are replicated on it, and the packed scalars too.

    A packed array the call passed last time too (a constant learning rate) is passed as its
    device copy, made once: a host array costs the call a transfer each time. One that changes
    (Adam's bias corrections) goes as the host array, as the call would copy it anyway (laid
    out by the executable's input sharding; a mesh over other processes' devices takes a
    global array, made here).
    """
    params = graph.params
    layout = exe.layout
    values = [params[i].payload for i in layout.data]
    if spmd is not None:
        values = spmd_.arguments(spmd, graph, values)
    for g, (dtype, members) in enumerate(layout.groups):
        array = np.array([params[i].payload for i in members], dtype=jax.numpy.dtype(dtype))
        raw = array.tobytes()  # bytes: -0.0 and 0.0 differ, equal NaNs match
        last, copy = exe.numbers[g]
        if raw != last and (spmd is None or not processes.spans_processes(spmd.mesh[0])):
            exe.numbers[g] = (raw, None)
            values.append(array)
            continue
        if copy is None or raw != last:
            if spmd is None:
                copy = jax.device_put(array, device(device_index))
            else:  # on a mesh: its layout, made here
                copy = spmd_.put(array, (spmd.mesh, (None,)))
            exe.numbers[g] = (raw, copy)
        values.append(copy)
    return values


# Per user call site: how many graphs were compiled whole for it since a graph there last came
# back (a cache hit): a site whose graphs keep changing never has one, while one that settles on a
# steady graph (a generation loop's decoding step) starts counting again, so the few graphs of its
# next shape set (another batch size) compile whole too. Per graph key: whether it ran op by op
# once already (a graph that comes back is compiled).
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
    outputs, rows, errors = interpret.interpret(graph, steps, device_index, platform)
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
        checks.dispatched(rows, errors, wait=not defer_checks)
    return outputs


@in_x64  # the launch thread's own mode: packed int64 and float64 scalars stay 64-bit
def _execute(exe: Executable, values: list, graph: Graph) -> tuple:
    """Call ``exe`` (on the launch thread): its roots, in root order, then its check rows."""
    start = time.perf_counter()
    try:
        *outputs, rows = exe.compiled(*[resolve(v) for v in values])
    except GraphError:
        raise  # an earlier launch's, read from its result
    except Exception as e:
        raise GraphError(f"running {describe(graph)} failed: {type(e).__name__}: {e}") from e
    dispatched = time.perf_counter()
    if exe.restore is not None:
        outputs = exe.restore(outputs)
    if exe.spmd is not None and exe.spmd.manual:  # this process's values, on its device
        outputs = [o.addressable_data(0) for o in outputs]
        rows = rows.addressable_data(0)
    metrics.time("dispatch_time", dispatched - start)
    TIMER.watch(start, rows)
    if exe.errors:
        rows.copy_to_host_async()  # read at a later barrier without waiting for the transfer
    return (*outputs, rows)


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


def raise_interrupt() -> None:
    """Raise the interrupt (Ctrl-C) that came while a launch was handed over, if one did: the
    caller has given the launch's results to their storages (launcher.Launcher._hand_over)."""
    interrupted = _launcher.take_interrupt()
    if interrupted is not None:
        raise interrupted


def wait_device_ops() -> None:
    """Block until every dispatched execution has finished and has been timed (and raise what it
    reported)."""
    _launcher.drain()
    in_flight = [resolve(o) for o in _in_flight if not failed(o)]
    _in_flight.clear()  # a failure below is raised once, not at every later wait
    try:
        jax.block_until_ready(in_flight)
    except Exception as e:  # a GPU reports a kernel's failure here, after the launch returned
        raise GraphError(f"running a graph failed: {type(e).__name__}: {e}") from e
    TIMER.drain()
    check_errors()


def executable_memory() -> list[dict[str, int]]:
    """XLA's memory accounting of every cached executable (ExecutableCache.memory)."""
    return _cache.memory()


def executable_texts() -> list[str]:
    """The optimized HLO of every cached executable, least recently used first (what XLA made
    of each graph: fusions, and on a mesh the collectives its partitioner inserted)."""
    return _cache.texts()


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
    "executable_texts",
    "lower",
    "reused_buffers",
    "run_graph",
    "set_cache_dir",
    "stablehlo_text",
    "wait_device_ops",
]


if config.DEBUG:
    metrics.listen(lambda e: print(e.line(), file=sys.stderr))
