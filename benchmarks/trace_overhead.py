"""Tracing cost: microseconds per recorded aten op, for an elementwise chain and an MLP step.

PYTHONPATH=. python benchmarks/trace_overhead.py [--repeats 7] [--device cuda]

Prints medians over several repetitions (the machines are shared and noisy); nothing is executed
inside the timed region (mark_step runs outside it). The chain is also run, in the same process,
on eager tensors of ``--device`` (4 elements: PyTorch's dispatch, and on an accelerator the kernel
launch, with next to no compute) and on what bounds a Python tensor subclass from below: a
subclass whose ``__torch_dispatch__`` returns one existing tensor (the round trip through
PyTorch's Python key) and one that returns a new wrapper tensor (the least any Python subclass
pays per op, since each result is a new tensor).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import lazy_torch
from lazy_core import cut_graph, pending_storages


class CountOps(TorchDispatchMode):
    """Counts the aten ops a program dispatches, and the views among them (used outside the
    timed region only)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        self.views += getattr(func, "is_view", False)
        return func(*args, **(kwargs or {}))


def _dispatched_ops(step) -> int:
    with CountOps() as counter:
        step()
    lazy_torch.mark_step(wait=True)
    return counter.count


def _recorded_ops() -> int:
    """Non-leaf nodes of the pending graph: the ops traced since the last barrier."""
    graph = cut_graph([s.node for s in pending_storages()])
    return sum(1 for n in graph.nodes if n.src)


class SubclassFloor(torch.Tensor):
    """The least any Python tensor subclass pays per op: dispatch into Python plus one wrapper."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return torch.Tensor._make_wrapper_subclass(cls, (128, 128), dtype=torch.float32)


class _RoundTrip(torch.Tensor):
    """Dispatch into Python and back, without making a tensor: returns the one it holds."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    result: torch.Tensor

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return cls.result


def op_chain(x: torch.Tensor, length: int) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    y = x
    for _ in range(length // 4):
        y = y * 1.001
        y = y + x
        y = y.relu()
        y = y - 0.5
    return time.perf_counter() - start, y


def _timed_chain(x: torch.Tensor, length: int) -> float:
    """Host seconds of the chain; on an accelerator, its queued kernels finish outside the time."""
    elapsed = op_chain(x, length)[0]
    if x.is_cuda:
        torch.cuda.synchronize()
    return elapsed


def elementwise_chain(length: int) -> tuple[float, int]:
    x = torch.randn(128, 128, device="lazy")
    lazy_torch.mark_step(wait=True)
    elapsed, _y = op_chain(x, length)
    ops = _recorded_ops()  # _y keeps the chain pending
    lazy_torch.mark_step(wait=True)
    return elapsed, ops


def mlp_step(model: nn.Module, opt: torch.optim.Optimizer, x, y) -> tuple[float, int]:
    lazy_torch.mark_step(wait=True)
    start = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    elapsed = time.perf_counter() - start
    ops = _recorded_ops()
    lazy_torch.mark_step(wait=True)
    return elapsed, ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chain", type=int, default=2000)
    parser.add_argument("--device", default="cpu", help="eager's device for the reference rows")
    args = parser.parse_args()

    elementwise_chain(args.chain)  # warm the shape-inference memo and the executable cache
    runs = [elementwise_chain(args.chain) for _ in range(args.repeats)]
    per_op = statistics.median(t / n for t, n in runs) * 1e6
    round_trip = torch.Tensor._make_wrapper_subclass(_RoundTrip, (128, 128), dtype=torch.float32)
    _RoundTrip.result = round_trip
    eager = args.device.upper()
    chains = {
        f"eager {eager}, 4-element tensors (dispatch)": torch.randn(4, device=args.device),
        "subclass returning an existing tensor": round_trip,
        "subclass returning a new wrapper (the floor)": torch.Tensor._make_wrapper_subclass(
            SubclassFloor, (128, 128), dtype=torch.float32
        ),
        f"eager {eager}, 128x128": torch.randn(128, 128, device=args.device),
    }
    print(
        f"elementwise chain: {runs[0][1]} ops, lazy {per_op:.2f} us/op (median of {args.repeats})"
    )
    print("  the same chain in this run, us/op:")
    for name, x in chains.items():
        t = statistics.median(_timed_chain(x, args.chain) for _ in range(args.repeats))
        t = t / args.chain * 1e6
        print(f"    {name:45s} {t:5.2f} (lazy = {per_op / t:.2f}x)")
    previous = lazy_torch.debug.record_sites(True)  # what LAZY_DEBUG / LAZY_DUMP_DIR switch on
    sited = [elementwise_chain(args.chain) for _ in range(args.repeats)]
    lazy_torch.debug.record_sites(previous)
    sited_per_op = statistics.median(t / n for t, n in sited) * 1e6
    print(
        f"  with user call sites recorded per node: {sited_per_op:.2f} us/op "
        f"(+{sited_per_op - per_op:.2f} us; off unless debugging)"
    )

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    ).to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256).to("lazy"), torch.randint(0, 10, (64,)).to("lazy")
    for _ in range(3):
        mlp_step(model, opt, x, y)
    dispatched = _dispatched_ops(lambda: mlp_step(model, opt, x, y))
    runs = [mlp_step(model, opt, x, y) for _ in range(args.repeats)]
    step = statistics.median(t for t, _ in runs)
    print(
        f"MLP 256-512-512-10 AdamW step: {dispatched} aten ops dispatched, {runs[0][1]} IR nodes, "
        f"trace {step * 1e3:.2f} ms, {step / dispatched * 1e6:.2f} us/op "
        f"(median of {args.repeats})"
    )


if __name__ == "__main__":
    main()
