"""transformers' own generate() on a lazy model, against eager CPU: decoded as one in-graph loop
where its settings have in-graph rules (lazy_torch/hf_generate.py), transformers' Python loop
otherwise; the same tokens either way."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.generation.streamers import BaseStreamer

import lazy_torch
import runtime
from lazy_torch import hf_generate
from tests.lazy_torch.models import tiny_gpt2


def _count(prefix: str) -> int:
    return sum(v for k, v in lazy_torch.metrics.counters().items() if k.startswith(prefix))


class _Calls:
    """Counts a module's forward calls: the in-graph loop calls it twice (the prefill, the
    body's trace), transformers' loop once a token."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.n = 0
        module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args) -> None:
        self.n += 1


def _pair(make=tiny_gpt2) -> tuple:
    model, lazy = make(), make().to("lazy")
    return model, lazy, _Calls(lazy)


def _generate(model: torch.nn.Module, ids: torch.Tensor, read=True, **kwargs) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(ids.to(device), **kwargs)
    return out.cpu() if read else out


@pytest.fixture(autouse=True)
def _warnings_anew(monkeypatch):
    monkeypatch.setattr(hf_generate, "_warned", set())


SETTINGS = [
    dict(),  # transformers' default (dynamic) cache, stopped by EOS or the length
    dict(cache_implementation="static"),
    dict(use_cache=False, min_new_tokens=4),
    dict(min_length=12, repetition_penalty=1.5),
    dict(eos_token_id=[5, 9, 0], pad_token_id=63, forced_eos_token_id=7),
    dict(no_repeat_ngram_size=2, renormalize_logits=True, remove_invalid_values=True),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(s) or "default")
def test_greedy_generate_equals_eager_in_one_loop_without_syncs_a_token(settings):
    model, lazy, calls = _pair()
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    syncs, compiles = [], []
    for tokens in (9, 7):  # one bucket of 16 positions
        expected = _generate(model, ids, max_new_tokens=tokens, **settings)
        calls.n, before, synced = 0, _count("compiles"), _count("syncs::item")
        got = _generate(lazy, ids, read=False, max_new_tokens=tokens, **settings)
        assert calls.n == 2  # the prefill and the loop body's trace, whatever the tokens
        syncs.append(_count("syncs::item") - synced)
        compiles.append(_count("compiles") - before)  # (a read of a new length compiles)
        assert torch.equal(got.cpu(), expected)
    assert syncs[0] == syncs[1] <= 6, syncs  # transformers' checks of its inputs only
    assert compiles[1] == 0, compiles


def test_eos_stops_every_row_where_eager_stops():
    model, lazy, _ = _pair()
    ids = torch.randint(1, 64, (2, 4), generator=torch.Generator().manual_seed(2))
    free = _generate(model, ids, max_new_tokens=12, min_new_tokens=12)
    outs = []
    for eos in (int(free[0, 6]), [int(free[0, 6]), int(free[1, 5])]):
        for least in (0, 4):  # EOS barred before 4 new tokens: row 0 goes on
            kwargs = dict(max_new_tokens=12, eos_token_id=eos, pad_token_id=63)
            expected = _generate(model, ids, min_new_tokens=least, **kwargs)
            got = _generate(lazy, ids, min_new_tokens=least, **kwargs)
            assert torch.equal(got, expected)
            outs.append(expected)
    assert outs[2].shape[1] < 16  # both rows ended early
    assert not torch.equal(outs[0][0, :7], outs[1][0, :7])


def test_left_padded_prompts_and_other_decoders_equal_eager():
    model, lazy, calls = _pair()
    ids = torch.randint(1, 64, (3, 6), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[0, :2] = mask[2, :4] = 0
    ids[mask == 0] = 0
    for cache in ("static", None):
        kwargs = dict(max_new_tokens=9, min_new_tokens=9, cache_implementation=cache)
        expected = _generate(model, ids, attention_mask=mask, **kwargs)
        got = _generate(lazy, ids, attention_mask=mask.to("lazy"), **kwargs)
        assert torch.equal(got, expected)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_key_value_heads=2, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()
    lazy = transformers.LlamaForCausalLM(config).eval().to("lazy")
    lazy.load_state_dict(llama.state_dict())
    calls = _Calls(lazy)
    ids = torch.randint(2, 128, (2, 7), generator=torch.Generator().manual_seed(9))
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, pad_token_id=1)
    assert torch.equal(_generate(lazy, ids, **kwargs), _generate(llama, ids, **kwargs))
    assert calls.n == 2


