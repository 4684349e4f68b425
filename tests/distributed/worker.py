"""One process of a multi-process test (tests/distributed/test_processes.py): ``python -m
tests.distributed.worker SCENARIO`` under torchrun's environment variables; prints one JSON line."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import lazy_torch
from lazy_torch.distributed import (
    DeviceLoader,
    GraphMismatch,
    Mesh,
    fsdp,
    get_sharding,
    initialize,
)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _batches(steps: int = 5, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g))
            for _ in range(steps)]  # fmt: skip


def data_parallel(rank: int, world: int, shard: bool = False) -> dict:
    """Each process loads its half of every batch; the mesh spans every process's devices, and
    with ``shard`` the parameters are split over it (FSDP)."""
    n = lazy_torch.device_count()
    mesh = Mesh(range(n), (n,), ("data",))
    model = _mlp().to("lazy")
    if shard:
        fsdp(model, mesh, "data")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    half = 8 // world
    mine = [(x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half])
            for x, y in _batches()]  # fmt: skip
    losses = []
    for x, y in DeviceLoader(mine, mesh=mesh, partition_spec=("data", None)):
        assert tuple(x.shape) == (8, 8)  # all processes' parts
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazy_torch.mark_step()
        losses.append(loss.item())
    return {
        "losses": losses,
        "weight": model[0].weight.cpu().tolist(),  # gathered from every process's devices
        "sharding": list(get_sharding(model[0].weight)[1]),
    }


def sharded(rank: int, world: int) -> dict:
    return data_parallel(rank, world, shard=True)


def absent(rank: int, world: int) -> dict:
    """Process 1 never reaches the step: process 0 raises after the timeout, never hangs."""
    if rank == 1:
        time.sleep(float(os.environ["LAZY_DISTRIBUTED_TIMEOUT"]) + 20)
        return {"error": None}
    n = lazy_torch.device_count()
    mesh = Mesh(range(n), (n,), ("data",))
    (x,) = list(DeviceLoader([torch.ones(2, 2)], mesh=mesh, partition_spec=("data", None)))
    y = x * 3
    try:
        lazy_torch.mark_step()
    except GraphMismatch as e:
        return {"error": str(e)}
    return {"error": None, "value": y.cpu().tolist()}


def mismatch(rank: int, world: int) -> dict:
    """Process 1 builds another graph: both raise GraphMismatch, neither hangs."""
    n = lazy_torch.device_count()
    mesh = Mesh(range(n), (n,), ("data",))
    x = DeviceLoader([torch.ones(4, 2)], mesh=mesh, partition_spec=("data", None))
    (x,) = list(x)
    y = x * 2 if rank == 0 else x + 2
    try:
        lazy_torch.mark_step()
    except GraphMismatch as e:
        return {"error": str(e)}
    return {"error": None, "value": y.cpu().tolist()}


def collectives(rank: int, world: int) -> dict:
    """torch.distributed's collectives on lazy tensors, all in one step. Each process's values
    come from the host: every process must record the same graph (a number 0 or 1 that differs
    between them would be a constant of one process's graph only)."""
    x = (torch.arange(4.0) + rank).to("lazy")
    dist.all_reduce(x)
    gathered = torch.empty(4 * world, device="lazy")
    dist.all_gather_into_tensor(gathered, torch.full((4,), float(rank)).to("lazy"))
    scattered = torch.empty(2, device="lazy")
    dist.reduce_scatter_tensor(scattered, (torch.arange(2.0 * world) * (rank + 1)).to("lazy"))
    b = torch.full((3,), 10.0 * (rank + 1)).to("lazy")
    dist.broadcast(b, src=1)
    m = torch.tensor([float(rank), -float(rank)]).to("lazy")
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    dist.barrier()
    return {
        "all_reduce": x.cpu().tolist(), "all_gather": gathered.cpu().tolist(),
        "reduce_scatter": scattered.cpu().tolist(), "broadcast": b.cpu().tolist(),
        "max": m.cpu().tolist(),
    }  # fmt: skip


def ddp(rank: int, world: int) -> dict:
    """DistributedDataParallel on lazy: each process trains on its half of every batch."""
    model = torch.nn.parallel.DistributedDataParallel(_mlp().to("lazy"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    half = 8 // world
    losses, compiles = [], []
    for x, y in _batches():
        before = lazy_torch.metrics.counters().get("compiles", 0)
        x, y = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        loss = nn.functional.mse_loss(model(x.to("lazy")), y.to("lazy"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazy_torch.mark_step()
        losses.append(loss.item())
        compiles.append(lazy_torch.metrics.counters().get("compiles", 0) - before)
    return {"losses": losses, "weight": model.module[0].weight.cpu().tolist(), "compiles": compiles}


if __name__ == "__main__":
    if sys.argv[1] in ("collectives", "ddp"):
        dist.init_process_group("lazy")
    else:
        initialize()
    rank, world = lazy_torch.distributed.process_index(), lazy_torch.distributed.process_count()
    print(json.dumps({"rank": rank, **globals()[sys.argv[1]](rank, world)}), flush=True)
