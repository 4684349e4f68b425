"""lazy_torch.compile (lazy_torch/capture.py) against eager CPU and the uncompiled lazy path:
training, guards and recaptures, syncs inside a captured call, dropout's random draws, and
regions that differ only in a constant. tests/lazy_torch/test_compile_features.py has the rest."""

from __future__ import annotations

import copy
import functools
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
import runtime.config
import runtime.executor
import runtime.program
from tests.lazy_torch import compiling
from tests.lazy_torch.compiling import (
    DropoutCNN,
    Net,
    assert_same,
    call_nodes,
    compile_warnings,
    counter,
    finish_run,
    record_step,
)
from tests.lazy_torch.models import SmallCNN, data, make_optimizer, mlp

STEPS = 10
here = functools.partial(compiling.here, __file__)


# ----------------------------------------------------------------------------------------------
# Training for 10 steps: eager, the uncompiled lazy path and lazy_torch.compile.


def train(model, batches, optimizer: str, device: str, compiled: bool = False) -> dict:
    """Train a copy of ``model``: losses, final state (CPU), and per step the captures so far,
    the compiles of that step and the call nodes its graph has."""
    torch.manual_seed(0)  # seeds the lazy device's RNG too
    model = copy.deepcopy(model).to(device)
    if compiled:
        assert lazy_torch.compile(model) is model
    opt, sched = make_optimizer(optimizer, model.parameters())
    lazy = device != "cpu"
    lazy_torch.metrics.reset()
    run = {"losses": [], "captures": [], "compiles": [], "calls": []}
    for x, y in batches:
        before = counter("compiles")
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        if lazy:
            run["calls"].append(call_nodes(*(p.grad for p in model.parameters())))
        opt.step()
        sched.step()
        if lazy:
            lazy_torch.mark_step()
        record_step(run, loss, before)
    finish_run(run, model)
    run["recaptures"] = counter("recaptures")
    return run


def assert_runs_match(got: dict, expected: dict, rtol: float, atol: float) -> None:
    assert_same(got["losses"], expected["losses"], rtol, atol, "losses")
    assert got["state"].keys() == expected["state"].keys()
    for name, value in expected["state"].items():
        assert got["state"][name].dtype == value.dtype, name
        assert_same(got["state"][name], value, rtol, atol, name)


def assert_replayed(run: dict) -> None:
    """One capture, at the first step; every step, the first too (its result is a replay's), is
    one forward and one backward call node, and nothing compiles after the two warm-up steps
    (the optimizer state appears)."""
    assert run["captures"] == [1] * STEPS, run["captures"]
    assert run["recaptures"] == 0
    assert run["calls"] == [2] * STEPS, run["calls"]
    assert run["compiles"][2:] == [0] * (STEPS - 2), run["compiles"]


@pytest.mark.parametrize(
    ("kind", "optimizer"),
    [
        ("mlp", "sgd"),
        ("mlp", "adamw"),
        ("cnn", "adamw"),
        pytest.param("cnn", "sgd", marks=pytest.mark.slow),  # 15 s on a busy 2-core machine
    ],
)
def test_trains_like_eager(kind, optimizer):
    torch.manual_seed(0)
    model = mlp() if kind == "mlp" else SmallCNN()
    batches = data(kind, steps=STEPS, batch=8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        compiled = train(model, batches, optimizer, "lazy", compiled=True)
    assert compile_warnings(record) == []
    eager = train(model, batches, optimizer, "cpu")
    lazy = train(model, batches, optimizer, "lazy")
    assert_runs_match(compiled, eager, rtol=1e-4, atol=1e-5)
    assert_runs_match(compiled, lazy, rtol=1e-5, atol=1e-7)
    assert_replayed(compiled)
    assert lazy["compiles"][2:] == [0] * (STEPS - 2)
    if kind == "cnn":  # running statistics were written back by every replay
        assert compiled["state"]["bn1.num_batches_tracked"].item() == STEPS
        assert not torch.equal(compiled["state"]["bn2.running_var"], torch.ones(16))


@pytest.mark.slow  # 15-20 s on a busy 2-core machine
def test_cnn_with_dropout_trains_like_the_uncompiled_path():
    """Batch norm and dropout: the same seed gives the same masks, so the same losses,
    parameters and running statistics as op by op."""
    torch.manual_seed(0)
    model = DropoutCNN(p=0.25)
    batches = data("cnn", steps=STEPS, batch=8)
    compiled = train(model, batches, "adamw", "lazy", compiled=True)
    lazy = train(model, batches, "adamw", "lazy")
    assert_runs_match(compiled, lazy, rtol=1e-5, atol=1e-7)
    assert_replayed(compiled)
    # Dropout was on: without it (eager, as the lazy path computes it) the losses are others.
    model.drop.p = 0.0
    assert not torch.allclose(train(model, batches, "adamw", "cpu")["losses"], lazy["losses"])


def test_op_by_op_execution_of_a_program_with_call_nodes(monkeypatch):
    """A call site whose graphs keep changing runs them node by node (runtime/interpret.py);
    a call node is one of those nodes. Batch norm's multi-output node feeds the backward: each
    activation the backward reads is one output of the forward node, never a tuple."""
    monkeypatch.setattr(runtime.config, "INTERPRET_AFTER", 1)
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g))] * 3
    compiled = train(model, batches, "sgd", "lazy", compiled=True)
    assert counter("op_compiles") > 0  # it did run op by op
    eager = train(model, batches, "sgd", "cpu")
    assert_runs_match(compiled, eager, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Guards: what recaptures, once, and says why.


class _Precision:
    def __init__(self, value: str) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.saved = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.value)

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.saved)


