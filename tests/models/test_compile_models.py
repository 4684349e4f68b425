"""GPT-2, BERT and ViT (transformers, tiny configs) train for 10 steps under lazy_torch.compile
as on eager CPU and as on the uncompiled lazy path: one forward and one backward call node a
step, one capture, nothing compiled after the warm-up steps."""

from __future__ import annotations

import copy

import pytest
import torch

import lazy_torch
from tests.lazy_torch.compiling import (
    call_nodes,
    compile_warnings,
    counter,
    finish_run,
    record_step,
)
from tests.models import test_language_models, test_t5_and_vision
from tests.models.common import RTOL, to_device

transformers = pytest.importorskip("transformers")

STEPS = 10


def train(model, batches, loss_fn, device: str, compiled: bool = False) -> dict:
    """AdamW steps as tests/models/common.train takes them, optionally compiled; per step the
    captures so far, the step's compiles and its graph's call nodes."""
    torch.manual_seed(0)
    model = copy.deepcopy(model).to(device)
    model.train()
    if compiled:
        lazy_torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-6)
    lazy = device != "cpu"
    lazy_torch.metrics.reset()
    run = {"losses": [], "captures": [], "compiles": [], "calls": []}
    for batch in batches:
        before = counter("compiles")
        opt.zero_grad()
        loss = loss_fn(model, to_device(batch, device))
        loss.backward()
        if lazy:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            run["calls"].append(call_nodes(*grads))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if lazy:
            lazy_torch.mark_step()
        record_step(run, loss, before)
    finish_run(run, model)
    run["fallbacks"] = [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]
    return run


def _close(got: dict, expected: dict, rtol: float, atol: float) -> None:
    torch.testing.assert_close(got["losses"], expected["losses"], rtol=rtol, atol=atol)
    assert got["state"].keys() == expected["state"].keys()
    for name, value in expected["state"].items():
        torch.testing.assert_close(got["state"][name], value, rtol=rtol, atol=atol, msg=name)


BUILDERS = {
    "gpt2": (test_language_models, test_language_models.gpt2),
    "bert": (test_language_models, test_language_models.bert),
    "vit": (test_t5_and_vision, test_t5_and_vision.vit),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILDERS)
def test_trains_like_eager_under_compile(name, monkeypatch, recwarn):
    module, build = BUILDERS[name]
    monkeypatch.setattr(module, "STEPS", STEPS)
    model, batches, loss_fn = build()
    assert len(batches) == STEPS
    compiled = train(model, batches, loss_fn, "lazy", compiled=True)
    assert compile_warnings(recwarn.list) == []
    lazy = train(model, batches, loss_fn, "lazy")
    eager = train(model, batches, loss_fn, "cpu")
    _close(compiled, eager, rtol=RTOL, atol=1e-5)
    _close(compiled, lazy, rtol=1e-5, atol=1e-6)
    assert compiled["captures"] == [1] * STEPS, compiled["captures"]
    assert compiled["calls"] == [2] * STEPS, compiled["calls"]  # the capture's result is a replay's
    assert compiled["compiles"][2:] == [0] * (STEPS - 2), compiled["compiles"]
    assert compiled["fallbacks"] == [], compiled["fallbacks"]


def _padded(batches: list, step: int) -> torch.Tensor:
    """An attention mask for a batch like ``batches[0]``'s inputs: a full one every third step
    (transformers may then skip the mask), else rows padded by 0 to 5 positions at the end."""
    ids = batches[0] if isinstance(batches[0], torch.Tensor) else batches[0][0]
    mask = torch.ones(ids.shape, dtype=torch.long)
    if step % 3:
        for row in range(ids.shape[0]):
            pad = (step + 2 * row) % 6
            if pad:
                mask[row, -pad:] = 0
    return mask


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_attention_masks_stay_captured(name, monkeypatch, recwarn):
    """A model given an attention mask is captured: transformers' check whether the mask may be
    skipped (``mask.all()``, a sync on an argument) makes the first call run op by op, and the
    second is captured in a compile session, where transformers builds the mask instead, as
    under torch.compile; padded and full masks then give eager's losses."""
    module, build = BUILDERS[name]
    monkeypatch.setattr(module, "STEPS", STEPS)
    model, batches, _ = build()
    batches = [(b, _padded([b], k)) for k, b in enumerate(batches)]

    def masked_loss(m, b):
        inputs, mask = b
        if name == "gpt2":
            return m(
                input_ids=inputs, attention_mask=mask, labels=inputs.masked_fill(mask == 0, -100)
            ).loss
        return m(input_ids=inputs[0], attention_mask=mask, labels=inputs[1]).loss

    compiled = train(model, batches, masked_loss, "lazy", compiled=True)
    assert compile_warnings(recwarn.list) == []
    eager = train(model, batches, masked_loss, "cpu")
    _close(compiled, eager, rtol=RTOL, atol=1e-5)
    assert compiled["captures"] == [1] + [2] * (STEPS - 1), compiled["captures"]
    assert compiled["calls"] == [0] + [2] * (STEPS - 1), compiled["calls"]


def test_a_returned_cache_holds_each_calls_keys_and_values():
    """GPT-2 returns its key/value cache (a DynamicCache, no pytree node): every replay rebuilds
    it around its own outputs instead of returning the first call's."""
    config = transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config).eval()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    before = counter("captures")
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(0, 128, (2, 8), generator=g)
        with torch.no_grad():
            got, expected = model(input_ids=ids.to("lazy")), eager(input_ids=ids)
        torch.testing.assert_close(got.logits.cpu(), expected.logits, rtol=RTOL, atol=1e-5)
        assert type(got.past_key_values) is type(expected.past_key_values)
        for a, b in zip(got.past_key_values.layers, expected.past_key_values.layers, strict=True):
            torch.testing.assert_close(a.keys.cpu(), b.keys, rtol=RTOL, atol=1e-5)
            torch.testing.assert_close(a.values.cpu(), b.values, rtol=RTOL, atol=1e-5)
    assert counter("captures") - before == 1


def train_steps(model, batches, loss_fn, device: str, compiled: bool) -> dict:
    """The steps of ``train`` as one function (zero_grad, forward, backward, clip_grad_norm_,
    AdamW) under lazy_torch.compile if ``compiled``, with a scheduler stepped outside."""
    torch.manual_seed(0)
    model = copy.deepcopy(model).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1 / (k + 1))

    def step(batch):
        opt.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    run_step = lazy_torch.compile(step) if compiled else step
    lazy_torch.metrics.reset()
    run = {"losses": [], "captures": [], "compiles": []}
    for batch in batches:
        before = counter("compiles")
        loss = run_step(to_device(batch, device))
        sched.step()
        if device != "cpu":
            lazy_torch.mark_step()
        record_step(run, loss, before)
    return finish_run(run, model)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUILDERS)
def test_whole_training_steps_train_like_eager(name, monkeypatch, recwarn):
    """The whole step replays as one node from its second call on (the first makes AdamW's
    state), its learning rate changing at every step, as eager trains."""
    module, build = BUILDERS[name]
    monkeypatch.setattr(module, "STEPS", STEPS)
    model, batches, loss_fn = build()
    compiled = train_steps(model, batches, loss_fn, "lazy", compiled=True)
    assert compile_warnings(recwarn.list) == []
    eager = train_steps(model, batches, loss_fn, "cpu", compiled=False)
    _close(compiled, eager, rtol=RTOL, atol=1e-5)
    assert compiled["captures"] == [1] + [2] * (STEPS - 1), compiled["captures"]
    assert compiled["compiles"][3:] == [0] * (STEPS - 3), compiled["compiles"]
