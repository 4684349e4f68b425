"""Barriers: cut the pending graph of some storages, run it, and make the results device data."""

from __future__ import annotations

import time
from collections.abc import Iterable

import runtime
from lazy_core import Storage, cut_graph, data_leaf, pending_storages
from lazy_torch import rng as _rng


def sync(storages: Iterable[Storage], cause: str) -> None:
    """Compute the pending values of ``storages``; afterwards each holds a device buffer.

    If compiling or running fails, every storage keeps its pending value (nothing is lost).
    """
    by_device: dict[int, list[Storage]] = {}
    for s in storages:
        if s.pending:
            by_device.setdefault(s.device, []).append(s)
    for device, group in by_device.items():
        roots = [s.node for s in group]
        graph = cut_graph(roots, salt=("device", device))
        outputs = runtime.run_graph(graph, device, cause=cause)
        buffers = {id(r): b for r, b in zip(graph.roots, outputs)}
        for s, root in zip(group, roots):
            s.node = data_leaf(buffers[id(root)], root.dtype, root.shape)


def mark_step(wait: bool = False) -> None:
    """Cut the pending graph of every live lazy tensor and dispatch it; returns without waiting.

    >>> import torch, lazy_torch
    >>> x = torch.ones(2, device="lazy") * 3
    >>> lazy_torch.mark_step()
    >>> x.tolist()
    [3.0, 3.0]
    """
    start = time.perf_counter()
    runtime.metrics.count("mark_steps")
    _rng.advance()
    sync(pending_storages(), cause="mark_step")
    runtime.metrics.time("mark_step_time", time.perf_counter() - start)
    if wait:
        runtime.wait_device_ops()
