"""Two processes on 127.0.0.1 (each with 2 CPU devices; an ephemeral port; bounded by a timeout):
initialize() from torchrun's environment, a data-parallel step over both processes' devices equal
to one process, torch.distributed's backend "lazy" (its collectives, and DistributedDataParallel
equal to one process), and a process that builds another graph gets an error, not a hang."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch import nn

from tests.distributed import worker

pytestmark = pytest.mark.slow  # each test starts two processes (10 to 40 s)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    """Three free ports in a row: torch.distributed's store takes MASTER_PORT, JAX's coordinator
    the next, and the store the processes check their graphs through the one after."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            for k in (1, 2):
                with socket.socket() as t:
                    t.bind(("127.0.0.1", port + k))
            return port
        except OSError:
            continue
    raise RuntimeError("no three free ports in a row")


def _launch(
    scenario: str, world: int = 2, timeout: float = 120, wait: str = "60"
) -> list[dict]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS",)}
    env.update(
        LAZY_CPU_DEVICES="2", LAZY_PLATFORM="cpu", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port), WORLD_SIZE=str(world), LAZY_DISTRIBUTED_TIMEOUT=wait,
        PYTHONPATH=ROOT,
    )  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.distributed.worker", scenario],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        for r in range(world)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            p.kill()
    return sorted(results, key=lambda r: r["rank"])


def _one_process() -> tuple[list[float], torch.nn.Module]:
    model = worker._mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in worker._batches():
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize(
    "scenario, layout", [("data_parallel", [None, None]), ("sharded", ["data", None])]
)
def test_training_over_two_processes_devices_equals_one_process(scenario, layout):
    losses, model = _one_process()
    for r in _launch(scenario):
        torch.testing.assert_close(r["losses"], losses, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(r["weight"]), model[0].weight.detach())
        assert r["sharding"] == layout


def test_a_process_that_builds_another_graph_gets_an_error_not_a_hang():
    results = _launch("mismatch")
    for r in results:
        assert r["error"] is not None, r
        assert "built different graphs" in r["error"], r["error"]
        assert "aten.mul" in r["error"] and "aten.add" in r["error"], r["error"]


def test_a_process_that_never_arrives_makes_the_others_raise_after_the_timeout():
    first, _ = _launch("absent", wait="5", timeout=90)
    assert "did not reach execution 0" in first["error"], first["error"]


def test_torch_distributed_collectives_on_lazy_tensors():
    results = _launch("collectives")
    for r in results:
        assert r["all_reduce"] == [1.0, 3.0, 5.0, 7.0]  # (0..3) + (1..4)
        assert r["all_gather"] == [0.0] * 4 + [1.0] * 4
        # rank 0 sums (0, 1, 2, 3) * 1 and * 2 -> 0, 3, 6, 9: it keeps 0, 3; rank 1 6, 9
        assert r["reduce_scatter"] == ([0.0, 3.0] if r["rank"] == 0 else [6.0, 9.0])
        assert r["broadcast"] == [20.0] * 3
        assert r["max"] == [1.0, 0.0]


def test_distributed_data_parallel_over_two_processes_equals_one_process():
    results = _launch("ddp")
    losses, model = _one_process()
    # Each process's loss is its half's; their mean is the whole batch's.
    mean = [(a + b) / 2 for a, b in zip(results[0]["losses"], results[1]["losses"])]
    torch.testing.assert_close(mean, losses, rtol=1e-5, atol=1e-6)
    for r in results:
        torch.testing.assert_close(torch.tensor(r["weight"]), model[0].weight.detach())
        assert r["compiles"][3:] == [0, 0], r["compiles"]
