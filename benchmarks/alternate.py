"""Back-to-back training step times of backends run in alternating processes, with ratios.

PYTHONPATH=. python benchmarks/alternate.py [--workload gpt2] [--rounds 3] [--backends eager,lazy]
    [suite.py's options: --device cuda --size gpt2-124m --amp bf16 --steps 40 ...]

The device tool's hosts change speed by up to 2x between runs and within one run, and a backend
sharing a process with another runs on caches the other cooled. So this runs ``suite.py
--backends B`` once per backend in turn, ``--rounds`` times, each in a process of its own, and
prints every process's back-to-back training step time (``b2b``: the mean over ``--steps`` steps
queued back to back, as a training loop runs them), each round's ratio to the first backend's
process just before it, and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def _b2b(backend: str, workload: str, suite_args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [sys.executable, os.path.join(os.path.dirname(__file__), "suite.py")]
        command += ["--backends", backend, "--json", out, *suite_args, workload]
        done = subprocess.run(
            command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)["results"][workload]["train"][backend]["back_to_back_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="eager,lazy")
    args, suite_args = parser.parse_known_args()
    backends = args.backends.split(",")
    times: dict[str, list[float]] = {b: [] for b in backends}
    for r in range(args.rounds):
        for backend in backends:
            times[backend].append(_b2b(backend, args.workload, suite_args))
        line = "  ".join(f"{b} {times[b][-1]:7.2f}" for b in backends)
        ratios = "  ".join(
            f"{b}/{backends[0]} {times[b][-1] / times[backends[0]][-1]:.2f}" for b in backends[1:]
        )
        print(f"round {r + 1}: {line} ms   {ratios}", flush=True)
    medians = {b: statistics.median(v) for b, v in times.items()}
    line = "  ".join(f"{b} {m:7.2f}" for b, m in medians.items())
    ratios = "  ".join(
        f"{b}/{backends[0]} {statistics.median(t / e for t, e in zip(times[b], times[backends[0]])):.2f}"
        for b in backends[1:]
    )
    print(f"median:  {line} ms   {ratios} (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
