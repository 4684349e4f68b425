"""Train a model for a few steps on eager CPU and on device='lazy' from the same weights and data.

Every model test builds a ``transformers`` model from a tiny config (random weights, dropout
off), then compares losses, final parameters and buffers, and counts compiles per step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

import lazy_torch
import runtime.executor

RTOL = 1e-3


@dataclasses.dataclass
class Run:
    losses: list[float]
    state: dict[str, torch.Tensor]  # final parameters and buffers, on the CPU
    compiles: list[int]  # compiles during each step (lazy only)
    fallbacks: dict[str, int]  # fallback::<op> counters seen (lazy only)


def to_device(batch: Any, device: str) -> Any:
    """``batch`` on ``device``: the data is made on the CPU, so only lazy needs a transfer."""
    return batch if device == "cpu" else lazy_torch.to_device(batch, device)


def train(
    model: torch.nn.Module,
    batches: Sequence[Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: str,
    lr: float = 1e-3,
) -> Run:
    """AdamW steps of ``loss_fn(model, batch)`` on ``device``; one mark_step per step on lazy."""
    torch.manual_seed(0)
    model = copy.deepcopy(model).to(device)
    model.train()
    # eps well above float32 roundoff: Adam divides each gradient by its own running size, so
    # with the default 1e-8 a gradient that cancels to ~1e-9 moves its weight by a whole step
    # whose size and sign are roundoff, which differs between any two summation orders (eager's
    # own CPU kernels on two machines included).
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, eps=1e-6)
    lazy = device != "cpu"
    lazy_torch.metrics.reset()
    losses, compiles = [], []
    for batch in batches:
        before = lazy_torch.metrics.counters().get("compiles", 0)
        opt.zero_grad()
        loss = loss_fn(model, to_device(batch, device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if lazy:
            lazy_torch.mark_step()
        losses.append(loss.detach())
        compiles.append(lazy_torch.metrics.counters().get("compiles", 0) - before)
    counters = lazy_torch.metrics.counters()
    fallbacks = {k: v for k, v in counters.items() if k.startswith("fallback::")}
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return Run([float(l.item()) for l in losses], state, compiles, fallbacks)


def check_training(model, batches, loss_fn, rtol: float = RTOL, atol: float = 1e-5) -> Run:
    """Lazy training matches eager (losses, parameters, buffers); after the warm-up steps
    (the first, and the second, where the optimizer state appears) nothing compiles."""
    eager = train(model, batches, loss_fn, "cpu")
    # From a cold executable cache: another test of this worker may have compiled these graphs
    # (tests/models/test_compile_models.py captures the same models), and the callers count
    # the compiles of the first steps.
    runtime.executor.drop_cache()
    lazy = train(model, batches, loss_fn, "lazy")
    torch.testing.assert_close(lazy.losses, eager.losses, rtol=rtol, atol=atol)
    assert lazy.state.keys() == eager.state.keys()
    for name, value in eager.state.items():
        torch.testing.assert_close(lazy.state[name], value, rtol=rtol, atol=atol, msg=name)
    assert lazy.compiles[2:] == [0] * (len(batches) - 2), lazy.compiles
    return lazy


def tokens(steps: int, batch: int, seq: int, vocab: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(steps)]
