"""When each step's host work, executable call and device work happen: GPT-2 trained back to back
on device='lazy', with a per-step timeline of the tracing thread, the launch and the device.

LAZY_PLATFORM=gpu PYTHONPATH=. python benchmarks/launch_timeline.py lazy+step|lazy+compile|lazy
    [--optimizer adamw|sgd] [--size gpt2-124m] [--steps 20] [--rows 0:20]

After six synced warm-up steps, three groups of ``--steps`` steps run back to back (mark_step
without waiting, one wait at the end); each prints its ms per step. The last group also prints,
per step (ms from the group's start): S the step begins, T the traced step returns, M mark_step
returns, C0 and C1 the executable call begins and returns (on the launch thread when there is
one: LAZY_LAUNCH_THREAD), D the device finishes it; then the call's length, how long after the
previous step's device end the call began (negative: while the device was busy) and how long the
device took after the call returned. A device that finishes steps ``device ms`` apart, one after
the other, is the bound; a call that begins late shows where the host made it wait. Then the
calls of eight synced steps. Executions are all timed (LAZY_TIME_EXECUTIONS=1 is set).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("LAZY_TIME_EXECUTIONS", "1")

import torch  # noqa: E402

import lazy_torch  # noqa: E402
from benchmarks import suite  # noqa: E402
from runtime import executor, metrics, timer  # noqa: E402

_events: list[tuple[str, float]] = []
_execute = executor._execute
_time = metrics.time


def _traced_execute(*args: object) -> tuple:
    _events.append(("C0", time.perf_counter()))
    try:
        return _execute(*args)
    finally:
        _events.append(("C1", time.perf_counter()))


def _traced_time(name: str, seconds: float) -> None:
    if name == "execute_time":  # the timer thread, as the device finishes an execution
        _events.append(("D", time.perf_counter()))
    _time(name, seconds)


def _by_kind(start: float) -> dict[str, list[float]]:
    kinds: dict[str, list[float]] = {}
    for kind, t in _events:
        kinds.setdefault(kind, []).append((t - start) * 1e3)
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=["lazy+step", "lazy+compile", "lazy"])
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--size", default="gpt2-124m")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", default="0:20", help="first:last step of the timeline")
    args = parser.parse_args()
    device = "cuda" if os.environ.get("LAZY_PLATFORM", "") == "gpu" else "cpu"
    options = argparse.Namespace(device=device, amp="bf16", size=args.size)
    wl = suite._build("gpt2", args.size)
    if args.optimizer == "sgd":
        sgd = lambda ps: torch.optim.SGD(ps, lr=1e-3)  # noqa: E731
        wl = suite.Workload(wl.model, sgd, wl.batch, wl.loss, wl.infer)
    step, _ = suite._torch_backend(args.backend, wl, "train", options)
    executor._execute, metrics.time = _traced_execute, _traced_time
    for _ in range(6):
        step()
        lazy_torch.mark_step(wait=True)
    for _ in range(3):
        _events.clear()
        start = time.perf_counter()
        for _ in range(args.steps):
            _events.append(("S", time.perf_counter()))
            step()
            _events.append(("T", time.perf_counter()))
            lazy_torch.mark_step()
            _events.append(("M", time.perf_counter()))
        lazy_torch.wait_device_ops()
        timer.TIMER.drain()
        ms = (time.perf_counter() - start) / args.steps * 1e3
        print(f"{args.backend} {args.optimizer} back to back {ms:.2f} ms per step", flush=True)
    kinds = _by_kind(start)
    first, last = (int(x) for x in args.rows.split(":"))
    print("step      S      T      M     C0     C1      D   call  C0-prev D   D-C1")
    for i in range(first, min(last, args.steps, *(len(v) for v in kinds.values()))):
        row = {k: v[i] for k, v in kinds.items()}
        late = row["C0"] - kinds["D"][i - 1] if i else 0.0
        times = "".join(f"{row[k]:7.1f}" for k in ("S", "T", "M", "C0", "C1", "D"))
        call, wait = row["C1"] - row["C0"], row["D"] - row["C1"]
        print(f"{i:4d}{times} {call:6.2f} {late:10.2f} {wait:6.2f}")
    _events.clear()
    for _ in range(8):
        step()
        lazy_torch.mark_step(wait=True)
    calls = _by_kind(0.0)
    lengths = [b - a for a, b in zip(calls["C0"], calls["C1"])]
    print(f"synced: executable call median {statistics.median(lengths):.2f} ms")


if __name__ == "__main__":
    main()
