"""Joining a multi-process run (runtime/processes.py does the work)."""

from __future__ import annotations

import os

import runtime


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: list[int] | None = None,
) -> None:
    """Join a multi-process run (one process per host, or per GPU), before any lazy device is
    used. Unset arguments come from torchrun's environment: ``WORLD_SIZE``, ``RANK``,
    ``MASTER_ADDR`` and ``MASTER_PORT`` (JAX's coordinator listens on ``MASTER_PORT + 1``, as
    torch.distributed's own store takes ``MASTER_PORT``), and with ``LAZY_PLATFORM=gpu`` (or
    another accelerator) ``LOCAL_RANK`` picks the process's one device. Afterwards
    ``lazy_torch.device_count()`` counts every process's devices, a ``Mesh`` may span them,
    and ``lazy:N`` is this process's N-th device. Every process must then run the same program:
    a graph over several processes that differs between them raises ``GraphMismatch`` naming
    the first differing node.
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
