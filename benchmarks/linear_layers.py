"""Host time of a linear layer's forward and backward on device='lazy', by how it is recorded.

PYTHONPATH=. python benchmarks/linear_layers.py [--layers 48] [--rounds 5] [--steps 20]

Chains ``--layers`` linear layers of width 48 (batch 64, tiny: the host's time is all there is),
in float32 (``F.linear``) and under bf16 autocast (``torch.addmm``, as GPT-2's Conv1D), and
times the forward and the backward per layer two ways, alternating in one process so that drift
in the host's speed reaches each alike: one node with the C++ grad_fn (lazy_torch/csrc/linear.cpp,
the default) and the ordinary kernels (``LAZY_FUSE_LINEAR=0``: ``t``, ``addmm`` and
their autograd; under autocast also the casts). Prints the medians over the rounds, in µs per
layer, and each way's ratio to the ordinary kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

import lazy_torch
import runtime

_WAYS = ("C++ node", "ordinary")


def _use(way: str) -> None:
    runtime.config.FUSE_LINEAR = way != "ordinary"


def _step(amp: bool, weights: list, biases: list, x: torch.Tensor) -> tuple[float, float]:
    """Seconds of one forward and one backward through every layer."""
    start = time.perf_counter()
    with lazy_torch.amp.autocast(dtype=torch.bfloat16) if amp else contextlib.nullcontext():
        for w, b in zip(weights, biases):
            x = torch.addmm(b, x, w) if amp else F.linear(x, w, b)
        loss = x.float().sum()
    middle = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    for t in (*weights, *biases):
        t.grad = None
    return middle - start, end - middle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    fuse = runtime.config.FUSE_LINEAR
    ways = _WAYS
    width, n = 48, args.layers
    for amp in (False, True):
        # F.linear's weight is (out, in); addmm's (in, out): square, so one shape serves both.
        weights = [torch.randn(width, width, device="lazy", requires_grad=True) for _ in range(n)]
        biases = [torch.zeros(width, device="lazy", requires_grad=True) for _ in range(n)]
        x = torch.randn(64, width, device="lazy")
        times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        try:
            for way in ways:  # warm-up: each way's graph compiled once
                _use(way)
                _step(amp, weights, biases, x)
                lazy_torch.mark_step(wait=True)
            for _ in range(args.rounds):
                for way in ways:
                    _use(way)
                    steps = []
                    for _ in range(args.steps):
                        steps.append(_step(amp, weights, biases, x))
                        lazy_torch.mark_step(wait=True)
                    times[way].append(tuple(statistics.median(s) for s in zip(*steps)))
        finally:
            runtime.config.FUSE_LINEAR = fuse
        median = {w: [statistics.median(t[i] for t in times[w]) * 1e6 / n for i in (0, 1)]
                  for w in ways}  # fmt: skip
        base = sum(median["ordinary"])
        print(f"{'bf16 autocast, addmm' if amp else 'float32, F.linear'}: µs per layer")
        for way in ways:
            fwd, bwd = median[way]
            ratio = (fwd + bwd) / base
            print(f"  {way:9} forward {fwd:6.1f}  backward {bwd:6.1f}  x ordinary {ratio:.2f}")


if __name__ == "__main__":
    main()
