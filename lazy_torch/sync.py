"""Barriers: cut the pending graph of some storages, run it, and make the results device data."""

from __future__ import annotations

import collections
import operator
import time
from collections.abc import Iterable
from typing import Any

import runtime
from lazy_core import Graph, Storage, cut_graph, pending_and_held, pending_storages
from lazy_core.ir import DATA
from lazy_core.rebase import computed_leaves, extra_outputs, rebase
from lazy_core.value import buffer_partners, settle, unheld
from lazy_torch import _native, host_reads
from lazy_torch import rng as _rng
from lazy_torch.sites import user_site


def _donatable(graph: Graph, held: set[int]) -> tuple[int, ...]:
    """Parameters whose buffers no live tensor keeps and that an output can reuse.

    At a full barrier every live value with pending IR is an output, so a buffer that no live
    storage still holds as its value is read by this graph for the last time. XLA can only reuse a
    donated buffer for an output of the same shape and dtype; others are not offered, and no more
    of a (shape, dtype) slot than there are outputs of it. What depends on the graph alone (the
    candidates and slots) is worked out once per graph key.
    """
    plan = _donation_plans.get(graph.key)
    if plan is None:
        if len(_donation_plans) >= 1024:
            _donation_plans.clear()
        counts = collections.Counter((r.shape, r.dtype) for r in graph.roots)
        slot_index = {slot: k for k, slot in enumerate(counts)}
        candidates = tuple(
            (i, slot_index[(p.shape, p.dtype)])
            for i, p in enumerate(graph.params)
            if p.op == DATA and (p.shape, p.dtype) in slot_index
        )
        plan = _donation_plans[graph.key] = (candidates, tuple(counts.values()))
    return unheld(graph.params, *plan, held)


# Per graph key: the DATA parameters an output could reuse, as (parameter index, slot index)
# pairs, and how many outputs each (shape, dtype) slot has.
_donation_plans: dict[int, tuple[tuple, tuple]] = {}


def _placements(group: list[Storage], graph: Graph) -> tuple | None:
    """The layout on a mesh that each root's value must have: its storage's (lazy_torch.
    distributed), so parameters and optimizer state keep theirs step after step; None for the
    values a partial sync computes for other readers. None when no storage has one."""
    found = [s.placement for s in group]
    if not any(p is not None for p in found):
        return None
    return (*found, *(None,) * (len(graph.roots) - len(found)))


_step = {"end": None, "synced": 0.0}  # when the last mark_step returned; sync time since
# While lazy_torch.compile watches a call: its watcher, told of each sync (lazy_torch/capture.py).
capture: Any = None


def sync(storages: Iterable[Storage], cause: str, held: set[int] | None = None) -> None:
    """Compute the pending values of ``storages``; afterwards each holds a device buffer.

    ``held`` (full barriers only, where every pending value is an output: the ids of the buffers
    that live storages hold) lets the graph reuse the other buffers it reads. If compiling fails,
    every storage keeps its pending value.
    """
    _native.cut_reset()
    if capture is not None:
        storages = list(storages)
        capture.on_sync(storages, cause)
    start = time.perf_counter()
    try:
        _sync(storages, cause, held)
    finally:
        _step["synced"] += time.perf_counter() - start


def _sync(storages: Iterable[Storage], cause: str, held: set[int] | None) -> None:
    by_device: dict[int, list[Storage]] = {}
    computed = False
    for s in storages:
        if s.pending:
            by_device.setdefault(s.device, []).append(s)
        else:
            computed = True
    # mark_step has advanced the RNG states, which are pending now; a capture keeps its draws
    # counted from the state its call started with (lazy_torch/capture.py).
    if cause != "mark_step" and capture is None:
        for device, group in by_device.items():
            state = _rng.settle(device)
            if state is not None:
                group.append(state)
    graphs = {
        device: cut_graph([s.node for s in group], salt=("device", device))
        for device, group in by_device.items()
    }
    # A partial sync also computes what other live values need of its graph (lazy_core/rebase.py).
    extra: dict[int, list] = {}
    if cause != "mark_step":
        for device, group in by_device.items():
            pending = pending_storages(device)
            contained, read, readers = extra_outputs(graphs[device], group, pending)
            if contained or read:
                group.extend(contained)
                roots = [s.node for s in group] + read
                graphs[device] = cut_graph(roots, salt=("device", device))
            extra[device] = readers
    # An out-of-range index in an earlier, asynchronous step surfaces at the next barrier; a read
    # waits for it unless what it reads depends on no earlier step (no device data at all).
    reads_data = computed or any(p.op == DATA for g in graphs.values() for p in g.params)
    runtime.check_errors(wait=cause != "mark_step" and reads_data)
    if not by_device:
        return
    site = user_site()
    runtime.metrics.count(f"syncs::{cause}")
    runtime.metrics.site(f"syncs::{cause}", site)
    for device, group in by_device.items():
        graph = graphs[device]
        donated = _donatable(graph, held) if held is not None else ()
        # Each donated buffer goes to the new value of the storage that held it: reused for
        # another storage's value, XLA would copy the old value away first (and the new one in),
        # two kernels per parameter of an optimizer step.
        partners = buffer_partners(group, graph.params, donated, graph.roots) if donated else None
        layouts: list | None = [] if runtime.spmd.active() else None
        placements = _placements(group, graph) if layouts is not None else None
        outputs = None
        if cause != "mark_step" and layouts is None:  # a small read: maybe on the host
            outputs = host_reads.evaluate(graph, device, cause, site)
        if outputs is None:
            outputs = runtime.run_graph(
                graph,
                device,
                donated,
                cause,
                defer_checks=cause == "mark_step",
                site=site,
                partners=partners,
                held=held,
                placements=placements,
                layouts=layouts,
            )
        leaves = computed_leaves(graph.roots, outputs) if device in extra else None
        settle(group, graph.roots, outputs)
        if layouts is not None:  # each storage keeps the layout its value got, for its next
            for s, placement in zip(group, layouts):  # update
                s.placement = placement
        if leaves is not None:
            rebase(extra[device], leaves)
    runtime.raise_interrupt()  # a Ctrl-C during a launch's hand-over, now that nothing is lost


