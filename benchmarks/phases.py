"""Host time per phase of a training step, eager against lazy, synced and back to back.

PYTHONPATH=. python benchmarks/phases.py [--device cuda] [--size gpt2-124m] [--amp bf16]
    [--rounds 6] [--fused] [workload]

Builds one of the suite's workloads (``benchmarks/suite.py``; GPT-2 by default) on eager PyTorch
and on device='lazy' in one process and runs blocks of five training steps, alternating the
backends and the modes (synced: wait for the device after every step; back to back: once per
block), so that drift in the host's speed reaches every column alike. Prints, per backend and
mode, the median host time of the forward (with zero_grad), the backward, the optimizer step and
mark_step, and the mean step period of the blocks (a back-to-back block's includes its one wait,
so it exceeds the steady step that ``suite.py``'s b2b column measures). When both backends are
host-bound, the phases where lazy spends more host time than eager are where its step loses.
``--fused`` gives both backends' optimizers ``fused=True`` (one kernel, or one lazy node, per step
instead of a foreach call per arithmetic step). Lazy's default Adam, AdamW and SGD already record
the fused step on float32 parameters; ``LAZY_FUSE_FOREACH_STEPS=0`` gives lazy the foreach path.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import suite
import torch

import lazy_torch

PHASES = ("fwd", "bwd", "opt", "mark")


def _backend(backend: str, wl: suite.Workload, args: argparse.Namespace) -> tuple[Any, Any]:
    lazy = backend == "lazy"
    model, batch, autocast = suite.placed(backend, wl, args)
    model.train()
    opt = wl.optimizer(model.parameters(), **({"fused": True} if args.fused else {}))
    if lazy:
        wait = lazy_torch.wait_device_ops
    else:
        wait = torch.cuda.synchronize if args.device == "cuda" else lambda: None

    def step(times: dict[str, list[float]] | None) -> None:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = wl.loss(model, batch)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if lazy:
            lazy_torch.mark_step()
        t4 = time.perf_counter()
        if times is not None:
            for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                times.setdefault(phase, []).append(seconds * 1e3)

    return step, wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", nargs="?", default="gpt2", choices=sorted(suite.WORKLOADS))
    parser.add_argument("--device", default="cpu", help="eager's device: cpu or cuda")
    parser.add_argument("--size", default="small", choices=("small", "gpt2-124m"))
    parser.add_argument("--amp", choices=("bf16",), help="autocast both backends to bfloat16")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--fused", action="store_true", help="both backends' optimizers with fused=True"
    )
    args = parser.parse_args()
    wl = suite.WORKLOADS[args.workload](args.size)
    backends = {b: _backend(b, wl, args) for b in ("eager", "lazy")}
    for step, wait in backends.values():
        for _ in range(4):  # warm-up: lazy compiles here
            step(None)
            wait()
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for backend, (step, wait) in backends.items():
            for mode in ("synced", "b2b") if r % 2 else ("b2b", "synced"):
                times = results.setdefault((backend, mode), {})
                wait()
                start = time.perf_counter()
                for _ in range(5):
                    step(times)
                    if mode == "synced":
                        wait()
                wait()
                times.setdefault("period", []).append((time.perf_counter() - start) / 5 * 1e3)
    print(f"{args.workload} ({args.size}, amp {args.amp}): ms per step, medians over the blocks")
    print(f"{'backend':8s}{'mode':8s}" + "".join(f"{k:>8s}" for k in (*PHASES, "period")))
    for (backend, mode), times in results.items():
        cells = "".join(f"{statistics.median(times[k]):8.2f}" for k in (*PHASES, "period"))
        print(f"{backend:8s}{mode:8s}{cells}")


if __name__ == "__main__":
    main()
