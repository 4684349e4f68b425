"""What a call of a lazy_torch.compile'd module leaves besides its result (side_effects.py):
tensors it stores on its submodules are set again by every replay, with their gradients; tensors
it keeps anywhere else, and plain attributes it changes, make it run op by op with a warning.
Every case is checked against eager CPU over several calls."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import lazy_torch
from tests.lazy_torch.compiling import assert_same, call_nodes, compile_warnings, counter

STEPS = 4


class Router(nn.Module):
    """Stores what it computed, as mixture-of-experts routers and debugging hooks do."""

    def __init__(self, store: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.store = store
        self.register_buffer("ema", torch.zeros(3))
        self.history: list = []
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        probs = y.softmax(-1)
        if self.store == "detached":
            self.last = probs.detach().mean(0)
        elif self.store == "aux_loss":  # differentiable: the training loss adds it
            self.aux_loss = probs.mean(0).square().sum()
        elif self.store == "output":
            self.last = y  # the very tensor it returns
        elif self.store == "buffer":  # a buffer assigned (not updated in place)
            self.ema = 0.5 * self.ema + probs.detach().mean(0)
        elif self.store == "view_of_output":
            self.last = y[0]
        elif self.store == "list":
            self.history.append(probs.detach())
        elif self.store == "counter":
            self.calls += 1
        return y


class Outer(nn.Module):
    def __init__(self, store: str) -> None:
        super().__init__()
        self.router = Router(store)
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.router(x).relu())


def _model(store: str) -> nn.Module:
    """The router alone where what it stores relates to what it returns, else inside a model."""
    return Router(store) if store in ("output", "view_of_output") else Outer(store)


def _run(model: nn.Module, device: str, store: str, compiled: bool) -> dict:
    torch.manual_seed(0)
    model = copy.deepcopy(model).to(device)
    router = getattr(model, "router", model)
    if compiled:
        lazy_torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run: dict = {"losses": [], "stored": [], "calls": []}
    g = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(5, 4, generator=g).to(device)
        opt.zero_grad()
        loss = model(x).square().mean()
        if store == "aux_loss":
            loss = loss + router.aux_loss
        loss.backward()
        if device != "cpu":
            run["calls"].append(call_nodes(loss))
        opt.step()
        if device != "cpu":
            lazy_torch.mark_step()
        stored = getattr(router, "last", None)
        if store == "buffer":
            stored = router.ema
        elif store == "aux_loss":
            stored = router.aux_loss
        run["stored"].append(None if stored is None else stored.detach().cpu())
        run["losses"].append(loss.detach().cpu())
    run["state"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    run["history"] = [t.cpu() for t in router.history]
    run["counted"] = router.calls
    return run


def _assert_runs_equal(got: dict, expected: dict) -> None:
    assert_same(torch.stack(got["losses"]), torch.stack(expected["losses"]))
    for a, b in zip(got["stored"], expected["stored"], strict=True):
        assert (a is None) == (b is None)
        if b is not None:
            assert_same(a, b)
    for name, value in expected["state"].items():
        assert_same(got["state"][name], value, msg=name)
    assert len(got["history"]) == len(expected["history"])
    for a, b in zip(got["history"], expected["history"]):
        assert_same(a, b)
    assert got["counted"] == expected["counted"]


@pytest.mark.parametrize("store", ["detached", "aux_loss", "output", "buffer"])
def test_tensors_stored_on_submodules_are_set_by_every_replay(store, recwarn):
    model = _model(store)
    before = counter("captures")
    got = _run(model, "lazy", store, compiled=True)
    assert compile_warnings(recwarn.list) == []
    assert counter("captures") - before <= (STEPS if store == "buffer" else 1)
    if store != "buffer":  # a reassigned buffer is a new tensor: the next call captures again
        assert got["calls"][1:] == [1] * (STEPS - 1), got["calls"]  # the forward node
    _assert_runs_equal(got, _run(model, "cpu", store, compiled=False))


@pytest.mark.parametrize(
    ("store", "why"),
    [
        ("list", r"keeps a tensor it made where its result does not hold it"),
        ("counter", r"changes the attribute Router\.calls"),
        ("view_of_output", r"stores as Router\.last a tensor sharing memory with its result"),
    ],
)
def test_effects_a_replay_cannot_redo_run_op_by_op(store, why):
    model = _model(store)
    with pytest.warns(UserWarning, match=why):
        got = _run(model, "lazy", store, compiled=True)
    assert got["calls"] == [0] * STEPS
    _assert_runs_equal(got, _run(model, "cpu", store, compiled=False))


def test_a_compiled_function_that_keeps_a_tensor_runs_op_by_op():
    kept: list = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        kept.append(y + 1)
        return y

    compiled = lazy_torch.compile(fn)
    with pytest.warns(UserWarning, match=r"keeps a tensor it made"):
        compiled(torch.full((2,), 0.0, device="lazy"))
    for k in (1, 2):
        compiled(torch.full((2,), float(k), device="lazy"))
    assert [t.cpu().tolist() for t in kept] == [[1.0, 1.0], [3.0, 3.0], [5.0, 5.0]]


@pytest.mark.parametrize("use", ["operand", "counter"])
def test_host_tensors_that_existed_before_the_call_run_it_op_by_op(use):
    scale = torch.tensor(2.0)  # a CPU tensor the call reads, changed between calls
    count = torch.zeros(())

    def fn(x):
        if use == "counter":
            count.add_(1)
            return x + 1
        return x * scale

    compiled = lazy_torch.compile(fn)
    with pytest.warns(UserWarning, match=r"a cpu tensor of shape \(\) that existed before it"):
        compiled(torch.ones(2, device="lazy"))
    for k in range(3):
        scale.fill_(float(k))
        got = compiled(torch.ones(2, device="lazy")).cpu()
        assert got.tolist() == ([2.0, 2.0] if use == "counter" else [float(k)] * 2)
    assert count.item() == (4 if use == "counter" else 0)


def test_host_tensors_made_by_the_call_stay_in_the_capture(recwarn):
    def fn(x):
        offsets = torch.tensor([1.0, 2.0]) * 3  # made on the CPU at every call, the same
        return x + offsets.to(x.device)

    compiled = lazy_torch.compile(fn)
    for k in range(3):
        got = compiled(torch.full((2,), float(k), device="lazy"))
        assert call_nodes(got) == 1
        assert got.cpu().tolist() == [k + 3.0, k + 6.0]
    assert compile_warnings(recwarn.list) == []