def _auto_cut(func: Any) -> bool:
    """The program recorded ``config.CUT_NODES`` nodes since its last barrier without reaching
    one (a loop with no mark_step()): dispatch every pending value, as a read would, before the
    next op (LAZY_DEBUG shows the cut as cause "auto_cut" at the user's line). A capture
    (lazy_torch.compile) records one region whatever its size.

    Cuts fall where the loop comes round: once the count is reached, the cut waits (returning
    True: asked again before the next op ``func``) for that moment's op at that user's line to
    come back after other ops ran, and falls before it, where the next iteration records it;
    later cuts wait for the same op and line. So the segments after the first hold the same
    whole iterations and compile once (re-rolling). A program that does not come back to it
    within as many ops again is cut where it is, and its op and line are remembered instead."""
    if capture is not None:
        return False
    site = (user_site(), func)
    if _loop["site"] is None:
        _loop.update(site=site, left=False, waited=0)
        return True
    if site != _loop["site"]:
        _loop["left"] = True
    elif _loop["left"]:
        _loop.update(left=False, waited=0)
        sync(pending_storages(), cause="auto_cut")
        return False
    _loop["waited"] += 1
    if _loop["waited"] <= _loop["every"]:
        return True
    _loop.update(site=site, left=False, waited=0)
    sync(pending_storages(), cause="auto_cut")
    return False


# The op and user's line automatic cuts fall before, whether another ran since the count was
# reached, and how many ops the current cut has waited.
_loop: dict[str, Any] = {"site": None, "left": False, "waited": 0, "every": 0}


def configure_cuts(every: int) -> None:
    """Cut the pending graph automatically after ``every`` new nodes (0: never)."""
    _loop.update(site=None, left=False, waited=0, every=every)
    _native.configure_cuts(every, _auto_cut)


_recorded = operator.attrgetter("node.seq")


def mark_step(wait: bool = False) -> None:
    """Cut the pending graph of every live lazy tensor and dispatch it; returns without waiting.

    Metrics: ``trace_time`` is the host time since the previous mark_step outside barriers
    (tracing, and whatever else the loop did), ``step_time`` the whole time between the two.

    >>> import torch, lazy_torch
    >>> x = torch.ones(2, device="lazy") * 3
    >>> lazy_torch.mark_step()
    >>> x.tolist()
    [3.0, 3.0]
    """
    start = time.perf_counter()
    if _step["end"] is not None:
        runtime.metrics.time("trace_time", start - _step["end"] - _step["synced"])
    runtime.metrics.count("mark_steps")
    _rng.advance()
    pending, held = pending_and_held()
    # Roots in the order their values were recorded, not the storages' creation order: a program
    # that made a storage (the RNG state, say) later in one run than in another is the same graph.
    pending.sort(key=_recorded)
    held.update(runtime.reused_buffers())  # results of parameter-free graphs are reused later
    sync(pending, cause="mark_step", held=held if runtime.config.DONATE else None)
    runtime.metrics.time("mark_step_time", time.perf_counter() - start)
    if wait:
        runtime.wait_device_ops()
    end = time.perf_counter()
    if _step["end"] is not None:
        runtime.metrics.time("step_time", end - _step["end"])
    _step["end"], _step["synced"] = end, 0.0


configure_cuts(runtime.config.CUT_NODES)
