"""A whole training step under lazy_torch.compile (step_state.py): ``zero_grad``, forward, loss,
``backward`` and ``opt.step()`` replayed as one node. Learning rates from a scheduler, Adam's
step counts and bias corrections, gradients and optimizer state must come out as eager CPU's,
step by step; what a replay cannot redo runs op by op with one warning."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import lazy_torch
from tests.lazy_torch.compiling import assert_same, compile_warnings, counter
from tests.lazy_torch.models import SmallCNN, data

STEPS = 5


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)) for _ in range(n)]


OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.05),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1),
    "adam-fused": lambda ps: torch.optim.Adam(ps, lr=0.05, fused=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "two-groups": lambda ps: torch.optim.AdamW(
        [{"params": ps[:2], "lr": 0.01}, {"params": ps[2:]}], lr=0.05
    ),
}


def _train(device: str, make_opt, zero: str, compiled: bool, n: int = STEPS) -> dict:
    """``n`` steps of a step function on ``device`` (under lazy_torch.compile if ``compiled``),
    with a scheduler stepped outside; losses, parameters, gradients and optimizer state."""
    model = _model().to(device)
    opt = make_opt(list(model.parameters()))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)

    def step(x, y):
        if zero == "first":
            opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if zero == "last":
            opt.zero_grad(set_to_none=False)
        return loss.detach()

    run = lazy_torch.compile(step) if compiled else step
    losses, captures = [], []
    for x, y in _batches(n):
        losses.append(run(x.to(device), y.to(device)).cpu())
        sched.step()
        if device == "lazy":
            lazy_torch.mark_step()
            captures.append(counter("captures"))
    return {
        "losses": torch.stack(losses),
        "params": [p.detach().cpu() for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.cpu() for p in model.parameters()],
        "state": [
            {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
            for p in model.parameters()
        ],
        "captures": captures,
    }


def _assert_same_run(got: dict, expected: dict) -> None:
    assert_same(got["losses"], expected["losses"])
    for a, b in zip(got["params"], expected["params"]):
        assert_same(a, b)
    for a, b in zip(got["grads"], expected["grads"]):
        assert (a is None) == (b is None)
        if a is not None:
            assert_same(a, b)
    for a, b in zip(got["state"], expected["state"]):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k], msg=k)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("zero", ["first", "last"])
def test_a_step_function_replays_as_eager(name, zero):
    expected = _train("cpu", OPTIMIZERS[name], zero, False)
    before = counter("captures")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = _train("lazy", OPTIMIZERS[name], zero, True)
    assert compile_warnings(record) == []
    _assert_same_run(got, expected)
    # The first step makes the optimizer state, so the second is the one captured; then only
    # replays, though the learning rate and Adam's bias correction change at every step.
    assert [c - before for c in got["captures"]] == [1, 2, 2, 2, 2]


def test_replays_record_one_node_and_set_each_steps_gradients():
    model = _model().to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)

    @lazy_torch.compile
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    grads = []
    for x, y in _batches(4):
        loss = step(x.to("lazy"), y.to("lazy"))
        grads.append([p.grad for p in model.parameters()])
        text = lazy_torch.debug.ir_text(loss, *model.parameters(), *grads[-1])
        lazy_torch.mark_step()
    assert text.count(" lazy.call(") == 1 and " fused_adam(" not in text
    assert not loss.requires_grad  # the step ran its own backward: no history to go through
    assert all(a is not b for a, b in zip(grads[-1], grads[-2]))  # new tensors, as eager's


def test_gradient_accumulation_in_a_compiled_forward_and_backward():
    """Gradients that exist before the call are read and accumulated into, in place."""
    runs = {}
    for device in ("cpu", "lazy"):
        model = _model().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def forward_backward(x, y):
            loss = nn.functional.mse_loss(model(x), y) / 2
            loss.backward()
            return loss.detach()

        run = lazy_torch.compile(forward_backward) if device == "lazy" else forward_backward
        losses = []
        for k, (x, y) in enumerate(_batches(8)):
            losses.append(run(x.to(device), y.to(device)).cpu())
            if k % 2:
                opt.step()
                opt.zero_grad()
            if device == "lazy":
                lazy_torch.mark_step()
        runs[device] = (torch.stack(losses), [p.detach().cpu() for p in model.parameters()])
    assert_same(runs["lazy"][0], runs["cpu"][0])
    for a, b in zip(runs["lazy"][1], runs["cpu"][1]):
        assert_same(a, b)


def test_a_loaded_optimizer_state_is_read_by_the_next_replay():
    """``load_state_dict`` swaps the moments and step counts for new tensors: a replay reads
    them where the optimizer keeps them, never the captured ones (which would train on from
    stale state)."""
    runs = {}
    for device in ("cpu", "lazy"):
        model = _model().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.05)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        run = lazy_torch.compile(step) if device == "lazy" else step
        losses = []
        for k, (x, y) in enumerate(_batches(7)):
            if k == 2:
                saved = copy.deepcopy(opt.state_dict())
            if k == 5:  # back to the state after two steps
                opt.load_state_dict(saved)
            losses.append(run(x.to(device), y.to(device)).cpu())
            if device == "lazy":
                lazy_torch.mark_step()
        runs[device] = (torch.stack(losses), [p.detach().cpu() for p in model.parameters()])
        runs[device] += ([opt.state[p]["step"].item() for p in model.parameters()],)
    assert_same(runs["lazy"][0], runs["cpu"][0])
    for a, b in zip(runs["lazy"][1], runs["cpu"][1]):
        assert_same(a, b)
    assert runs["lazy"][2] == runs["cpu"][2] == [4.0] * 4


def test_gradients_cleared_outside_recapture_once():
    """Whether a parameter has a gradient before the call decides what its backward does
    (accumulate or set): a replay checks it."""
    runs = {}
    for device in ("cpu", "lazy"):
        model = _model().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

        def step(x, y):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        run = lazy_torch.compile(step) if device == "lazy" else step
        losses = []
        for k, (x, y) in enumerate(_batches(7)):
            losses.append(run(x.to(device), y.to(device)).cpu())
            if k in (2, 4):
                opt.zero_grad()  # the next call starts without gradients
            if device == "lazy":
                lazy_torch.mark_step()
        runs[device] = (torch.stack(losses), [p.grad.cpu() for p in model.parameters()])
    assert_same(runs["lazy"][0], runs["cpu"][0])
    for a, b in zip(runs["lazy"][1], runs["cpu"][1]):
        assert_same(a, b)


def _refused(make_opt, inside=None, hook=False) -> list[str]:
    """The compile warnings of a step function that cannot be replayed, after checking that
    it still trains as eager does."""
    runs, messages = {}, []
    for device in ("cpu", "lazy"):
        model = _model().to(device)
        opt = make_opt(model.parameters())
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if hook:
            opt.register_step_post_hook(lambda *a: None)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if inside is not None:
                inside(sched)
            return loss.detach()

        run = lazy_torch.compile(step) if device == "lazy" else step
        losses = []
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            for x, y in _batches(4):
                losses.append(run(x.to(device), y.to(device)).cpu())
                if device == "lazy":
                    lazy_torch.mark_step()
        if device == "lazy":
            messages = compile_warnings(record)
        runs[device] = (torch.stack(losses), [p.detach().cpu() for p in model.parameters()])
    assert_same(runs["lazy"][0], runs["cpu"][0])
    for a, b in zip(runs["lazy"][1], runs["cpu"][1]):
        assert_same(a, b)
    return messages


def test_an_optimizer_whose_step_is_not_fused_runs_op_by_op():
    (message,) = _refused(lambda ps: torch.optim.RMSprop(ps, lr=0.01))
    assert "it steps a RMSprop" in message
    (message,) = _refused(lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False))
    assert "does not run as one fused step per param group" in message


def test_a_scheduler_stepped_inside_runs_op_by_op():
    (message,) = _refused(lambda ps: torch.optim.Adam(ps, lr=0.01), inside=lambda s: s.step())
    assert "changes its Adam's param groups" in message


def test_an_optimizer_with_step_hooks_runs_op_by_op():
    (message,) = _refused(lambda ps: torch.optim.SGD(ps, lr=0.1), hook=True)
    assert "step hooks" in message


def test_a_cnn_with_batch_norm_trains_as_eager_in_train_and_eval():
    """Running statistics (buffers the step writes) are written back by every replay; eval()
    changes a guard of the model's own call inside the step and recaptures."""
    runs = {}
    for device in ("cpu", "lazy"):
        torch.manual_seed(0)
        model = SmallCNN().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        run = lazy_torch.compile(step) if device == "lazy" else step
        losses = []
        for k, (x, y) in enumerate(data("cnn", 6, batch=4)):
            model.train(k != 4)  # one step with the statistics frozen
            losses.append(run(x.to(device), y.to(device)).cpu())
            if device == "lazy":
                lazy_torch.mark_step()
        runs[device] = (torch.stack(losses), {k: v.cpu() for k, v in model.state_dict().items()})
    assert_same(runs["lazy"][0], runs["cpu"][0], rtol=1e-4, atol=1e-5)
    for name, value in runs["cpu"][1].items():
        assert_same(runs["lazy"][1][name], value, rtol=1e-4, atol=1e-5, msg=name)