def _nothing():
    return warnings.catch_warnings()  # a context that changes no guard


# name: (guard named in the recapture, batch, training, context on lazy, context on the CPU)
CONFIGS = {
    "base": (None, 4, True, _nothing, _nothing),
    "batch": ("arguments", 6, True, _nothing, _nothing),
    "eval": ("training", 4, False, _nothing, _nothing),
    "no_grad": ("grad mode", 4, True, torch.no_grad, torch.no_grad),
    "autocast": ("autocast", 4, True, lazy_torch.amp.autocast, None),
    "precision": ("float32 matmul precision", 4, True, lambda: _Precision("high"), None),
}


def test_recaptures_once_per_guard_change_and_says_why(monkeypatch, capsys):
    """Each configuration differs from the base one in one guard; the calls alternate with the
    base one, so every new configuration recaptures once, naming that guard and the line, and
    every configuration seen before (the second round: all of them) replays."""
    torch.manual_seed(0)
    net = Net()
    eager = copy.deepcopy(net)
    plain = copy.deepcopy(net).to("lazy")
    model = lazy_torch.compile(copy.deepcopy(net).to("lazy"))
    inputs = {b: torch.randn(b, 6) for b in (4, 6)}
    monkeypatch.setattr(runtime.config, "DEBUG", True)
    site = here("CALL" + "SITE")
    order = [name for other in CONFIGS if other != "base" for name in ("base", other)]
    seen = set()
    for name in order * 2:
        guard, batch, training, context, cpu_context = CONFIGS[name]
        for m in (eager, plain, model):
            m.train(training)
        x = inputs[batch]
        captures, recaptures = counter("captures"), counter("recaptures")
        with context():
            got = model(x.to("lazy"))  # CALLSITE
            replayed = call_nodes(got)
            expected = plain(x.to("lazy"))
        if cpu_context is not None:
            with cpu_context():
                assert_same(got, eager(x), rtol=1e-4, atol=1e-5, msg=name)
        else:  # eager CPU has no such mode: its running statistics follow the lazy ones
            eager.load_state_dict({k: v.cpu() for k, v in plain.state_dict().items()})
        assert_same(got, expected, msg=name)
        assert replayed == 1, name  # a capture's result is its replay's
        if name in seen:
            assert counter("captures") == captures, name
        else:
            seen.add(name)
            assert counter("captures") == captures + 1, name
            if guard is not None:  # one recapture, naming the guard and the line
                assert counter("recaptures") == recaptures + 1, name
                assert f"{site} ({guard} changed)" in lazy_torch.metrics.sites()["recaptures"]
                assert f"captured again at {site}: {guard} changed\n" in capsys.readouterr().out
        lazy_torch.mark_step()
    assert counter("captures") == len(CONFIGS)
    assert counter("recaptures") == len(CONFIGS) - 1
    for (name, param), (_, value) in zip(model.state_dict().items(), eager.state_dict().items()):
        assert_same(param, value, rtol=1e-4, atol=1e-5, msg=name)


