"""lazy_torch.generate against transformers' generate() on eager CPU: the same tokens (greedy,
with and without EOS), compiles bounded by the length bucket, no syncs without EOS."""

from __future__ import annotations

import pytest
import torch
import transformers

import lazy_torch
from lazy_torch.generation import bucket_length
from tests.lazy_torch.models import tiny_gpt2


def _count(prefix: str) -> int:
    counters = lazy_torch.metrics.counters()
    return sum(v for k, v in counters.items() if k.startswith(prefix))


def _syncs() -> int:
    return _count("syncs::") - _count("syncs::mark_step")


def test_greedy_tokens_equal_transformers_in_one_loop_for_any_length():
    # One in-graph loop per (batch, bucket): with and without a KV cache, for any token count
    # within the bucket, no sync before the result is read.
    import runtime

    runtime.executor.drop_cache()  # other tests' graphs of this model
    model, lazy = tiny_gpt2(), tiny_gpt2().to("lazy")
    prompt = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    for use_cache in (None, False):
        compiles = []
        for tokens in (9, 11, 3):  # buckets of 16, 16 and 8 positions
            with torch.no_grad():
                expected = model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens)
            before, syncs = _count("compiles"), _syncs()
            got = lazy_torch.generate(lazy, prompt, max_new_tokens=tokens, use_cache=use_cache)
            assert _syncs() == syncs
            compiles.append(_count("compiles") - before)
            assert torch.equal(got.cpu(), expected)
        assert len(set(expected[0, 5:].tolist())) > 1  # the model does not repeat one token
        assert compiles[0] <= 3 and compiles[1] == 0, compiles  # the prefill, the loop, a fill
        assert compiles[2] <= 3, compiles  # a new bucket


def test_a_compiled_model_decodes_inside_the_loop():
    model, lazy = tiny_gpt2(), lazy_torch.compile(tiny_gpt2().to("lazy"))
    prompt = torch.randint(1, 64, (1, 4), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=7, min_new_tokens=7)
    for _ in range(2):
        assert torch.equal(lazy_torch.generate(lazy, prompt, max_new_tokens=7).cpu(), expected)
    out = lazy(prompt.to("lazy")).logits  # and its calls outside a loop still replay
    assert torch.allclose(out.cpu(), model(prompt).logits, atol=1e-5)


def test_eos_stops_as_transformers_stops_with_one_read():
    model, lazy = tiny_gpt2(), tiny_gpt2().to("lazy")
    prompt = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        free = model.generate(prompt, max_new_tokens=12, min_new_tokens=12)
    eos = int(free[0, 6])  # row 0 makes it as its third new token
    for rows in (prompt, prompt[:1]):  # the last: every row finished, a shorter result
        for use_cache in (None, False):
            with torch.no_grad():
                expected = model.generate(
                    rows, max_new_tokens=12, eos_token_id=eos, pad_token_id=63
                )
            syncs = _syncs()
            got = lazy_torch.generate(
                lazy, rows, max_new_tokens=12, eos_token_id=eos, pad_token_id=63,
                use_cache=use_cache,
            )  # fmt: skip
            assert _syncs() == syncs  # the length is read from the dispatched loop's result
            assert torch.equal(got.cpu(), expected)
    assert expected.shape[1] < 4 + 12 and expected[0, -1] == eos
    with torch.no_grad():  # EOS is not chosen before min_new_tokens new tokens
        expected = model.generate(
            prompt, max_new_tokens=12, min_new_tokens=5, eos_token_id=eos, pad_token_id=63
        )
    got = lazy_torch.generate(
        lazy, prompt, max_new_tokens=12, min_new_tokens=5, eos_token_id=eos, pad_token_id=63
    )
    assert torch.equal(got.cpu(), expected) and (expected[0, 4:8] != eos).all()


