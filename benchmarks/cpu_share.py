"""CPU time per training step, by thread, for lazy and the JAX ceiling on XLA's CPU platform.

PYTHONPATH=. python benchmarks/cpu_share.py [--seconds 5] [--rounds 3] [mlp gpt2]

On the CPU platform the "device" is the host's own cores: XLA runs a step's program on its thread
pool while the Python thread traces the next step. Each backend runs its training steps back to
back for about ``--seconds`` (lazy: ``mark_step()`` without waiting; JAX: the jitted step, waited
for at the end), and
the CPU time every thread of the process spent in them (from ``/proc/self/task``) is split into
the Python thread's and the rest's (XLA's pool, the runtime's threads). No schedule can run the
steps faster than their CPU time spread over every core, so lazy's step time is at least (Python
+ the rest) / cores, and that bound against JAX's measured step time says how close to the
ceiling lazy can come on this machine. Rounds alternate the backends; medians are printed.

The third row, ``jax+torch``, is what a lazy backend that cost nothing would take: JAX's step
followed by PyTorch's own host work for the same training step (the workload at ``--size tiny``,
its layers a few elements wide, on eager CPU: modules, autograd and the optimizer, with next to
no compute). A backend that takes PyTorch programs pays at least that work on the Python thread
while XLA runs on the cores, so its ratio to JAX is the nearest any such backend comes to the
ceiling here, and lazy's ratio to it is what lazy itself adds.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import threading
import time
from typing import Any

import jax
import suite

import lazy_torch
import runtime


def _thread_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _jax_and_frontend(name: str, wl: suite.Workload, args: argparse.Namespace):
    """JAX's training step, then PyTorch's host work for it: the same step at ``--size tiny``
    on eager CPU (``args.device``)."""
    jax_step, finish = suite.BACKENDS["jax"]("jax", wl, "train", args)
    frontend, _ = suite.BACKENDS["eager"]("eager", suite.WORKLOADS[name]("tiny"), "train", args)

    def step() -> Any:
        out = jax_step()
        frontend()
        return out

    return step, finish


def _measure(step: Any, finish: Any, lazy: bool, args: argparse.Namespace) -> dict[str, float]:
    """ms per step of ``step`` (lazy: with mark_step): the period, the Python thread's CPU time
    and the other threads'."""
    for _ in range(args.warmup):
        finish(step())
    main = threading.get_native_id()
    before, start = _thread_seconds(), time.perf_counter()
    steps, end = 0, start + args.seconds
    while steps == 0 or time.perf_counter() < end:
        out = step()
        if lazy:
            lazy_torch.mark_step()
        steps += 1
    if lazy:
        lazy_torch.wait_device_ops()
    else:
        jax.block_until_ready(out)
    period, after = time.perf_counter() - start, _thread_seconds()
    spent = {t: s - before.get(t, 0.0) for t, s in after.items()}
    python = spent.pop(main)
    per_step = 1e3 / steps
    return {"period": period * per_step, "python": python * per_step,
            "rest": sum(spent.values()) * per_step}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=["mlp"], choices=["mlp", "gpt2"])
    parser.add_argument("--seconds", type=float, default=5.0, help="per backend and round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.device, args.amp, args.size = "cpu", None, "small"
    if runtime.device(0).platform != "cpu":
        parser.error("measures XLA's CPU platform: run without LAZY_PLATFORM")
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; ms per training step, back to back, medians of {args.rounds} rounds")
    print(f"{'workload':9s}{'backend':10s}{'step':>7s}{'python':>8s}{'rest':>7s}{'cpu':>7s}"
          f"{'cpu/cores':>10s}")  # fmt: skip
    for name in args.workloads:
        wl = suite.WORKLOADS[name](args.size)
        backends = {
            "lazy": functools.partial(suite.BACKENDS["lazy"], "lazy", wl, "train", args),
            "jax": functools.partial(suite.BACKENDS["jax"], "jax", wl, "train", args),
            "jax+torch": functools.partial(_jax_and_frontend, name, wl, args),
        }
        rows: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
        for _ in range(args.rounds):
            for backend, make in backends.items():
                rows[backend].append(_measure(*make(), backend == "lazy", args))
        med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in rows.items()}
        for backend, m in med.items():
            cpu = m["python"] + m["rest"]
            print(f"{name:9s}{backend:10s}{m['period']:7.2f}{m['python']:8.2f}{m['rest']:7.2f}"
                  f"{cpu:7.2f}{cpu / cores:10.2f}")  # fmt: skip
        bound = (med["lazy"]["python"] + med["lazy"]["rest"]) / cores
        period = {b: m["period"] for b, m in med.items()}
        print(
            f"  lazy/JAX step {period['lazy'] / period['jax']:.2f}x; lazy's CPU time "
            f"over {cores} cores bounds it at {bound / period['jax']:.2f}x at best\n"
            f"  JAX plus PyTorch's own host work: {period['jax+torch'] / period['jax']:.2f}x JAX; "
            f"lazy/that {period['lazy'] / period['jax+torch']:.2f}x"
        )


if __name__ == "__main__":
    main()