def test_a_recapture_names_every_guard_that_changed():
    model = lazy_torch.compile(Net().to("lazy"))
    model(torch.randn(4, 6).to("lazy"))
    model.eval()
    with torch.no_grad():
        model(torch.randn(5, 6).to("lazy"))
    (where,) = lazy_torch.metrics.sites()["recaptures"]
    assert where.endswith("(arguments, grad mode, training changed)"), where


def test_report_names_the_guard_that_changed():
    model = lazy_torch.compile(Net().to("lazy"))
    model(torch.randn(4, 6).to("lazy"))
    model.eval()
    model(torch.randn(4, 6).to("lazy"))
    assert "training changed" in lazy_torch.metrics.report()


def test_changing_a_submodule_attribute_recaptures():
    torch.manual_seed(0)
    model = lazy_torch.compile(DropNet().to("lazy"))
    x = torch.ones(64, 8).to("lazy")
    model(x)
    model.drop.p = 0.0
    got = model(x)
    assert lazy_torch.metrics.sites()["recaptures"]
    assert list(lazy_torch.metrics.sites()["recaptures"])[-1].endswith("(attributes changed)")
    model.eval()  # dropout off: the same computation, captured anew
    assert_same(got, model(x))
    model.train()
    model.drop.p = 0  # an int: another guard (type-exact), the same values
    assert_same(model(x), got)
    assert counter("captures") == 4


def test_module_guards_see_each_change():
    from lazy_torch.tensor import extension

    model = lazy_torch.compile(DropNet().to("lazy"))
    model(torch.ones(64, 8).to("lazy"))
    compiled = model.__dict__["_lazy_compiled"]

    def read() -> tuple:
        guarded = compiled.guarded
        return extension.module_guards(guarded.tensor_dicts, guarded.modules, guarded.attributes)

    seen = [read()]
    changes = [
        lambda: model.drop.eval(),  # one submodule only
        lambda: model.drop.train(),
        lambda: setattr(model.drop, "p", -0.0),  # 0.0 before
        lambda: setattr(model.drop, "p", float("nan")),
        lambda: next(model.parameters()).requires_grad_(False),
        lambda: setattr(next(model.parameters()), "data", torch.zeros(3).to("lazy")),
    ]
    model.drop.p = 0.0
    seen = [read()]
    for change in changes:
        change()
        seen.append(read())
    assert seen[2] == seen[0]  # train() again
    assert len({seen[k] for k in (0, 1, 3, 4, 5, 6)}) == 6
    assert read() == seen[-1]  # a nan equals itself


