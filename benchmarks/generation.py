"""Text generation on device='lazy' against eager CPU: Hugging Face greedy ``generate()`` with
each kind of KV cache, and a nanoGPT-style loop, with a tiny GPT-2 config (random weights).

PYTHONPATH=. python benchmarks/generation.py [--tokens 10] [--layers 2] [--width 64]
    [--programs default,static,no_cache,loop,helper]

Prints per program: wall time on lazy (compiles included) and on eager, whether the tokens are
eager's, the compiles and the syncs (``syncs::<cause>``) the lazy run made, and each compile's
reason from the recompile history (what differs from the nearest earlier graph), the first few.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import lazy_torch
import runtime


def _model(layers: int, width: int) -> transformers.GPT2LMHeadModel:
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=width, n_head=4, vocab_size=256, n_positions=256,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _generate(model, ids, tokens: int, program: str) -> torch.Tensor:
    kwargs = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    if program == "static":
        kwargs["cache_implementation"] = "static"
    if program == "no_cache":
        kwargs["use_cache"] = False
    with torch.no_grad():
        return model.generate(ids, **kwargs)


def _loop(model, ids, tokens: int, lazy: bool) -> torch.Tensor:
    """nanoGPT's sample(): the whole sequence each step, greedy, a barrier per token."""
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(input_ids=ids).logits[:, -1, :]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
            if lazy:
                lazy_torch.mark_step()
    return ids


def run(program: str, model, ids, tokens: int, device: str) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    if program == "loop":
        out = _loop(model, ids, tokens, device == "lazy")
    elif program == "helper" and device == "lazy":  # lazy_torch.generate; eager: generate()
        out = lazy_torch.generate(model, ids, tokens)
    else:
        out = _generate(model, ids, tokens, program)
    out = out.cpu()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--programs", default="default,static,no_cache,loop,helper")
    args = parser.parse_args()
    eager = _model(args.layers, args.width)
    lazy = _model(args.layers, args.width).to("lazy")
    prompt = torch.randint(1, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    for program in args.programs.split(","):
        eager_s, expected = run(program, eager, prompt, args.tokens, "cpu")
        lazy_torch.metrics.reset()
        runtime.executor.drop_cache()
        reasons: list[str] = []
        stop = runtime.metrics.listen(
            lambda e: e.kind == "compile" and e.reason and reasons.append(e.reason)
        )
        try:
            lazy_s, got = run(program, lazy, prompt.to("lazy"), args.tokens, "lazy")
        finally:
            stop()
        counters = lazy_torch.metrics.counters()
        syncs = {k[7:]: v for k, v in counters.items() if k.startswith("syncs::")}
        print(
            f"{program:9s} lazy {lazy_s:6.2f} s  eager {eager_s:5.2f} s  "
            f"tokens equal {torch.equal(got, expected)}  compiles {counters.get('compiles', 0)}"
            f"  syncs {syncs}"
        )
        distinct = list(dict.fromkeys(r.split(", created at")[0] for r in reasons))
        for reason in distinct[:3]:
            print(f"    recompile: {reason[:150]}")


if __name__ == "__main__":
    main()
