"""Generation speed: transformers' greedy ``generate()`` with a static KV cache ("static": on
device 'lazy' it decodes as one in-graph loop, lazy_torch/hf_generate.py; "loop": the same with
transformers' own Python loop, ``LAZY_HF_GENERATE=0``, on the model ``lazy_torch.compile``d, so
each decoding step replays one capture), and ``lazy_torch.generate`` ("helper"), on device='lazy'
against eager PyTorch (transformers' loop) on ``--eager-device``.

PYTHONPATH=. python benchmarks/generation_speed.py [--size tiny|124m] [--dtype bfloat16]
    [--batch 1,8] [--tokens 100] [--prompt 32] [--repeats 3] [--eager-device cpu|cuda]

GPU: ``LAZY_PLATFORM=gpu ... --size 124m --dtype bfloat16 --eager-device cuda``.

Per program and batch size, warm (every graph compiled, medians of ``--repeats`` runs):
time to first token (a whole ``generate`` of one new token), time per further token ((time
of ``--tokens`` tokens - time of one) / (tokens - 1)), and for lazy the first call's wall time
and the compiles up to the warm runs (the first call's and a second call's: transformers keeps
a mask on the module after its first call) and those of the warm runs (must be 0; counted for
the batch's lazy programs together). Per batch size the programs' and eager's warm runs take
turns, repeat by repeat, so a noisy machine's drift falls on all of them alike. Random
weights; whether lazy's tokens equal eager's is printed (in bfloat16 two backends may round a
near tie apart).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

import lazy_torch
import runtime

SIZES = {"tiny": (2, 64, 4, 256), "124m": (12, 768, 12, 50257)}  # layers, width, heads, vocab


def _model(size: str, dtype: torch.dtype, device: str) -> transformers.GPT2LMHeadModel:
    layers, width, heads, vocab = SIZES[size]
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=1024,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(dtype=dtype).eval().to(device)


def _generate(program: str, model, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    with torch.no_grad():
        if program == "helper":
            return lazy_torch.generate(model, ids, tokens).cpu()
        kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        mask = torch.ones_like(ids)
        routed, runtime.config.HF_GENERATE = runtime.config.HF_GENERATE, program != "loop"
        try:
            return model.generate(
                ids, attention_mask=mask, cache_implementation="static", **kwargs
            ).cpu()
        finally:
            runtime.config.HF_GENERATE = routed


def _timed(program: str, model, ids: torch.Tensor, tokens: int) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = _generate(program, model, ids, tokens)
    return time.perf_counter() - start, out


def measure(runs: list[tuple], args) -> list[dict]:
    """Each of ``runs`` ((program, model, prompt, lazy) tuples) warmed up, then timed in turn,
    repeat by repeat, so that a noisy machine's drift falls on all of them alike."""
    compiles = lambda: lazy_torch.metrics.counters().get("compiles", 0)  # noqa: E731
    found = []
    for program, model, prompt, lazy in runs:
        before = compiles()
        cold, out = _timed(program, model, prompt, args.tokens)
        for tokens in (1, args.tokens, 1, args.tokens):  # a second call may compile one graph
            _timed(program, model, prompt, tokens)
        found.append({"cold_s": cold, "cold_compiles": compiles() - before, "tokens": out})
    for program, model, prompt, _ in runs:  # in turns once: what one leaves pending, the next
        for tokens in (1, args.tokens):  # computes (a graph of its own, compiled here)
            _timed(program, model, prompt, tokens)
    warm = compiles()
    first: list[list[float]] = [[] for _ in runs]
    whole: list[list[float]] = [[] for _ in runs]
    for _ in range(args.repeats):
        for k, (program, model, prompt, _) in enumerate(runs):
            first[k].append(_timed(program, model, prompt, 1)[0])
            whole[k].append(_timed(program, model, prompt, args.tokens)[0])
    for k, got in enumerate(found):
        ttft, total = statistics.median(first[k]), statistics.median(whole[k])
        got["ttft_ms"] = 1e3 * ttft
        got["per_token_ms"] = 1e3 * (total - ttft) / (args.tokens - 1)
    found[0]["warm_compiles"] = compiles() - warm  # all lazy runs' together
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", default="1,8", type=lambda s: [int(b) for b in s.split(",")])
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager-device", default="cpu")
    parser.add_argument("--programs", default="static,loop,helper")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    eager = _model(args.size, dtype, args.eager_device)
    lazy = _model(args.size, dtype, "lazy")
    compiled = lazy_torch.compile(_model(args.size, dtype, "lazy"))
    vocab = SIZES[args.size][3]
    print(f"GPT-2 {args.size} {args.dtype}, prompt {args.prompt}, {args.tokens} new tokens, "
          f"eager on {args.eager_device}, {args.repeats} repeats (medians)")  # fmt: skip
    print(f"{'program':8s} {'batch':>5s} {'lazy ms/tok':>11s} {'eager ms/tok':>12s} "
          f"{'lazy TTFT ms':>12s} {'eager TTFT ms':>13s} {'lazy cold s':>11s} "
          f"{'compiles':>8s} {'warm':>4s} {'equal':>5s}")  # fmt: skip
    for batch in args.batch:
        generator = torch.Generator().manual_seed(batch)
        prompt = torch.randint(1, vocab, (batch, args.prompt), generator=generator)
        runs = [("static", eager, prompt.to(args.eager_device), False)]
        on_lazy = prompt.to("lazy")
        lazy_torch.mark_step()  # device data, as a program's input would be
        for program in args.programs.split(","):
            model = compiled if program == "loop" else lazy
            runs.append((program, model, on_lazy, True))
        base, *lazies = measure(runs, args)
        for (program, *_), got in zip(runs[1:], lazies):
            got["warm_compiles"] = base["warm_compiles"]
            equal = torch.equal(got["tokens"], base["tokens"])
            print(f"{program:8s} {batch:5d} {got['per_token_ms']:11.2f} "
                  f"{base['per_token_ms']:12.2f} {got['ttft_ms']:12.1f} {base['ttft_ms']:13.1f} "
                  f"{got['cold_s']:11.1f} {got['cold_compiles']:8d} {got['warm_compiles']:4d} "
                  f"{str(equal):>5s}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