def test_learning_rate_and_optimizer_state_never_recapture():
    """A scheduler moving the learning rate and AdamW's bias corrections are graph scalars."""
    torch.manual_seed(0)
    model = lazy_torch.compile(Net().to("lazy"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    x = torch.randn(4, 6)
    compiles = []
    for _ in range(6):
        before = counter("compiles")
        model(x.to("lazy")).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        lazy_torch.mark_step()
        compiles.append(counter("compiles") - before)
    assert counter("captures") == 1 and counter("recaptures") == 0
    assert compiles[2:] == [0] * 4, compiles


# ----------------------------------------------------------------------------------------------
# A call that syncs runs op by op, with one warning naming the cause and the line.


class Syncs(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.lin = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.how == "item":
            return y / (1 + y.abs().max().item())  # SYNC item
        if self.how == "bool":
            return y.relu() if y.sum() > 0 else -y  # SYNC bool
        if self.how == "nonzero":
            return y[y > 0].sum() * y  # SYNC nonzero
        print(y)  # SYNC print
        return y * 2


def _backward_like_eager(got: torch.Tensor, model: nn.Module, eager: nn.Module, x) -> None:
    """``got`` (the compiled model's output for ``x``) and the gradients it gives equal eager's."""
    got.square().sum().backward()
    expected = eager(x)
    expected.square().sum().backward()
    lazy_torch.mark_step()
    assert_same(got, expected, rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("how", "cause"),
    [("item", "item"), ("bool", "item"), ("nonzero", "nonzero"), ("print", "print")],
)
def test_a_call_that_syncs_runs_op_by_op_with_one_warning(how, cause, capsys):
    """The warning names the cause and the line of the sync, and is issued from the user's
    call; every call, the first included, computes eager's values and gradients."""
    torch.manual_seed(0)
    eager = Syncs(how)
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(4):
            x = torch.randn(3, 5) + (step - 1)  # both signs of the sum for "bool"
            got = model(x.to("lazy"))  # SYNCING CALL
            assert call_nodes(got) == 0
            _backward_like_eager(got, model, eager, x)
    (warning,) = [w for w in record if "lazy_torch.compile" in str(w.message)]
    call_site = here("SYNCING" + " CALL")
    assert str(warning.message) == (
        "lazy_torch.compile: Syncs runs op by op, as it is not captured: "
        f"it syncs ({cause}) at {here(f'SYNC {how}')} (called at {call_site})"
    )
    assert f"{warning.filename}:{warning.lineno}" == call_site
    assert counter("captures") == 2  # the second call tried again in a compile session
    capsys.readouterr()


class PackedCheck(nn.Module):
    """Hugging Face's masking checks ``(positions.diff() != 1).any()`` on positions it builds
    with ``arange``: a sync of values made inside the call from nothing that existed before it,
    the same at every call with these guards."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[0], device=x.device)
        if bool((positions.diff() != 1).any()):
            return self.lin(x) * 0
        return self.lin(x) + positions[:, None]


def test_a_sync_of_values_made_inside_the_call_is_captured():
    torch.manual_seed(0)
    eager = PackedCheck()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(4):
            x = torch.randn(3, 5)
            got = model(x.to("lazy"))
            assert call_nodes(got) == 1
            _backward_like_eager(got, model, eager, x)
    assert compile_warnings(record) == []
    assert counter("captures") == 1


# ----------------------------------------------------------------------------------------------
# Dropout draws from the device RNG state: fresh masks, reproducible after a seed.


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)
        self.lin2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.drop(F.relu(self.lin1(x))))


def _dropout_steps(model: nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Outputs and first-layer gradients of ``steps`` steps, one mark_step each."""
    values = []
    for _ in range(steps):
        model.zero_grad()
        y = model(x)
        y.sum().backward()
        lazy_torch.mark_step()
        values += [y.detach().cpu(), model.lin1.weight.grad.cpu()]
    return values


@pytest.mark.parametrize("seed", [lazy_torch.manual_seed, torch.manual_seed])
def test_dropout_masks_are_fresh_every_step_and_repeat_after_a_seed(seed):
    torch.manual_seed(0)
    net = DropNet()
    plain = copy.deepcopy(net).to("lazy")
    model = lazy_torch.compile(copy.deepcopy(net).to("lazy"))
    x = torch.randn(32, 8).to("lazy")
    model(x)  # captured: every call below is a replay
    assert call_nodes(model(x)) == 1
    seed(7)
    first = _dropout_steps(model, x, 3)
    outputs = first[0::2]
    for a, b in itertools.pairwise(outputs):
        assert not torch.equal(a, b)  # a fresh mask every step
    seed(7)
    again = _dropout_steps(model, x, 3)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    seed(7)
    uncompiled = _dropout_steps(plain, x, 3)
    for a, b in zip(first, uncompiled):
        assert_same(a, b)
    assert counter("captures") == 1


def test_two_dropout_calls_in_one_step_draw_different_masks():
    """Two calls in a step, random draws op by op before and after them, from the capture step
    on: the same numbers as the uncompiled path draws."""
    torch.manual_seed(0)
    net = DropNet()
    x = torch.randn(32, 8).to("lazy")
    results = []
    for m in (lazy_torch.compile(copy.deepcopy(net).to("lazy")), copy.deepcopy(net).to("lazy")):
        torch.manual_seed(3)
        values = []
        for _ in range(2):  # the compiled module: a capture (then a replay), then two replays
            before = torch.rand(3, device="lazy")
            a, b = m(x), m(x)
            (a * b).sum().backward()
            after = torch.rand(3, device="lazy")
            lazy_torch.mark_step()
            values += [before, a, b, after, m.lin1.weight.grad]
            m.zero_grad()
        results.append([v.cpu() for v in values])
    got, expected = results
    assert not torch.equal(got[1], got[2]) and not torch.equal(got[6], got[7])
    for a, b in zip(got, expected):
        assert_same(a, b)


# ----------------------------------------------------------------------------------------------
# Many programs in one process: regions that differ only in a constant.


class Scaled(nn.Module):
    """``fn(weight * x)``: a parameter, so the regions have backward nodes too."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.weight = nn.Parameter(torch.linspace(-1.5, 2.0, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.weight * x)


# Python's hash() and == conflate -1/-2, 2/2.0 and True/1; the regions must not.
CONSTANTS = {
    "x * 2": lambda x: x * 2,
    "x * 2.0": lambda x: x * 2.0,
    "x * -1": lambda x: x * -1,
    "x * -2": lambda x: x * -2,
    "x + True": lambda x: x + True,
    "x + 1": lambda x: x + 1,
    "x ** 2": lambda x: x**2,
    "x ** 3": lambda x: x**3,
    "sum(-1)": lambda x: x.view(2, 3).sum(-1),
    "sum(-2)": lambda x: x.view(2, 3).sum(-2),
    "cumsum(0)": lambda x: x.cumsum(0),
    "cumsum(-1)": lambda x: x.cumsum(-1),
    "clamp(min=0)": lambda x: x.clamp(min=0),
    "clamp(min=-0.5)": lambda x: x.clamp(min=-0.5),
    "leaky_relu(0.1)": lambda x: F.leaky_relu(x, 0.1),
    "leaky_relu(0.2)": lambda x: F.leaky_relu(x, 0.2),
}
# For integer and bool arguments these differ in dtype as well as value.
INT_CONSTANTS = {
    "n * 2": lambda n: n * 2,
    "n * 2.0": lambda n: n * 2.0,
    "n * -1": lambda n: n * -1,
    "n * -2": lambda n: n * -2,
    "b + True": lambda n: (n > 0) + True,
    "b + 1": lambda n: (n > 0) + 1,
    "b * True": lambda n: (n > 0) * True,
    "n // -2": lambda n: n // -2,
    "n // -1": lambda n: n // -1,
}


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_regions_that_differ_only_in_a_constant(order, monkeypatch):
    """Registered regions and executables are process-wide: each region, and each step program
    made of them, must be told apart from the others by its constants whatever came first."""
    monkeypatch.setattr(runtime.program, "_calls", {})  # nothing registered before this order
    runtime.executor.drop_cache()
    names = list(CONSTANTS) if order == "forward" else list(CONSTANTS)[::-1]
    int_names = list(INT_CONSTANTS) if order == "forward" else list(INT_CONSTANTS)[::-1]
    models = {n: lazy_torch.compile(Scaled(CONSTANTS[n]).to("lazy")) for n in names}
    functions = {n: lazy_torch.compile(INT_CONSTANTS[n]) for n in int_names}
    x = torch.tensor([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0])
    n = torch.tensor([-3, -2, -1, 0, 1, 5])
    eager = Scaled(None)
    for step in range(3):  # a capture, then replays; in one program with all the others
        results = {}
        for name in names:
            model = models[name]
            y = model(x.to("lazy"))
            y.sum().backward()
            results[name] = (y, model.weight.grad)
            model.weight.grad = None
        for name in int_names:
            results[name] = (functions[name](n.to("lazy")),)
        if step:
            assert call_nodes(*(v for r in results.values() for v in r)) == 2 * len(names) + len(
                int_names
            )
        lazy_torch.mark_step()
        for name in names:
            eager.fn, eager.weight.grad = CONSTANTS[name], None
            expected = eager(x)
            expected.sum().backward()
            y, grad = results[name]
            assert y.dtype == expected.dtype, name
            assert_same(y, expected, msg=name)
            assert_same(grad, eager.weight.grad, msg=name)
        for name in int_names:
            expected = INT_CONSTANTS[name](n)
            (got,) = results[name]
            assert got.dtype == expected.dtype, name
            assert torch.equal(got.cpu(), expected), name
    assert counter("captures") == len(names) + len(int_names)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_number_arguments_that_compare_equal(order):
    """One compiled function, called with numbers Python's == conflates: each is a guard of its
    own (a capture each), and each replay computes with its own number."""
    compiled = lazy_torch.compile(lambda x, s: (x * s, 1 / (x * s)))
    numbers = [2, 2.0, -1, -2, True, 1, 1.0, 0.0, -0.0]
    if order == "reverse":
        numbers.reverse()
    x = torch.tensor([1.0, -3.0, 0.5])
    for step in range(2):
        for s in numbers:
            got = compiled(x.to("lazy"), s)
            assert call_nodes(*got) == 1, s
            lazy_torch.mark_step()
            for a, b in zip(got, (x * s, 1 / (x * s))):
                assert torch.equal(a.cpu(), b), (s, a, b)
    assert counter("captures") == len(numbers)
