"""torch.distributed's backend "lazy" in this process (a world of one; two processes run in
test_processes.py): collectives are recorded, not run, and what it refuses."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import lazy_torch
from runtime import executor


@pytest.fixture
def world():
    dist.init_process_group("lazy", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _syncs() -> int:
    return sum(v for k, v in lazy_torch.metrics.counters().items() if k.startswith("syncs::"))


def test_collectives_are_recorded_and_run_at_the_barrier(world):
    assert dist.get_backend() == "lazy"
    cpu = torch.arange(6.0).reshape(3, 2)
    x = cpu.to("lazy") * 2
    dist.all_reduce(x)
    mean = cpu.to("lazy")
    dist.all_reduce(mean, op=dist.ReduceOp.AVG)
    gathered = torch.empty(3, 2, device="lazy")
    dist.all_gather_into_tensor(gathered, cpu.to("lazy") + 1)
    parts = [torch.empty(3, 2, device="lazy")]
    dist.all_gather(parts, cpu.to("lazy") - 1)
    scattered = torch.empty(3, 2, device="lazy")
    dist.reduce_scatter_tensor(scattered, cpu.to("lazy") * 3)
    b = cpu.to("lazy")
    dist.broadcast(b, src=0)
    assert _syncs() == 0  # nothing ran yet
    lazy_torch.mark_step()
    assert torch.equal(x.cpu(), cpu * 2) and torch.equal(mean.cpu(), cpu)
    assert torch.equal(gathered.cpu(), cpu + 1) and torch.equal(parts[0].cpu(), cpu - 1)
    assert torch.equal(scattered.cpu(), cpu * 3) and torch.equal(b.cpu(), cpu)
    assert any("all-reduce" in t or "all-gather" in t for t in executor.executable_texts())


def test_what_the_backend_refuses(world):
    with pytest.raises(TypeError, match="takes lazy tensors, not one on cpu"):
        dist.all_reduce(torch.ones(2))
    x = torch.ones(2, device="lazy")
    with pytest.raises(NotImplementedError, match="reduces with"):
        dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
    assert x.tolist() == [1.0, 1.0]


def test_distributed_data_parallel_of_one_process_trains_as_the_module(world):
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to("lazy")
    )
    model.module.load_state_dict(reference.state_dict())
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(5, 4, generator=g)
        for m, opt, on in ((model, opts[0], "lazy"), (reference, opts[1], "cpu")):
            m(x.to(on)).square().mean().backward()
            opt.step()
            opt.zero_grad()
        lazy_torch.mark_step()
    for mine, theirs in zip(model.module.parameters(), reference.parameters()):
        torch.testing.assert_close(mine.cpu(), theirs.detach())
    # The parameters' updates were written into their old buffers, collectives and all.
    assert lazy_torch.metrics.counters().get("donated_buffers", 0) >= 4
