"""A training step that reads ``loss.item()`` before ``mark_step()``, with partial syncs that
settle (lazy_core/rebase.py) and without.

PYTHONPATH=. python benchmarks/observed_loss.py [--rounds 6] [--steps 10]

transformers GPT-2 (4 layers of width 64, batch 4 x 64), AdamW. Without settling, the ``.item()``
computes the forward and the barrier computes it again inside the whole step; with it, the
barrier reads the activations the ``.item()`` computed. The two modes alternate in blocks of
``--steps`` steps in one process (the first block of each is warm-up); prints each mode's median
step time and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lazy_torch
from lazy_torch import sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=512, n_positions=128, n_embd=64, n_layer=4, n_head=4, use_cache=False
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 512, (4, 64)).to("lazy")
    settling = sync.extra_outputs
    modes = {"settling": settling, "not settling": lambda *a: ([], [], [])}
    times: dict[str, list[float]] = {name: [] for name in modes}
    for r in range(args.rounds + 1):
        for name, rule in modes.items():
            sync.extra_outputs = rule
            for _ in range(args.steps):
                start = time.perf_counter()
                loss = model(x, labels=x).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
                loss.item()
                lazy_torch.mark_step(wait=True)
                if r:
                    times[name].append(time.perf_counter() - start)
    sync.extra_outputs = settling
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, m in medians.items():
        print(f"{name:13} {m * 1e3:7.2f} ms a step (median of {len(times[name])})")
    print(f"ratio {medians['settling'] / medians['not settling']:.2f}")


if __name__ == "__main__":
    main()
