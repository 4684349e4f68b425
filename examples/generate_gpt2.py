"""Generate text with GPT-2 (Hugging Face transformers, random weights from a config: nothing is
downloaded) on device='lazy', greedy and sampled, against eager PyTorch on the CPU.

Prints, per run: lazy's tokens per second in a third call (the first one compiles: its time is
printed too), the compiles and the syncs of the three calls, eager's tokens per second, and whether
greedy tokens equal eager's. transformers' own ``model.generate()`` on device 'lazy' decodes
every token inside one in-graph loop against a static KV cache (lazy_torch/hf_generate.py);
``lazy_torch.generate``, the last run, is that loop called directly.

python examples/generate_gpt2.py                           # tiny config, 100 new tokens
python examples/generate_gpt2.py --size 124m --tokens 50   # GPT-2 124M's shapes
LAZY_PLATFORM=gpu python examples/generate_gpt2.py --size 124m --batch 8
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import lazy_torch

SIZES = {"tiny": (2, 64, 4, 256, 256), "124m": (12, 768, 12, 50257, 1024)}  # layers ... positions


def _model(size: str) -> transformers.GPT2LMHeadModel:
    n_layer, n_embd, n_head, vocab, positions = SIZES[size]
    config = transformers.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).eval()


def _counters() -> dict:
    return dict(lazy_torch.metrics.counters())


def lazy_run(generate, prompt: torch.Tensor, tokens: int) -> tuple[torch.Tensor, dict]:
    """``generate()`` three times: the first call compiles (timed apart), the second meets what
    the model cached on its first call (transformers keeps some of its masks), the third is
    timed."""
    before = _counters()
    start = time.perf_counter()
    generate().cpu()
    cold = time.perf_counter() - start
    generate().cpu()
    lazy_torch.manual_seed(0)
    start = time.perf_counter()
    out = generate().cpu()
    total = time.perf_counter() - start
    after = _counters()
    syncs = {
        k[7:]: after[k] - before.get(k, 0)
        for k in after
        if k.startswith("syncs::") and after[k] != before.get(k, 0)
    }
    return out, {
        "cold_s": cold,
        "tokens_per_s": tokens * prompt.shape[0] / total,
        "compiles": after.get("compiles", 0) - before.get("compiles", 0),
        "syncs": syncs,
    }


def eager_run(
    model, prompt: torch.Tensor, tokens: int, sample: bool, cache: str | None
) -> tuple[torch.Tensor, dict]:
    kwargs = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": sample}
    kwargs["cache_implementation"] = cache
    if sample:
        kwargs["top_k"] = 50
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(prompt, **kwargs)
        total = time.perf_counter() - start
    return out, {"tokens_per_s": tokens * prompt.shape[0] / total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--tokens", type=int, default=100, help="new tokens per sequence")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=8, help="prompt length")
    args = parser.parse_args()
    eager = _model(args.size)
    lazy = _model(args.size).to("lazy")
    vocab = eager.config.vocab_size
    prompt = torch.randint(1, vocab, (args.batch, args.prompt), generator=torch.Generator())
    n = args.tokens
    given = dict(max_new_tokens=n, min_new_tokens=n)
    runs = {
        "generate() greedy": lambda: lazy.generate(prompt, **given),
        "generate() sampled": lambda: lazy.generate(prompt, **given, do_sample=True, top_k=50),
        "lazy_torch.generate": lambda: lazy_torch.generate(lazy, prompt, n),
    }
    for name, generate in runs.items():
        sample = name.endswith("sampled")
        expected, e = eager_run(eager, prompt, n, sample, None)
        got, lz = lazy_run(generate, prompt, n)
        same = f", tokens equal eager's: {torch.equal(got, expected)}" if not sample else ""
        print(
            f"{name:19s} lazy {lz['tokens_per_s']:8.1f} tokens/s (first call {lz['cold_s']:.2f} s; "
            f"all calls: compiles {lz['compiles']}, syncs {lz['syncs']}); "
            f"eager {e['tokens_per_s']:8.1f} tokens/s{same}"
        )


if __name__ == "__main__":
    main()
