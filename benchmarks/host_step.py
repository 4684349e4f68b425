"""Host time of a training step with the structure of a large model and tiny tensors.

PYTHONPATH=. python benchmarks/host_step.py [--layers 12] [--steps 40] [--amp] [--gc-freeze]

GPT-2 (transformers) with ``--layers`` blocks of width 48, AdamW, batch 1 x 64 on device='lazy':
the device work is negligible, so a step's time is the host's (tracing plus mark_step). Prints
the mean, median and slowest step (waiting for each step's device work outside the timing), the
time the cycle collector took per step and its collections by generation (a full collection
over transformers' heap takes hundreds of ms), and how many ops per step went to the Python path
instead of the C fast path. Compare two checkouts by running it with PYTHONPATH set to each.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time

import torch

import lazy_torch
from lazy_torch.tensor import _native


class _CollectorTime:
    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--amp", action="store_true", help="lazy_torch.amp.autocast(bfloat16)")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after warm-up (README: host time)"
    )
    args = parser.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=512, n_positions=128, n_embd=48, n_layer=args.layers, n_head=12,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (1, 64)).to("lazy")
    autocast = (
        (lambda: lazy_torch.amp.autocast(dtype=torch.bfloat16))
        if args.amp
        else contextlib.nullcontext
    )

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        lazy_torch.mark_step()

    for _ in range(5):
        step()
        lazy_torch.wait_device_ops()
    if args.gc_freeze:
        gc.freeze()
    collector = _CollectorTime()
    gc.callbacks.append(collector)
    before = _native.stats()["python"] if _native is not None else None
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        lazy_torch.wait_device_ops()
    gc.callbacks.remove(collector)
    ms = [t * 1e3 for t in times]
    print(
        f"host per step: mean {statistics.mean(ms):.1f} ms, median {statistics.median(ms):.1f}, "
        f"slowest {max(ms):.1f}"
    )
    print(
        f"cycle collector: {collector.seconds / args.steps * 1e3:.2f} ms per step, collections by "
        f"generation {collector.collections} in {args.steps} steps"
    )
    if before is not None:
        python_ops = (_native.stats()["python"] - before) / args.steps
        print(f"ops on the Python path per step: {python_ops:.0f}")


if __name__ == "__main__":
    main()
