"""Training step time of the tests/models transformers models: eager CPU vs device='lazy'.

PYTHONPATH=. python benchmarks/model_steps.py [--steps 12] [--threads N] [gpt2 llama ...]

Each model (its tiny test config) trains with AdamW + clip_grad_norm_; after 3 warm-up steps,
every step is timed to the end of its device work (lazy: mark_step, then wait), and the median is
printed with the lazy/eager ratio, parameters, compiles per step and fallback ops seen.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import lazy_torch
from tests.models import test_language_models as lm
from tests.models import test_t5_and_vision as tv
from tests.models.common import to_device

BUILDERS = {"gpt2": lm.gpt2, "llama": lm.llama, "bert": lm.bert, "t5": tv.t5, "vit": tv.vit}
BUILDERS["resnet"] = tv.resnet


def _times(model, batches, loss_fn, device: str, steps: int) -> tuple[list[float], list[int]]:
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [to_device(b, device) for b in batches]
    times, compiles = [], []
    for i in range(3 + steps):
        before = lazy_torch.metrics.counters().get("compiles", 0)
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model, batches[i % len(batches)])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device == "lazy":
            lazy_torch.mark_step()
            lazy_torch.wait_device_ops()
        times.append(time.perf_counter() - start)
        compiles.append(lazy_torch.metrics.counters().get("compiles", 0) - before)
    return times[3:], compiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(BUILDERS))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"{'model':8s} {'params':>9s} {'eager ms':>9s} {'lazy ms':>9s} {'lazy/eager':>10s}  "
        "compiles per step  fallbacks"
    )
    for name in args.models:
        model, batches, loss_fn = BUILDERS[name]()
        eager, _ = _times(model, batches, loss_fn, "cpu", args.steps)
        lazy_torch.metrics.reset()
        lazy, compiles = _times(model, batches, loss_fn, "lazy", args.steps)
        fallbacks = sorted(
            k.removeprefix("fallback::")
            for k in lazy_torch.metrics.counters()
            if k.startswith("fallback::")
        )
        e, z = statistics.median(eager) * 1e3, statistics.median(lazy) * 1e3
        params = sum(p.numel() for p in model.parameters())
        print(
            f"{name:8s} {params:9d} {e:9.1f} {z:9.1f} {z / e:10.2f}  {compiles}  "
            f"{', '.join(fallbacks) or 'none'}"
        )


if __name__ == "__main__":
    main()
