"""Whether a compiled whole training step's host work overlaps the device's: GPT-2 back to back
under ``lazy_torch.compile`` of its whole step, with AdamW (its step counts change the graph's
host scalars every step) or SGD at a constant learning rate (they stay the same).

LAZY_PLATFORM=gpu PYTHONPATH=. python benchmarks/step_overlap.py adamw|sgd [--size gpt2-124m]

After six synced warm-up steps, three groups of ten steps run back to back (mark_step without
waiting, one wait at the end): per group, ms per step, the median host time of a step on the
tracing thread (the replay and mark_step), and the medians of the launch thread's executable
call (``dispatch_time``) and of the device's execution (``execute_time``). Back to back, a step
whose host work overlaps the device takes max(host, device); one that waits for the previous
step takes their sum. Then five synced steps' medians. Needs a GPU for the overlap to mean
anything.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lazy_torch
from benchmarks import suite


def _medians() -> dict[str, float]:
    return {
        k: round(statistics.median(v) * 1e3, 2)
        for k, v in lazy_torch.metrics.timings().items()
        if v and k in ("dispatch_time", "execute_time")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("optimizer", choices=["adamw", "sgd"])
    parser.add_argument("--size", default="gpt2-124m")
    args = parser.parse_args()
    wl = suite._build("gpt2", args.size)
    if args.optimizer == "sgd":
        sgd = lambda ps: torch.optim.SGD(ps, lr=1e-3)  # noqa: E731
        wl = suite.Workload(wl.model, sgd, wl.batch, wl.loss, wl.infer)
    options = argparse.Namespace(device="cuda", amp="bf16", size=args.size)
    step, _ = suite._torch_backend("lazy+step", wl, "train", options)
    for _ in range(6):
        step()
        lazy_torch.mark_step(wait=True)
    for _ in range(3):
        lazy_torch.metrics.reset()
        host = []
        start = time.perf_counter()
        for _ in range(10):
            begin = time.perf_counter()
            step()
            lazy_torch.mark_step()
            host.append(time.perf_counter() - begin)
        lazy_torch.wait_device_ops()
        ms = (time.perf_counter() - start) / 10 * 1e3
        host_ms = statistics.median(host) * 1e3
        print(f"{args.optimizer} back to back {ms:.2f} ms, host {host_ms:.2f} ms", _medians())
    lazy_torch.metrics.reset()
    for _ in range(5):
        step()
        lazy_torch.mark_step(wait=True)
    print(f"{args.optimizer} synced", _medians())


if __name__ == "__main__":
    main()
