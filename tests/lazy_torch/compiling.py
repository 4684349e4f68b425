"""Shared checks of the lazy_torch.compile tests: counters, call nodes, warnings, values."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
from tests.lazy_torch.models import SmallCNN


def counter(name: str) -> int:
    return lazy_torch.metrics.counters().get(name, 0)


def call_nodes(*tensors: torch.Tensor) -> int:
    """How many ``lazy.call`` nodes the pending graph of ``tensors`` has (0 when op by op)."""
    return lazy_torch.debug.ir_text(*tensors).count(" lazy.call(")


def here(path: str, marker: str) -> str:
    """``file:line`` of the line of file ``path`` that contains ``marker``."""
    with open(path) as f:
        lines = f.read().splitlines()
    return f"{path}:{next(i + 1 for i, s in enumerate(lines) if marker in s)}"


def compile_warnings(record: list) -> list[str]:
    return [str(w.message) for w in record if "lazy_torch.compile" in str(w.message)]


def assert_same(got, expected, rtol: float = 1e-5, atol: float = 1e-6, msg: str = "") -> None:
    """``got`` (lazy or CPU) equals ``expected`` to ``rtol``: the uncompiled lazy path runs the
    same lowerings, so only the fusion of one program can move a last bit."""
    got = got.detach().cpu() if isinstance(got, torch.Tensor) else got
    expected = expected.detach().cpu() if isinstance(expected, torch.Tensor) else expected
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=msg or None)


def record_step(run: dict, loss: torch.Tensor, compiles_before: int) -> None:
    """A training run's loss, captures so far and compiles of the step just ended."""
    run["losses"].append(loss.detach())
    run["captures"].append(counter("captures"))
    run["compiles"].append(counter("compiles") - compiles_before)


def finish_run(run: dict, model: nn.Module) -> dict:
    """The run with its losses on the CPU as one tensor and the model's state after it."""
    run["losses"] = torch.stack([l.cpu() for l in run["losses"]])
    run["state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return run


class Net(nn.Module):
    """Batch norm makes train() and eval() compute different things."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.lin2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(F.relu(self.bn(self.lin1(x))))


class DropoutCNN(SmallCNN):
    """SmallCNN (batch norm in training mode) with dropout before its classifier."""

    def __init__(self, p: float = 0.25) -> None:
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.drop(x.flatten(1)))
