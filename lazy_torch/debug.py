"""Debugging: graph dumps of pending lazy tensors (IR text, Graphviz dot, StableHLO) and
``explain``, which runs a function once and says which graphs, compiles, syncs and fallbacks it
caused, with the user's call sites."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import runtime
from lazy_core import cut_graph
from lazy_core import ir_dot as _ir_dot
from lazy_core import ir_text as _ir_text
from lazy_torch import sites
from lazy_torch.sync import mark_step as _mark_step
from lazy_torch.tensor import LazyTensor

record_sites = sites.record_sites


def ir_text(*tensors: LazyTensor) -> str:
    """The pending IR graph of ``tensors``, one node a line.

    >>> import torch, lazy_torch
    >>> x = torch.zeros(2, device="lazy")
    >>> print(lazy_torch.debug.ir_text(x + 2).splitlines()[-2])
      ROOT 0: %3
    """
    return _ir_text([t._lazy.node for t in tensors])


def ir_dot(*tensors: LazyTensor) -> str:
    """The pending IR graph of ``tensors`` as Graphviz dot, nodes colored by op category (the
    lowering module: elementwise, reduction, linalg, movement, ...); ``dot -Tsvg`` renders it."""
    return _ir_dot([t._lazy.node for t in tensors], category=runtime.op_category)


def stablehlo_text(*tensors: LazyTensor) -> str:
    """The StableHLO module that would compute ``tensors`` (nothing is compiled or run)."""
    device = tensors[0]._lazy.device if tensors else 0
    graph = cut_graph([t._lazy.node for t in tensors], salt=("device", device))
    return runtime.stablehlo_text(graph, device)


@dataclass
class Explanation:
    """What one call did: its graph events (compiles and executions, in order), the counters it
    changed and the user call sites of its syncs and fallbacks."""

    name: str
    result: Any
    seconds: float
    events: list[runtime.metrics.GraphEvent] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    sites: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def compiles(self) -> list[runtime.metrics.GraphEvent]:
        return [e for e in self.events if e.kind == "compile"]

    @property
    def executions(self) -> list[runtime.metrics.GraphEvent]:
        return [e for e in self.events if e.kind == "execute"]

    def _of(self, prefix: str) -> dict[str, dict[str, int]]:
        return {k[len(prefix) :]: v for k, v in self.sites.items() if k.startswith(prefix)}

    @property
    def syncs(self) -> dict[str, dict[str, int]]:
        """Cause (mark_step, item, print, cpu, fallback, ...) -> user call site -> count."""
        return self._of("syncs::")

    @property
    def fallbacks(self) -> dict[str, dict[str, int]]:
        """aten op that ran on the CPU -> user call site -> count."""
        return self._of("fallback::")

    def __str__(self) -> str:
        n_sync = sum(sum(w.values()) for w in self.syncs.values())
        n_fall = sum(sum(w.values()) for w in self.fallbacks.values())
        head = (
            f"{self.name}: {len(self.executions)} graph executions, {len(self.compiles)} "
            f"compiles, {n_sync} syncs, {n_fall} fallback ops in {self.seconds * 1e3:.1f} ms"
        )
        lines = [head]
        if self.events:
            lines.append("Graphs:")
            lines += ["  " + e.line().removeprefix("[lazy] ") for e in self.events]
        for title, kinds in (("Syncs", self.syncs), ("Fallbacks", self.fallbacks)):
            if kinds:
                lines.append(f"{title}:")
                for kind, where in sorted(kinds.items()):
                    at = ", ".join(f"{w} x{n}" for w, n in sorted(where.items()))
                    lines.append(f"  {kind}: {sum(where.values())} at {at}")
        if self.counters:
            changed = ", ".join(f"{k}={v}" for k, v in sorted(self.counters.items()))
            lines.append(f"Counters: {changed}")
        return "\n".join(lines)


def explain(fn: Callable[..., Any], *args: Any, mark_step: bool = True, **kwargs: Any):
    """Run ``fn(*args, **kwargs)`` once and report what it caused on the lazy device.

    With ``mark_step`` (the default) the pending graph is cut and run afterwards, as a training
    step would, and counted too. IR nodes record their user call site meanwhile, so a recompile
    names the line that changed the graph.

    >>> import torch, lazy_torch
    >>> x = torch.ones(3, device="lazy")
    >>> report = lazy_torch.debug.explain(lambda: (x * 2).sum().item())
    >>> report.result, list(report.syncs), len(report.executions)
    (6.0, ['item'], 1)
    """
    counters, where = runtime.metrics.counters(), runtime.metrics.sites()
    events: list[runtime.metrics.GraphEvent] = []
    stop = runtime.metrics.listen(events.append)
    recording = sites.record_sites(True)
    start = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
        if mark_step:
            _mark_step(wait=True)
    finally:
        seconds = time.perf_counter() - start
        stop()
        sites.record_sites(recording)
    after = runtime.metrics.counters()
    changed = {k: v - counters.get(k, 0) for k, v in after.items() if v != counters.get(k, 0)}
    new_sites = {}
    for kind, places in runtime.metrics.sites().items():
        old = where.get(kind, {})
        diff = {w: n - old.get(w, 0) for w, n in places.items() if n != old.get(w, 0)}
        if diff:
            new_sites[kind] = diff
    name = getattr(fn, "__name__", repr(fn))
    return Explanation(name, result, seconds, events, changed, new_sites)
