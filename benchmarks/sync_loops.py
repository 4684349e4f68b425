"""Loops that observe values every iteration, side by side with eager CPU.

PYTHONPATH=. python benchmarks/sync_loops.py [--steps 8] [--length 21] [--episodes 40] [--warmup 3]

- ``time_sequence_prediction``: PyTorch's example (two LSTMCells and a Linear, float64, LBFGS
  with ``lr=0.8, max_iter=3``, the loss printed with ``.item()`` inside the closure) on its sine
  data with ``--length`` points per sequence (the example's 1,000 would take minutes of eager
  time a step); per optimizer step.
- ``reinforce``: PyTorch's REINFORCE example (Linear-Dropout-ReLU-Linear policy, Categorical
  sampling, ``action.item()`` each step, Adam at the end of an episode) on a NumPy CartPole with
  episodes capped at 40 steps; per environment step.
- ``recurrence``: ``h = 0.9 * h + x; h.sum().item()``; per iteration.
- ``multinomial``: ``torch.multinomial(p, 1).item()``; per iteration.

For each: the median time of a step after the warm-up (the first ``--warmup`` steps; for
reinforce, half the episodes) for eager and lazy, their ratio, and lazy's compiles during the warm-up and after it (the issue's targets:
within 3x of eager, no compiles after the warm-up).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch


class Sequence(nn.Module):
    """time_sequence_prediction's model, as the example writes it."""

    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)
        self.dummy_param = nn.Parameter(torch.empty(0))

    def forward(self, input, future=0):
        outputs = []
        device = self.dummy_param.device
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double).to(device)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def time_sequence_prediction(device: str, length: int) -> Callable[[], int]:
    np.random.seed(2)
    period, n = 20, 100
    x = np.empty((n, length), "int64")
    x[:] = np.array(range(length)) + np.random.randint(-4 * period, 4 * period, n).reshape(n, 1)
    data = torch.from_numpy(np.sin(x / 1.0 / period).astype("float64")).to(device)
    input, target = data[3:, :-1], data[3:, 1:]
    torch.manual_seed(0)
    seq = Sequence().to(device).double()
    criterion = nn.MSELoss().to(device)
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=3)
    losses = []

    def step() -> int:
        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(input), target)
            losses.append(loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        if device == "lazy":
            lazy_torch.mark_step()
        return 1

    return step


class CartPole:
    """CartPole-v1's dynamics (Euler steps), in NumPy, with episodes capped at ``cap`` steps."""

    def __init__(self, seed: int, cap: int):
        self.rng, self.cap = np.random.default_rng(seed), cap

    def reset(self) -> np.ndarray:
        self.state, self.t = self.rng.uniform(-0.05, 0.05, 4), 0
        return self.state.astype(np.float32)

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.state, self.t = np.array([x, x_dot, theta, theta_dot]), self.t + 1
        done = abs(x) > 2.4 or abs(theta) > 0.2095 or self.t >= self.cap
        return self.state.astype(np.float32), 1.0, done


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.dropout(self.affine1(x)))), dim=1)


def reinforce(device: str, cap: int = 40) -> Callable[[], int]:
    torch.manual_seed(543)
    env, policy = CartPole(543, cap), Policy().to(device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    eps = np.finfo(np.float32).eps.item()

    def episode() -> int:
        state, log_probs, rewards = env.reset(), [], []
        for _ in range(cap):
            probs = policy(torch.from_numpy(state).float().unsqueeze(0).to(device))
            m = torch.distributions.Categorical(probs)
            action = m.sample()
            log_probs.append(m.log_prob(action))
            state, reward, done = env.step(action.item())
            rewards.append(reward)
            if done:
                break
        returns, r = [], 0.0
        for reward in reversed(rewards):
            r = reward + 0.99 * r
            returns.insert(0, r)
        returns = torch.tensor(returns).to(device)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        loss = torch.cat([-lp * g for lp, g in zip(log_probs, returns)]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device == "lazy":
            lazy_torch.mark_step()
        return len(rewards)

    return episode


def recurrence(device: str) -> Callable[[], int]:
    h, x = torch.zeros(8, device=device), torch.ones(8, device=device)

    def step() -> int:
        nonlocal h
        h = 0.9 * h + x
        h.sum().item()
        return 1

    return step


def multinomial(device: str) -> Callable[[], int]:
    p = torch.tensor([0.1, 0.2, 0.7], device=device)
    return lambda: torch.multinomial(p, 1).item() * 0 + 1


def _per_unit(step: Callable[[], int], steps: int, warmup: int) -> tuple[float, int, int]:
    """Median seconds per unit (a step's return value) after ``warmup`` steps, and the compiles
    during and after the warm-up."""
    counters = lazy_torch.metrics.counters
    start = counters().get("compiles", 0)
    times = []
    for i in range(steps):
        if i == warmup:
            warm = counters().get("compiles", 0)
        t0 = time.perf_counter()
        units = step()
        times.append((time.perf_counter() - t0) / units)
    end = counters().get("compiles", 0)
    return statistics.median(times[warmup:]), warm - start, end - warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--length", type=int, default=21)
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    programs = {  # name: (make, steps, warm-up steps, unit)
        "time_sequence_prediction": (
            lambda d: time_sequence_prediction(d, args.length), args.steps, args.warmup, "step"
        ),
        "reinforce": (reinforce, args.episodes, args.episodes // 2, "env step"),
        "recurrence": (recurrence, 50, args.warmup, "iteration"),
        "multinomial": (multinomial, 50, args.warmup, "iteration"),
    }  # fmt: skip
    print(f"{'program':26} {'eager':>10} {'lazy':>10} {'ratio':>7}  compiles (warm-up, after)")
    for name, (make, steps, warmup, unit) in programs.items():
        eager, _, _ = _per_unit(make("cpu"), steps, warmup)
        lazy, warm, after = _per_unit(make("lazy"), steps, warmup)
        print(
            f"{name:26} {eager * 1e3:8.2f}ms {lazy * 1e3:8.2f}ms {lazy / eager:6.2f}x"
            f"  {warm}, {after}  (per {unit}, median of {steps - warmup} after {warmup})"
        )


if __name__ == "__main__":
    main()
