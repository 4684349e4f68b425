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


def _run(
    device: str,
    make_opt,
    *,
    zero: str = "first",
    optimizer_step: bool = True,
    scheduler_inside: bool = False,
    hook: bool = False,
    between=None,
    model_fn=None,
    batches=None,
    loss_fn=nn.functional.mse_loss,
) -> dict:
    """Steps of a step function on ``device``, under lazy_torch.compile on 'lazy', with a
    scheduler stepped after each call (or inside it, ``scheduler_inside``). The function calls
    ``zero_grad()`` first (``zero`` "first"), ``zero_grad(set_to_none=False)`` last ("last") or
    never ("none"), and the optimizer's step unless ``optimizer_step`` is False;
    ``between(k, model, opt)`` runs before call k. Returns the losses, the model's state, its
    gradients, the optimizer's state, the captures counted after each call and the compile
    warnings."""
    torch.manual_seed(0)
    model = (model_fn or _model)().to(device)
    opt = make_opt(list(model.parameters()))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    if hook:
        opt.register_step_post_hook(lambda *a: None)

    def step(x, y):
        if zero == "first":
            opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if optimizer_step:
            opt.step()
        if scheduler_inside:
            sched.step()
        if zero == "last":
            opt.zero_grad(set_to_none=False)
        return loss.detach()

    run = lazy_torch.compile(step) if device == "lazy" else step
    losses, captures = [], []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for k, (x, y) in enumerate(batches or _batches(STEPS)):
            if between is not None:
                between(k, model, opt)
            losses.append(run(x.to(device), y.to(device)).cpu())
            if not scheduler_inside:
                sched.step()
            if device == "lazy":
                lazy_torch.mark_step()
                captures.append(counter("captures"))
    return {
        "losses": torch.stack(losses),
        "state": {k: v.cpu() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.cpu() for p in model.parameters()],
        "optimizer": [
            {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
            for p in model.parameters()
        ],
        "captures": captures,
        "warnings": compile_warnings(record),
    }


def _compare(make_opt, rtol: float = 1e-5, atol: float = 1e-6, **options) -> dict:
    """``_run`` on the CPU and on 'lazy', checked equal; the lazy run."""
    expected = _run("cpu", make_opt, **options)
    before = counter("captures")
    got = _run("lazy", make_opt, **options)
    got["captures"] = [c - before for c in got["captures"]]
    assert_same(got["losses"], expected["losses"], rtol, atol)
    for name, value in expected["state"].items():
        assert_same(got["state"][name], value, rtol, atol, msg=name)
    for a, b in zip(got["grads"], expected["grads"], strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert_same(a, b, rtol, atol)
    for a, b in zip(got["optimizer"], expected["optimizer"], strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k], rtol, atol, msg=k)
    return got


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("zero", ["first", "last"])
def test_a_step_function_replays_as_eager(name, zero):
    got = _compare(OPTIMIZERS[name], zero=zero)
    assert got["warnings"] == []
    # The first step makes the optimizer state, so the second is the one captured; then only
    # replays, though the learning rate and Adam's bias correction change at every step.
    assert got["captures"] == [1, 2, 2, 2, 2]


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
    assert text.count(" lazy.call(") == 1 and " lazy.fused_adam(" not in text
    assert not loss.requires_grad  # the step ran its own backward: no history to go through
    assert all(a is not b for a, b in zip(grads[-1], grads[-2]))  # new tensors, as eager's


def test_gradient_accumulation_in_a_compiled_forward_and_backward():
    """Gradients that exist before the call are read and accumulated into, in place; the
    optimizer steps outside, every second call."""

    def step_every_second(k, model, opt):
        if k and k % 2 == 0:
            opt.step()
            opt.zero_grad()

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    got = _compare(
        sgd, zero="none", optimizer_step=False, between=step_every_second, batches=_batches(8)
    )
    assert got["warnings"] == []


def test_a_loaded_optimizer_state_is_read_by_the_next_replay():
    """``load_state_dict`` swaps the moments and step counts for new tensors: a replay reads
    them where the optimizer keeps them, never the captured ones (which would train on from
    stale state)."""
    saved = {}

    def save_then_load(k, model, opt):
        if k == 2:
            saved["state"] = copy.deepcopy(opt.state_dict())
        if k == 5:  # back to the state after two steps
            opt.load_state_dict(saved["state"])

    adam = lambda ps: torch.optim.Adam(ps, lr=0.05)  # noqa: E731
    got = _compare(adam, between=save_then_load, batches=_batches(7))
    assert [s["step"].item() for s in got["optimizer"]] == [4.0] * 4


def test_gradients_cleared_outside_recapture():
    """Whether a parameter has a gradient before the call decides what its backward does
    (accumulate or set): a replay checks it."""

    def clear(k, model, opt):
        if k in (3, 5):
            opt.zero_grad()

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5)  # noqa: E731
    _compare(sgd, zero="none", between=clear, batches=_batches(7))