def _decoder(kind: str) -> transformers.PreTrainedModel:
    sizes = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    if kind == "llama":  # rotary positions, grouped-query attention
        config = transformers.LlamaConfig(
            **sizes, intermediate_size=128, num_key_value_heads=2, initializer_range=0.2
        )
        model = transformers.LlamaForCausalLM
    else:  # OPT: learned positions counted from the mask unless given
        config = transformers.OPTConfig(
            **sizes, ffn_dim=128, word_embed_proj_dim=64, init_std=0.2, pad_token_id=1
        )
        model = transformers.OPTForCausalLM
    torch.manual_seed(0)
    return model(config).eval()


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_other_decoders_with_a_static_cache_equal_transformers(kind):
    model, lazy = _decoder(kind), _decoder(kind).to("lazy")
    ids = torch.randint(2, 128, (2, 7), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        expected = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, min_new_tokens=12,
            pad_token_id=1,
        )  # fmt: skip
    got = lazy_torch.generate(lazy, ids, 12, use_cache=True)
    assert torch.equal(got.cpu(), expected)


def test_left_padded_prompts_with_an_attention_mask_equal_transformers():
    model, lazy = tiny_gpt2(), tiny_gpt2().to("lazy")
    ids = torch.randint(1, 64, (3, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, :2] = mask[2, :4] = 0
    ids[mask == 0] = 0
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=9, min_new_tokens=9)
    unmasked = lazy_torch.generate(lazy, ids, 9).cpu()
    assert not torch.equal(unmasked, expected)  # the padding changes what the rows generate
    for use_cache in (None, False):
        got = lazy_torch.generate(lazy, ids, 9, attention_mask=mask, use_cache=use_cache)
        assert torch.equal(got.cpu(), expected)
    with pytest.raises(ValueError, match=r"attention_mask must be \(3, 6\)"):
        lazy_torch.generate(lazy, ids, 9, attention_mask=mask[:, 1:])


def test_sampling_draws_anew_each_token_from_the_lazy_generator():
    lazy = tiny_gpt2().to("lazy")
    prompt = torch.tensor([[3, 4, 5]])
    lazy_torch.manual_seed(7)
    a = lazy_torch.generate(lazy, prompt, max_new_tokens=6, do_sample=True, top_k=1).cpu()
    greedy = lazy_torch.generate(lazy, prompt, max_new_tokens=6).cpu()
    assert torch.equal(a, greedy)  # top_k=1 is greedy
    flat = dict(do_sample=True, temperature=100.0)  # nearly uniform: far from greedy
    nucleus = lazy_torch.generate(lazy, prompt, 6, top_p=1e-6, **flat).cpu()
    assert torch.equal(nucleus, greedy)  # so is a top_p below the likeliest token's probability
    assert not torch.equal(lazy_torch.generate(lazy, prompt, 6, top_p=0.9, **flat).cpu(), greedy)
    draws, compiles = [], []
    for seed in (None, 7, 7, 8):  # the RNG state made before the call, then within it
        if seed is not None:
            lazy_torch.manual_seed(seed)
        before = _count("compiles")
        draws.append(lazy_torch.generate(lazy, prompt, 20, do_sample=True, temperature=100.0).cpu())
        compiles.append(_count("compiles") - before)
    assert compiles[1:] == [0, 0, 0], compiles  # one program, wherever the state was made
    draws = draws[1:]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert draws[0].shape == (1, 23) and int(draws[0].max()) < 64
    assert len(set(draws[0][0, 3:].tolist())) > 5  # nearly uniform: each token drew anew


class _LastLogits(torch.nn.Module):  # nanoGPT's inference path: the last position's logits
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 64)

    def forward(self, ids: torch.Tensor) -> tuple:
        return self.embed(ids)[:, -1:], None


