"""Small models and a training loop shared by the training tests and examples-style checks."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 5)
    )


def tiny_gpt2() -> nn.Module:
    """A transformers GPT-2 of random weights (seeded) whose greedy tokens vary, for generation
    tests: 2 layers, width 32, vocabulary 64, 128 positions, token 0 for BOS, EOS and padding."""
    import transformers

    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=128, initializer_range=0.3,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # No conv bias before batch norm: its gradient is pure rounding noise, which Adam would
        # amplify into lr-sized steps that differ between any two correct implementations.
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def data(kind: str, steps: int, batch: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 20) if kind == "mlp" else (batch, 3, 16, 16)
    return [
        (torch.randn(*shape, generator=g), torch.randint(0, 5, (batch,), generator=g))
        for _ in range(steps)
    ]


def make_optimizer(name: str, params):
    if name == "sgd":
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)


def train(model: nn.Module, batches, optimizer: str, device: str, on_step=None):
    """Train ``model`` on ``device``; returns (losses, final CPU parameters, buffers)."""
    model = copy.deepcopy(model).to(device)
    opt, sched = make_optimizer(optimizer, model.parameters())
    losses = []
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        if device != "cpu":
            lazy_torch.mark_step()
        losses.append(loss)
        if on_step is not None:
            on_step()
    losses = [float(l.item()) for l in losses]
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return losses, state
