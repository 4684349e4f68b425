"""Joining a multi-process run (runtime/processes.py does the work), and the key-value store
through which the processes check that they run the same graphs: torch.distributed's."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch.distributed as dist

import runtime


class TorchStore:
    """A ``torch.distributed.Store`` as runtime/processes.py's ``Store``."""

    def __init__(self, store: Any):
        self._store = store

    def set(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def get(self, key: str, timeout: float) -> str:
        self._store.wait([key], datetime.timedelta(seconds=timeout))
        return self._store.get(key).decode()

    def delete(self, key: str) -> None:
        self._store.delete_key(key)


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | None = None,
    *,
    store: Any = None,
) -> None:
    """Join a multi-process run (one process per host, or per GPU), before any lazy device is
    used. Unset arguments come from torchrun's environment: ``WORLD_SIZE``, ``RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` (torch.distributed's own store takes ``MASTER_PORT``;
    JAX's coordinator listens on ``MASTER_PORT + 1``, and the store through which the processes
    check their graphs on the port after the coordinator's), and with ``LAZY_PLATFORM=gpu`` (or
    another accelerator) ``LOCAL_RANK`` picks the process's one device. Afterwards
    ``lazy_torch.device_count()`` counts every process's devices, a ``Mesh`` may span them,
    and ``lazy:N`` is this process's N-th device. Every process must then run the same program:
    a graph over several processes that differs between them raises ``GraphMismatch`` naming
    the first differing node. The processes check their graphs through ``store`` (a
    ``torch.distributed.Store`` they all reach, such as a process group's), else through one
    that process 0 serves on the port after the coordinator's.
    """
    env = os.environ
    if num_processes is None:
        num_processes = int(env.get("WORLD_SIZE", "1"))
    if process_id is None:
        process_id = int(env.get("RANK", "0"))
    if coordinator_address is None:
        port = int(env.get("MASTER_PORT", "29500")) + 1
        coordinator_address = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{port}"
    accelerator = runtime.config.PLATFORM not in ("", "cpu")  # LAZY_PLATFORM names it
    if local_device_ids is None and "LOCAL_RANK" in env and accelerator:
        local_device_ids = [int(env["LOCAL_RANK"])]
    runtime.processes.initialize(coordinator_address, num_processes, process_id, local_device_ids)
    if store is None:
        host, coordinator_port = coordinator_address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=runtime.config.DISTRIBUTED_TIMEOUT)
        store = dist.TCPStore(
            host, int(coordinator_port) + 1, num_processes, process_id == 0, timeout,
            wait_for_workers=False,
        )  # fmt: skip
    runtime.processes.use_store(TorchStore(store))
