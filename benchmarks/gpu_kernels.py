"""Device time of lazy's GPT-2 training program against the JAX ceiling's, from JAX's profiler.

PYTHONPATH=. python benchmarks/gpu_kernels.py [--size gpt2-124m] [--steps 3] [--top 10]

Runs the suite's GPT-2 training step (bf16 autocast) on device='lazy' and the same model written
in JAX, traces a few steps of each with ``jax.profiler`` and sums the GPU kernels' durations: time
and kernels per step, split into matrix products (cuBLAS and XLA's gemm fusions) and the rest,
the costliest kernels, and the time per kind of kernel (the name without its number:
``loop_convert_fusion``, ``input_reduce_fusion``, ...) side by side. Kernel time does not depend
on how fast the host traces, so unlike step times it compares across runs of the device tool.
Needs a GPU.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile

import jax
import torch
from jax.profiler import ProfileData

import lazy_torch
import runtime
from benchmarks import suite

_GEMM = ("gemm", "nvjet", "cutlass", "xmma", "cublas")


def _kernels(step, steps: int) -> tuple[collections.Counter, int]:
    """Nanoseconds per kernel name over ``steps`` steps (each waits for the device), and how
    many kernels ran."""
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(steps):
                step()
        (path,) = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)
        data = ProfileData.from_file(path)
    times: collections.Counter = collections.Counter()
    count = 0
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if "stream" in line.name.lower():
                    for event in line.events:
                        times[event.name] += event.duration_ns
                        count += 1
    return times, count


def _report(name: str, kernels: collections.Counter, count: int, steps: int, top: int) -> None:
    gemm = sum(v for k, v in kernels.items() if any(w in k.lower() for w in _GEMM))
    total = sum(kernels.values())
    print(
        f"{name}: kernel time {total / steps / 1e6:.2f} ms per step (matrix products "
        f"{gemm / steps / 1e6:.2f}, the rest {(total - gemm) / steps / 1e6:.2f}), "
        f"{count / steps:.0f} kernels per step"
    )
    for kernel, ns in kernels.most_common(top):
        print(f"  {ns / steps / 1e6:7.3f} ms  {kernel[:100]}")


def _kinds(kernels: collections.Counter) -> collections.Counter:
    """Kernel time by the name without its trailing number (XLA's fusions), or the whole name."""
    kinds: collections.Counter = collections.Counter()
    for kernel, ns in kernels.items():
        kinds[re.sub(r"[_.]\d+$", "", kernel)] += ns
    return kinds


def _compare_kinds(runs: dict, steps: int, top: int) -> None:
    kinds = {name: _kinds(kernels) for name, kernels in runs.items()}
    lazy, jax_ = kinds["lazy"], kinds["jax"]
    names = sorted(set(lazy) | set(jax_), key=lambda k: -abs(lazy[k] - jax_[k]))
    print("by kind, ms per step (largest differences first):     lazy      jax")
    for kind in names[:top]:
        print(f"  {kind[:48]:48} {lazy[kind] / steps / 1e6:8.3f} {jax_[kind] / steps / 1e6:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "gpt2-124m"], default="gpt2-124m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=10, help="costliest kernels to list")
    args = parser.parse_args()
    if runtime.device(0).platform != "gpu":
        parser.error(f"needs a GPU; JAX's device is {runtime.device(0)}")
    workload = suite.WORKLOADS["gpt2"](args.size)

    model = workload.model.to("lazy")
    model.train()
    opt = workload.optimizer(model.parameters())
    batch = lazy_torch.to_device(workload.batch)

    def lazy_step() -> None:
        opt.zero_grad(set_to_none=True)
        with lazy_torch.amp.autocast(dtype=torch.bfloat16):
            loss = workload.loss(model, batch)
        loss.backward()
        opt.step()
        lazy_torch.mark_step(wait=True)

    ceiling = workload.jax(True, runtime.device(0))
    state = [ceiling.init()]

    def jax_step() -> None:
        state[0], loss = ceiling.train_step(state[0], ceiling.batch)
        jax.block_until_ready(loss)

    runs = {}
    for name, step in (("lazy", lazy_step), ("jax", jax_step)):
        for _ in range(4):  # compile and settle
            step()
        kernels, count = _kernels(step, args.steps)
        _report(name, kernels, count, args.steps, args.top)
        runs[name] = kernels
    _compare_kinds(runs, args.steps, args.top)


if __name__ == "__main__":
    main()