def test_sampling_follows_transformers_warpers_and_the_seed():
    _, lazy, calls = _pair()
    ids = torch.tensor([[3, 4, 5], [6, 7, 8]])
    greedy = _generate(lazy, ids, max_new_tokens=8, min_new_tokens=8)
    flat = dict(do_sample=True, temperature=50.0, max_new_tokens=8, min_new_tokens=8)
    for narrow in (dict(top_k=1), dict(top_k=0, top_p=1e-6), dict(top_k=0, min_p=0.999)):
        assert torch.equal(_generate(lazy, ids, **flat, **narrow), greedy), narrow
    draws = []
    for seed, narrow in ((7, {}), (7, {}), (8, {}), (7, dict(typical_p=0.9, epsilon_cutoff=1e-4))):
        torch.manual_seed(seed)
        calls.n = 0
        draws.append(_generate(lazy, ids, **flat, top_k=0, **narrow))
        assert calls.n == 2
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert not torch.equal(draws[0], draws[3])  # the same draws, other warpers
    assert not torch.equal(draws[0], greedy) and int(draws[0].max()) < 64


class _Forbid(transformers.LogitsProcessor):
    def __call__(self, input_ids, scores):
        return scores.index_fill(1, input_ids[:, -1], float("-inf"))  # never the last token


class _TopK(transformers.TopKLogitsWarper):  # a subclass may do anything: not ruled
    pass


def test_what_has_no_in_graph_rule_runs_transformers_loop_with_one_warning(monkeypatch):
    model, lazy, calls = _pair()
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(3))
    plain = dict(max_new_tokens=6, min_new_tokens=6)
    cases = [
        (dict(logits_processor=[_Forbid()]), "logits processor _Forbid"),
        (dict(logits_processor=[_TopK(3)], do_sample=False), "logits processor _TopK"),
        (dict(streamer=_Quiet()), "streams tokens"),
        (dict(max_time=60.0), "stopping criterion MaxTimeCriteria"),
        (dict(cache=transformers.DynamicCache), "was given a cache"),
    ]
    for extra, reason in cases:
        if extra.get("cache") is transformers.DynamicCache:
            expected = _generate(model, ids, cache=transformers.DynamicCache(), **plain)
            extra = dict(cache=transformers.DynamicCache())
        else:
            expected = _generate(model, ids, **plain, **extra)
        calls.n = 0
        with pytest.warns(UserWarning, match=f"runs its Python loop.*{reason}") as caught:
            got = _generate(lazy, ids, **plain, **extra)
        assert {w.filename for w in caught if "Python loop" in str(w.message)} == {__file__}
        assert torch.equal(got, expected), reason
        assert calls.n == 6, reason  # a forward a token
    with torch.no_grad(), pytest.warns(UserWarning, match="return_dict_in_generate"):
        out = lazy.generate(ids.to("lazy"), return_dict_in_generate=True, **plain)
    assert torch.equal(out.sequences.cpu(), _generate(model, ids, **plain))
    monkeypatch.setattr(runtime.config, "HF_GENERATE", False)  # LAZY_HF_GENERATE=0
    calls.n = 0
    assert torch.equal(_generate(lazy, ids, **plain), _generate(model, ids, **plain))
    assert calls.n == 6


class _Reads(transformers.GPT2LMHeadModel):  # asks the device for a value in its forward
    def forward(self, input_ids=None, **kwargs):
        if int(input_ids.max()) < 0:  # never: a sync, which a loop body cannot run
            raise AssertionError
        return super().forward(input_ids=input_ids, **kwargs)


def test_a_model_that_syncs_in_its_forward_runs_transformers_loop():
    def make() -> _Reads:
        torch.manual_seed(0)
        return _Reads(tiny_gpt2().config).eval()

    model, lazy, calls = _pair(make)
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(4))
    plain = dict(max_new_tokens=6, min_new_tokens=6)
    with pytest.warns(UserWarning, match="syncs inside a loop body"):
        got = _generate(lazy, ids, **plain)
    assert torch.equal(got, _generate(model, ids, **plain))
    assert calls.n == 2 + 6  # the prefill and the failed trace, then transformers' loop


class _Quiet(BaseStreamer):
    def put(self, value) -> None:
        pass

    def end(self) -> None:
        pass
