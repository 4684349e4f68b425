"""Multi-process runs: joining JAX's distributed runtime, and checking that every process runs
the same graph.

Every process of a multi-process run traces the same program, and a graph over several
processes' devices runs only if each of them runs it at the same point: XLA's collectives would
otherwise wait for each other forever. Before each such execution the processes trade their
graphs' keys through a key-value store with timeouts that the front end gives (``use_store``:
lazy_torch uses torch.distributed's); a process whose graph differs raises an error that names
the first differing node, and a process that never arrives makes the others raise after
``config.DISTRIBUTED_TIMEOUT`` seconds instead of hanging.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any, Protocol

import jax

from lazy_core.dump import ir_text
from lazy_core.graph import Graph, key_text
from runtime import config
from runtime.device import configure, devices, global_devices


class GraphMismatch(RuntimeError):
    """Processes of a multi-process run were about to run different graphs together."""


class Store(Protocol):
    """A key-value store every process of the run reaches."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str, timeout: float) -> str:
        """``key``'s value once some process has set it; raises after ``timeout`` seconds."""
        ...

    def delete(self, key: str) -> None: ...


_store: list[Store | None] = [None]


def use_store(store: Store) -> None:
    """Trade graph keys and barriers through ``store`` from now on."""
    _store[0] = store


def _the_store() -> Store:
    store = _store[0]
    if store is None:
        raise RuntimeError(
            "a graph over several processes' devices needs lazy_torch.distributed.initialize() "
            "or torch.distributed.init_process_group('lazy'), which give the processes a store "
            "to check their graphs through"
        )
    return store


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
    return jax.distributed.is_initialized()


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
        _exchange(f"lazy/barrier/{next(_barriers)}", "here")


_executions = itertools.count()


def agree(graph: Graph, layout: Any) -> None:
    """Raise ``GraphMismatch`` unless every process is about to run ``graph`` (with ``layout``,
    its arguments' and outputs' placements) as its next execution over several processes."""
    n = next(_executions)
    mine = f"{key_text(graph.key)} {layout!r}"
    if n >= 2:  # every process read it before it published its key of execution n - 1
        _the_store().delete(f"lazy/graph/{n - 2}/{jax.process_index()}")
    for other, theirs in _exchange(f"lazy/graph/{n}", mine, f"execution {n}").items():
        if theirs != mine:
            raise GraphMismatch(_difference(graph, n, other))


def _exchange(name: str, mine: str, what: str = "the barrier") -> dict[int, str]:
    """Publish ``mine`` as this process's ``name`` and read every other process's."""
    store, me = _the_store(), jax.process_index()
    store.set(f"{name}/{me}", mine)
    theirs = {}
    for other in range(jax.process_count()):
        if other == me:
            continue
        try:
            theirs[other] = store.get(f"{name}/{other}", config.DISTRIBUTED_TIMEOUT)
        except Exception as e:
            raise GraphMismatch(
                f"process {other} did not reach {what} over several processes within "
                f"{config.DISTRIBUTED_TIMEOUT:g} s (LAZY_DISTRIBUTED_TIMEOUT): {e}"
            ) from None
    return theirs


def _difference(graph: Graph, n: int, other: int) -> str:
    """Where this process's graph and ``other``'s differ: the first differing line of their
    IR text (each process publishes its own once it sees a difference)."""
    me, text = jax.process_index(), ir_text(graph.roots)
    head = f"process {me} and process {other} built different graphs for execution {n}"
    try:
        theirs = _exchange(f"lazy/ir/{n}", text, f"execution {n}")[other]
    except GraphMismatch:
        return f"{head} (process {other} did not show its graph)"
    for k, (a, b) in enumerate(itertools.zip_longest(text.splitlines(), theirs.splitlines())):
        if a != b:
            return (
                f"{head}: they first differ at line {k} of their IR:\n"
                f"  process {me}: {(a or '').strip()}\n  process {other}: {(b or '').strip()}"
            )
    return f"{head}: the same nodes laid out differently"