@pytest.mark.parametrize(
    "make_opt, options, message",
    [
        (lambda ps: torch.optim.RMSprop(ps, lr=0.01), {}, "it steps a RMSprop"),
        (
            lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=False),
            {},
            "does not run as one fused step per param group",
        ),
        (
            lambda ps: torch.optim.Adam(ps, lr=0.01),
            {"scheduler_inside": True},
            "changes its Adam's param groups",
        ),
        (lambda ps: torch.optim.SGD(ps, lr=0.1), {"hook": True}, "step hooks"),
    ],
    ids=["rmsprop", "foreach-false", "scheduler-inside", "step-hook"],
)
def test_what_a_replay_cannot_redo_runs_op_by_op(make_opt, options, message):
    (warning,) = _compare(make_opt, **options)["warnings"]
    assert message in warning


def test_a_cnn_with_batch_norm_trains_as_eager_in_train_and_eval():
    """Running statistics (buffers the step writes) are written back by every replay; eval()
    changes a guard of the model's own call inside the step and recaptures."""

    def eval_once(k, model, opt):
        model.train(k != 4)  # one step with the statistics frozen

    sgd = lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    cnn = dict(model_fn=SmallCNN, batches=data("cnn", 6, batch=4), between=eval_once)
    _compare(sgd, rtol=1e-4, atol=1e-5, loss_fn=nn.functional.cross_entropy, **cnn)


def test_a_compiled_module_inside_a_compiled_function_guards_its_submodules():
    """A compiled module replays inside the function's capture without calling its submodules,
    and a module captured inside it is watched too: a submodule's eval() alone must recapture
    the function (its replay would keep the training statistics)."""
    results = {}
    for device in ("cpu", "lazy"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to(device)
        inner = lazy_torch.compile(model) if device == "lazy" else model

        def total(x):
            return inner(x).sum()

        run = lazy_torch.compile(total) if device == "lazy" else total
        got = []
        for k, (x, _) in enumerate(_batches(6)):
            model[1].train(k < 3)
            with torch.no_grad():
                got.append(run(x.to(device)).cpu())
            if device == "lazy":
                lazy_torch.mark_step()
        results[device] = torch.stack(got)
    assert_same(results["lazy"], results["cpu"], rtol=1e-4, atol=1e-5)


def test_a_module_attribute_the_call_changes_runs_it_op_by_op():
    """A forward that counts its calls in a plain attribute: a replay would not count."""

    class Counting(nn.Linear):
        def forward(self, x):
            self.calls = getattr(self, "calls", 0) + 1
            return super().forward(x) * self.calls

    results = {}
    for device in ("cpu", "lazy"):
        torch.manual_seed(0)
        model = Counting(4, 2).to(device)
        model.calls = 0

        def total(x):
            return model(x).sum()

        run = lazy_torch.compile(total) if device == "lazy" else total
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = [run(x.to(device)).detach().cpu() for x, _ in _batches(4)]
        results[device] = (torch.stack(got), model.calls, compile_warnings(record))
    assert_same(results["lazy"][0], results["cpu"][0])
    assert results["lazy"][1] == results["cpu"][1] == 4
    (message,) = results["lazy"][2]
    assert "it changes the attribute Counting.calls" in message


def test_a_step_fed_by_a_device_loader_is_captured():
    """The loader's thread uploads the next batches while the step is captured: those storages
    are not the call's (before, the capture took them for tensors the call kept elsewhere and
    ran the step op by op)."""
    batches = _batches(8)
    data = torch.utils.data.TensorDataset(
        torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    )
    expected = _run("cpu", OPTIMIZERS["adamw"], batches=batches)
    before = counter("captures")
    loader = lazy_torch.DeviceLoader(torch.utils.data.DataLoader(data, batch_size=3), "lazy")
    got = _run("lazy", OPTIMIZERS["adamw"], batches=loader)
    assert got["warnings"] == []
    assert [c - before for c in got["captures"]] == [1] + [2] * 7
    assert_same(got["losses"], expected["losses"])
