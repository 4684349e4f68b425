"""Where a token's time goes in transformers' greedy ``generate()`` with a static cache: the
phases of its decoding loop timed on device='lazy' (the model ``lazy_torch.compile``d) and on
``--eager-device``, in one run, and the lazy runtime's per-execution timings.

PYTHONPATH=. python benchmarks/generation_phases.py [--size tiny|124m] [--dtype bfloat16]
    [--batch 1] [--tokens 100] [--repeats 3] [--eager-device cpu|cuda]

Each phase is the time spent inside one of transformers' calls, per token (the whole call
divided by ``--tokens``; the prefill included): ``prepare`` (prepare_inputs_for_generation),
``forward`` (the model's call: a replay on lazy), ``logits`` (the logits processors),
``stopping`` (the stopping criteria), ``update`` (_update_model_kwargs_for_generation), and on
lazy ``sync`` (the barriers: the stopping check's ``item`` runs the token's graph); ``loop`` is
the rest of the loop. Medians of ``--repeats`` warm calls (every graph compiled).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import transformers.generation.logits_process as logits_process
import transformers.generation.stopping_criteria as stopping_criteria

import lazy_torch
from benchmarks import generation_speed
from benchmarks.generation_speed import SIZES, _model
from lazy_torch import sync as lazy_sync

PHASES = ("prepare", "forward", "logits", "stopping", "update", "sync")


def _timed_phases(model, times: dict) -> None:
    """Wrap the calls each phase times (on the model's class and transformers' lists)."""
    owners = [
        (type(model), "prepare_inputs_for_generation", "prepare"),
        (type(model), "__call__", "forward"),
        (logits_process.LogitsProcessorList, "__call__", "logits"),
        (stopping_criteria.StoppingCriteriaList, "__call__", "stopping"),
        (type(model), "_update_model_kwargs_for_generation", "update"),
        (lazy_sync, "_sync", "sync"),
    ]
    for owner, name, phase in owners:
        original = getattr(owner, name)
        if getattr(original, "_phase", None) is not None:
            continue

        @functools.wraps(original)  # transformers reads the signatures
        def timed(*args, _original=original, _phase=phase, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                times[_phase] = times.get(_phase, 0.0) + time.perf_counter() - start

        timed._phase = phase
        setattr(owner, name, timed)


def _generate(model, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    return generation_speed._generate("static", model, ids, tokens)


def measure(model, ids: torch.Tensor, args, times: dict) -> dict:
    for _ in range(3):  # compiles, then warm
        _generate(model, ids, args.tokens)
    runs = []
    for _ in range(args.repeats):
        times.clear()
        start = time.perf_counter()
        _generate(model, ids, args.tokens)
        total = time.perf_counter() - start
        phases = {p: times.get(p, 0.0) for p in PHASES}
        phases["loop"] = total - sum(phases.values())
        runs.append({k: 1e3 * v / args.tokens for k, v in {"total": total, **phases}.items()})
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager-device", default="cpu")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    vocab = SIZES[args.size][3]
    prompt = torch.randint(1, vocab, (args.batch, args.prompt), generator=torch.Generator())
    times: dict = {}
    rows = {}
    for device in (args.eager_device, "lazy"):
        model = _model(args.size, dtype, device)
        if device == "lazy":
            lazy_torch.compile(model)
        _timed_phases(model, times)
        rows[device] = measure(model, prompt.to(device), args, times)
        if device == "lazy":
            lazy_torch.metrics.reset()
            _generate(model, prompt.to(device), args.tokens)
            timings = lazy_torch.metrics.report().split("Sizes")[0]
    print(f"GPT-2 {args.size} {args.dtype}, batch {args.batch}, prompt {args.prompt}, "
          f"{args.tokens} new tokens, medians of {args.repeats}: ms a token per phase")  # fmt: skip
    names = ("total", *PHASES, "loop")
    print(f"{'device':8s} " + " ".join(f"{n:>8s}" for n in names))
    for device, row in rows.items():
        print(f"{device:8s} " + " ".join(f"{row[n]:8.2f}" for n in names))
    eager, lazy = rows[args.eager_device], rows["lazy"]
    print(f"lazy / eager: {lazy['total'] / eager['total']:.2f}")
    print("lazy runtime, one more call:\n" + timings)


if __name__ == "__main__":
    main()
