"""An evaluation loop without ``mark_step()``: automatic cuts against one growing graph.

PYTHONPATH=. python benchmarks/eval_loop.py [--batches 1000] [--cuts 0,500,2000,20000]

A small MLP (about 10 IR nodes a batch) counts its correct predictions over ``--batches``
batches of 16, with no barrier until the count is read. Each ``--cuts`` value runs in its own
process with ``LAZY_CUT_NODES`` set to it (0: never cut): prints the wall time (compiles
included), the compiles, the automatic cuts and the peak RSS, and checks the count against eager.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(batches: int) -> dict:
    import torch

    import lazy_torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    data = [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(batches)]
    with torch.no_grad():
        expected = sum(int((model(x).argmax(-1) == y).sum()) for x, y in data)
        model = model.to("lazy").eval()
        start = time.perf_counter()
        correct = torch.zeros((), dtype=torch.long, device="lazy")
        for x, y in data:
            x, y = x.to("lazy"), y.to("lazy")
            correct += (model(x).argmax(-1) == y).sum()
        got = int(correct)
    counters = lazy_torch.metrics.counters()
    return {
        "seconds": time.perf_counter() - start,
        "compiles": counters.get("compiles", 0),
        "cuts": counters.get("syncs::auto_cut", 0),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "equal": got == expected,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--cuts", default="0,500,2000,20000")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.batches)))
        return
    for cut in args.cuts.split(","):
        env = {**os.environ, "LAZY_CUT_NODES": cut}
        command = [sys.executable, __file__, "--child", "--batches", str(args.batches)]
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"LAZY_CUT_NODES={cut:>6s}: {r['seconds']:6.1f} s, compiles {r['compiles']}, "
            f"cuts {r['cuts']}, peak RSS {r['peak_rss_mib']:.0f} MiB, equals eager {r['equal']}"
        )


if __name__ == "__main__":
    main()
