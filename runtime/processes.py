"""Multi-process runs: joining JAX's distributed runtime, and checking that every process runs
the same graph.

Every process of a multi-process run traces the same program, and a graph over several
processes' devices runs only if each of them runs it at the same point: XLA's collectives would
otherwise wait for each other forever. Before each such execution the processes trade their
graphs' keys through the coordinator's key-value store; a process whose graph differs raises an
error that names the first differing node, and a process that never arrives makes the others
raise after ``config.DISTRIBUTED_TIMEOUT`` seconds instead of hanging.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import jax
from jax._src import distributed as _distributed  # the coordinator's key-value store

from lazy_core.dump import ir_text
from lazy_core.graph import Graph, key_text
from runtime import config
from runtime.device import configure, devices, global_devices


class GraphMismatch(RuntimeError):
    """Processes of a multi-process run were about to run different graphs together."""


def initialize(
    coordinator_address: str,
    num_processes: int,
    process_id: int,
    local_device_ids: list[int] | None = None,
) -> None:
    """Join a run of ``num_processes`` processes as process ``process_id``; process 0 serves
    the coordinator at ``coordinator_address`` (``host:port``). Must come before this process
    uses a device (on the CPU platform, processes exchange data through gloo)."""
    if devices.cache_info().currsize or global_devices.cache_info().currsize:
        raise RuntimeError(
            "lazy_torch.distributed.initialize() must come before the first use of a lazy "
            "device in this process"
        )
    configure()
    if config.PLATFORM in ("", "cpu"):  # the CPU platform's collectives between processes
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=int(config.DISTRIBUTED_TIMEOUT),
    )


def joined() -> bool:
    """Whether this process has joined a multi-process run (without starting JAX's devices)."""
    return _distributed.global_state.client is not None


def process_index() -> int:
    global_devices()  # JAX's settings first (LAZY_CPU_DEVICES): this starts its devices
    return jax.process_index()


def process_count() -> int:
    global_devices()
    return jax.process_count()


@functools.lru_cache(maxsize=64)
def spans_processes(device_ids: tuple[int, ...]) -> bool:
    """Whether devices (by JAX id) belong to more than one process."""
    if jax.process_count() == 1:
        return False
    by_id = {d.id: d.process_index for d in global_devices()}
    return len({by_id[i] for i in device_ids}) > 1


@functools.lru_cache(maxsize=64)
def group_mesh(index: int) -> tuple:
    """The mesh key (runtime/spmd.py) of the process group of device ``lazy:index``: each
    process's ``index``-th device, in process order, along axis "processes"."""
    everything = global_devices()
    ids = tuple(
        sorted((d for d in everything if d.process_index == p), key=lambda d: d.id)[index].id
        for p in range(jax.process_count())
    )
    return ids, (len(ids),), ("processes",)


_barriers = itertools.count()


def barrier() -> None:
    """Wait until every process is here (or raise after ``config.DISTRIBUTED_TIMEOUT``)."""
    if jax.process_count() > 1:
        client = _distributed.global_state.client
        timeout = int(config.DISTRIBUTED_TIMEOUT * 1e3)
        client.wait_at_barrier(f"lazy/barrier/{next(_barriers)}", timeout)


_executions = itertools.count()


def agree(graph: Graph, layout: Any) -> None:
    """Raise ``GraphMismatch`` unless every process is about to run ``graph`` (with ``layout``,
    its arguments' and outputs' placements) as its next execution over several processes."""
    client = _distributed.global_state.client
    n, me = next(_executions), jax.process_index()
    mine = f"{key_text(graph.key)} {layout!r}"
    client.key_value_set(f"lazy/graph/{n}/{me}", mine)
    if n >= 2:  # every process read it before it published the key of execution n - 1
        client.key_value_delete(f"lazy/graph/{n - 2}/{me}")
    timeout = int(config.DISTRIBUTED_TIMEOUT * 1000)
    for other in range(jax.process_count()):
        if other == me:
            continue
        try:
            theirs = client.blocking_key_value_get(f"lazy/graph/{n}/{other}", timeout)
        except Exception as e:
            raise GraphMismatch(
                f"process {other} did not reach execution {n} over several processes within "
                f"{config.DISTRIBUTED_TIMEOUT:g} s (LAZY_DISTRIBUTED_TIMEOUT): {e}"
            ) from None
        if theirs != mine:
            raise GraphMismatch(_difference(client, graph, n, me, other, timeout))


def _difference(client: Any, graph: Graph, n: int, me: int, other: int, timeout: int) -> str:
    """Where this process's graph and ``other``'s differ: the first differing line of their
    IR text (each process publishes its own once it sees a difference)."""
    text = ir_text(graph.roots)
    client.key_value_set(f"lazy/ir/{n}/{me}", text)
    head = f"process {me} and process {other} built different graphs for execution {n}"
    try:
        theirs = client.blocking_key_value_get(f"lazy/ir/{n}/{other}", timeout)
    except Exception:
        return f"{head} (process {other} did not show its graph)"
    for k, (a, b) in enumerate(itertools.zip_longest(text.splitlines(), theirs.splitlines())):
        if a != b:
            return (
                f"{head}: they first differ at line {k} of their IR:\n"
                f"  process {me}: {(a or '').strip()}\n  process {other}: {(b or '').strip()}"
            )
    return f"{head}: the same nodes laid out differently"
