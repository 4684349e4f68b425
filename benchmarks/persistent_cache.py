"""Time to first step with the persistent executable cache (LAZY_CACHE_DIR): cold vs warm process.

PYTHONPATH=. python benchmarks/persistent_cache.py [--runs 3] [gpt2 | bert | ...]

Each run is a fresh process training a tests/models model (its tiny config) for two AdamW steps
(step 1 and step 2 compile different graphs: AdamW's state appears at step 2). It reports the time
from the first line of the script (before ``import torch``) to the end of each step's device work,
and XLA compile time from the metrics. "cold" processes start with an empty cache directory,
"warm" ones with the directory a cold run filled; "off" processes have no cache. Medians of
``--runs`` processes each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = """
import time
start = time.perf_counter()
import json, torch, lazy_torch
from tests.models import test_language_models as lm, test_t5_and_vision as tv
builders = {{"gpt2": lm.gpt2, "llama": lm.llama, "bert": lm.bert, "t5": tv.t5, "vit": tv.vit}}
model, batches, loss_fn = builders[{model!r}]()
model = model.to("lazy")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
marks = []
for i in range(2):
    batch = lazy_torch.to_device(batches[i])
    opt.zero_grad()
    loss_fn(model, batch).backward()
    opt.step()
    lazy_torch.mark_step(wait=True)
    marks.append(time.perf_counter() - start)
timings = lazy_torch.metrics.timings()
print(json.dumps({{"steps": marks, "compile": sum(timings.get("compile_time", [])),
                  "counters": lazy_torch.metrics.counters()}}))
"""


def _run(model: str, cache: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LAZY_CACHE_DIR"}
    if cache:
        env["LAZY_CACHE_DIR"] = cache
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(model=model)],
        capture_output=True, text=True, env=env, cwd=root, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="gpt2")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"off": [], "cold": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.runs):  # interleaved, so load drifts hit every kind alike
            results["off"].append(_run(args.model, None))
            cold = os.path.join(tmp, f"cold{r}")
            results["cold"].append(_run(args.model, cold))
            results["warm"].append(_run(args.model, os.path.join(tmp, "cold0")))
    print(f"{args.model}: time to the end of step 1 and step 2 (medians of {args.runs} processes)")
    print(f"{'cache':6s} {'step 1 s':>9s} {'step 2 s':>9s} {'compile s':>10s}  compiles  hits")
    med = {}
    for kind, runs in results.items():
        s1 = statistics.median(r["steps"][0] for r in runs)
        s2 = statistics.median(r["steps"][1] for r in runs)
        comp = statistics.median(r["compile"] for r in runs)
        c = runs[-1]["counters"]
        med[kind] = (s1, s2)
        print(
            f"{kind:6s} {s1:9.2f} {s2:9.2f} {comp:10.2f}  {c.get('compiles', 0):8d}  "
            f"{c.get('persistent_cache_hits', 0):4d}"
        )
    print(
        f"warm/cold: step 1 {med['warm'][0] / med['cold'][0]:.2f}x, "
        f"step 2 {med['warm'][1] / med['cold'][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