def test_bucket_lengths_and_bad_input():
    assert [bucket_length(n, None) for n in (1, 2, 3, 16, 17)] == [1, 2, 4, 16, 32]
    assert bucket_length(100, 128) == 128 and bucket_length(70, 100) == 100
    with pytest.raises(ValueError, match="exceed the model's 128 positions"):
        lazy_torch.generate(tiny_gpt2().to("lazy"), torch.ones(1, 100, dtype=torch.long), 40)
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        lazy_torch.generate(tiny_gpt2().to("lazy"), torch.ones(5, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="logits for 1 of 8 positions"):
        lazy_torch.generate(_LastLogits().to("lazy"), torch.ones(1, 3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="use_cache=True needs a transformers model"):
        lazy_torch.generate(_LastLogits().to("lazy"), torch.ones(1, 3, dtype=torch.long), 4,
                            use_cache=True)  # fmt: skip


def test_transformers_generate_with_a_static_cache_compiles_as_many_graphs_for_any_length(
    monkeypatch,
):
    # transformers' own loop (LAZY_HF_GENERATE=0; else lazy_torch/hf_generate.py decodes in the
    # graph): the stopping criteria and the next step's input read the growing sequence's last
    # column only (lazy_torch/views.py), so only its first steps differ.
    import runtime

    monkeypatch.setattr(runtime.config, "HF_GENERATE", False)
    model, lazy = tiny_gpt2(), tiny_gpt2().to("lazy")
    prompt = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    compiles = []
    for tokens in (6, 17):
        kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, cache_implementation="static")
        with torch.no_grad():
            expected = model.generate(prompt, **kwargs)
            runtime.executor.drop_cache()
            before, syncs = _count("compiles"), _count("syncs::")
            got = lazy.generate(prompt.to("lazy"), **kwargs).cpu()
        compiles.append(_count("compiles") - before)
        assert torch.equal(got, expected)
        assert _count("syncs::") - syncs <= tokens + 8  # one a token, and the input checks'
    assert compiles[0] == compiles[1] <= 10, compiles


def test_transformers_generate_with_a_static_cache_replays_a_compiled_model(monkeypatch):
    # lazy_torch.compile(model) under transformers' own loop: the decoding steps' calls, given
    # the StaticCache, replay one capture (a new cache at every generate() call has the same
    # layout): no model code runs.
    import runtime

    monkeypatch.setattr(runtime.config, "HF_GENERATE", False)
    model, lazy = tiny_gpt2(), lazy_torch.compile(tiny_gpt2().to("lazy"))
    prompt = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(4))
    captures, compiles = [], []
    for tokens in (6, 6, 6, 6):
        kwargs = dict(max_new_tokens=tokens, min_new_tokens=tokens, cache_implementation="static")
        with torch.no_grad():
            expected = model.generate(prompt, **kwargs)
            before, compiled = _count("captures"), _count("compiles")
            got = lazy.generate(prompt.to("lazy"), **kwargs).cpu()
        captures.append(_count("captures") - before)
        compiles.append(_count("compiles") - compiled)
        assert torch.equal(got, expected)
    # transformers sets an attribute on the model at its first call (the cache length), so the
    # second call's prefill is watched once more (and refused: a fresh cache holds a CPU
    # tensor); later calls run it op by op as that one did, recording the same graph. The
    # first call's decoding steps record the replay's graph from the first (no graph for the
    # capture's op-by-op IR), and the last token's stopping flag is a graph parameter.
    assert captures[0] <= 3 and captures[2:] == [0, 0], captures
    assert compiles[0] <= 10 and compiles[2:] == [0, 0], compiles


def test_transformers_generate_on_a_compiled_model_compiles_three_graphs_then_none(monkeypatch):
    # With small reads on the host (lazy_torch/host_reads.py, on outside the test suite): the
    # input checks and the sequence read compile nothing, so a first call compiles the prefill,
    # the first decoding step (it reads the prefill's positions) and the steady step; later
    # calls of the same cache length compile nothing, whatever their number of tokens would
    # make of the sequence read.
    import runtime

    monkeypatch.setattr(runtime.config, "HF_GENERATE", False)  # transformers' own loop
    monkeypatch.setattr(runtime.config, "HOST_READS", True)
    monkeypatch.setattr(runtime.spmd, "_active", [False])  # an earlier test's mesh: none here
    runtime.executor.drop_cache()  # the graphs of other tests of this model
    model, lazy = tiny_gpt2(), lazy_torch.compile(tiny_gpt2().to("lazy"))
    prompt = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(5))
    compiles = []
    for tokens in (6, 6, 4):  # one cache length: 5 + 6
        config = transformers.GenerationConfig(
            max_new_tokens=tokens, min_new_tokens=tokens, cache_implementation="static",
            cache_config={"max_cache_len": 11},
        )  # fmt: skip
        with torch.no_grad():
            expected = model.generate(prompt, generation_config=config)
            before = _count("compiles")
            got = lazy.generate(prompt.to("lazy"), generation_config=config).cpu()
        compiles.append(_count("compiles") - before)
        assert torch.equal(got, expected)
    assert compiles == [3, 0, 0], compiles
