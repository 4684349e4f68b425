"""lazy_torch.compile (lazy_torch/capture.py) against eager CPU: inference, gradient accumulation,
compiled functions, arguments that alias, in-place writes, pytree outputs, hooks, checkpointing,
two calls in one step, and the module's own API (state_dict, deepcopy, .to())."""

from __future__ import annotations

import copy
import functools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
from tests.lazy_torch import compiling
from tests.lazy_torch.compiling import (
    DropoutCNN,
    Net,
    assert_same,
    call_nodes,
    compile_warnings,
    counter,
)
from tests.lazy_torch.models import data

here = functools.partial(compiling.here, __file__)


# ----------------------------------------------------------------------------------------------
# Inference, gradient accumulation, functions, in-place writes, pytrees, hooks, checkpointing,
# two calls in one step, and the module's own API.


def test_no_grad_inference_in_eval_mode():
    torch.manual_seed(0)
    eager = DropoutCNN(p=0.5).eval()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    batches = data("cnn", steps=4, batch=4)
    for step, (x, _) in enumerate(batches):
        with torch.no_grad():
            got = model(x.to("lazy"))
            assert not got.requires_grad
            assert call_nodes(got) == 1  # a forward node, and no backward
            lazy_torch.mark_step()
            assert_same(got, eager(x), rtol=1e-4, atol=1e-5)
    assert counter("captures") == 1
    for name, value in eager.state_dict().items():  # eval: the statistics stay as they were
        assert_same(model.state_dict()[name], value, msg=name)


def test_gradient_accumulation():
    """Two forward/backward passes per optimizer step: the second backward adds to .grad."""
    torch.manual_seed(0)
    eager = Net()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    runs = {}
    for m, device in ((eager, "cpu"), (model, "lazy")):
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        losses, calls = [], []
        for _ in range(4):
            opt.zero_grad()
            for _ in range(2):
                x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
                loss = F.mse_loss(m(x.to(device)), y.to(device)) / 2
                loss.backward()
                losses.append(loss.detach())
            if device != "cpu":
                calls.append(call_nodes(*(p.grad for p in m.parameters())))
            opt.step()
            if device != "cpu":
                lazy_torch.mark_step()
        runs[device] = (torch.stack([loss.cpu() for loss in losses]), calls)
    assert_same(runs["lazy"][0], runs["cpu"][0], rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert_same(p, q, rtol=1e-4, atol=1e-5, msg=name)
    assert runs["lazy"][1] == [4, 4, 4, 4]  # the capture's result is a replay's too
    assert counter("captures") == 1


def _function(x: torch.Tensor, w: torch.Tensor, *, scale: float) -> tuple[torch.Tensor, ...]:
    h = torch.tanh(x @ w) * scale
    return h.sum(-1), h.softmax(-1)


@pytest.mark.parametrize("grad", [False, True])
def test_compiled_function(grad):
    compiled = lazy_torch.compile(_function)
    assert compiled.__name__ == "_function"
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g)
    lazy_w = w.to("lazy").requires_grad_(grad)
    w.requires_grad_(grad)
    for step in range(3):
        x = torch.randn(5, 4, generator=g)
        got = compiled(x.to("lazy"), lazy_w, scale=0.5)
        expected = _function(x, w, scale=0.5)
        assert call_nodes(*got) == 1
        if grad:
            (got[0].sum() + got[1][:, 0].sum()).backward()
            (expected[0].sum() + expected[1][:, 0].sum()).backward()
        lazy_torch.mark_step()
        for a, b in zip(got, expected):
            assert a.requires_grad == grad
            assert_same(a, b, rtol=1e-4, atol=1e-5)
        if grad:
            assert_same(lazy_w.grad, w.grad, rtol=1e-4, atol=1e-5)
    assert counter("captures") == 1
    compiled(torch.randn(5, 4).to("lazy"), lazy_w, scale=0.25)  # a number guards by value
    assert counter("captures") == 2


def _mixed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a * 2 + b * b


@pytest.mark.parametrize("first", ["aliased", "distinct"])
def test_arguments_that_share_memory(first):
    """f(w, w) and f(a, b) are other graphs (the capture reads a storage once), and each
    argument's gradient is its own share of the whole."""
    compiled = lazy_torch.compile(_mixed)
    g = torch.Generator().manual_seed(0)
    order = ["aliased", "distinct"] if first == "aliased" else ["distinct", "aliased"]
    for kind in order * 2:
        a, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
        if kind == "aliased":
            b = a
        la = a.to("lazy").requires_grad_()
        lb = la if kind == "aliased" else b.to("lazy").requires_grad_()
        a.requires_grad_()
        b.requires_grad_()
        got, expected = compiled(la, lb), _mixed(a, b)
        got.sum().backward()
        expected.sum().backward()
        lazy_torch.mark_step()
        assert_same(got, expected, msg=kind)
        assert_same(la.grad, a.grad, msg=kind)
        assert_same(lb.grad, b.grad, msg=kind)
    assert counter("captures") == 2


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([2.0, -1.0, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


@pytest.mark.parametrize("argument", ["parameter", "computed from the parameter", "other"])
def test_an_argument_tied_to_what_the_call_reads(argument):
    """An argument that is the module's own parameter, or is computed from it (a tied
    embedding computed outside the compiled head): eager's values and gradients, op by op
    with a warning where a capture would count the parameter's path through it twice."""
    eager = Scale()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    other = torch.tensor([1.0, 3.0, -2.0])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            model.w.grad = eager.w.grad = None
            if argument == "parameter":
                got, expected = model(model.w), eager(eager.w)
            elif argument == "computed from the parameter":
                got, expected = model(model.w * 3), eager(eager.w * 3)
            else:
                lazy_other = other.to("lazy").requires_grad_()
                got, expected = model(lazy_other), eager(other)
            got.sum().backward()
            expected.sum().backward()
            lazy_torch.mark_step()
            assert_same(got, expected)
            assert_same(model.w.grad, eager.w.grad)
    messages = compile_warnings(record)
    assert len(messages) == (argument != "other"), messages


class Counts(nn.Module):
    """Writes into its input (through a view too) and into a buffer on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.total.add_(x.sum(0))
        x.mul_(2)
        x[:, 0] = self.calls.to(x.dtype)
        return self.lin(x)


def test_writes_into_inputs_and_buffers_every_call():
    torch.manual_seed(0)
    eager = Counts()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    for step in range(4):
        x = torch.randn(3, 4)
        lazy_x = x.to("lazy")
        got = model(lazy_x)
        assert call_nodes(got) == 1
        got.sum().backward()
        eager(x).sum().backward()
        lazy_torch.mark_step()
        assert_same(lazy_x, x)  # written back
        for name, value in eager.state_dict().items():
            assert_same(model.state_dict()[name], value, rtol=1e-5, atol=1e-6, msg=name)
        assert_same(model.lin.weight.grad, eager.lin.weight.grad, rtol=1e-5, atol=1e-6)
    assert model.calls.item() == 4
    assert counter("captures") == 1


class Outputs(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor):
        y = self.lin(x)
        if self.kind == "tuple":
            return y, 3, (y.sum(), None, "name")
        if self.kind == "dict":
            return {"logits": y, "k": 2.5, "parts": [y.relu(), torch.float16], "none": None}
        # Imported before the call, as a model's module imports it: a ModelOutput class made
        # inside a capture is no pytree node (transformers registers none while compiling).
        return _model_output()(loss=y.square().mean(), logits=y)


class Checked(nn.Module):
    """Syncs on its argument where it is not compiling, as transformers' mask checks do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.compiling: list[bool] = []

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.compiling.append(torch.compiler.is_compiling())
        if not torch.compiler.is_compiling() and bool(mask.all()):
            return self.lin(x)
        return self.lin(x) * mask[:, None]


def test_a_call_that_syncs_is_captured_again_in_a_compile_session(recwarn):
    # A capture runs the call as it is; only after a sync is the next one captured with
    # torch.compiler.is_compiling() True, where the library takes its traceable path.
    torch.manual_seed(0)
    eager = Checked()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    for k in range(4):
        x, mask = torch.randn(2, 4), torch.tensor([1.0, float(k % 2)])
        got = model(x.to("lazy"), mask.to("lazy"))
        assert call_nodes(got) == (k >= 1)  # k = 0 syncs
        assert_same(got, eager(x, mask))
    assert model.compiling == [False, True]  # then replayed
    assert compile_warnings(recwarn.list) == []
    plain = lazy_torch.compile(Net().to("lazy"))
    plain(torch.randn(4, 6).to("lazy"))
    assert not torch.compiler.is_compiling()


class CheckedWithHostOffset(Checked):
    """Checked, whose traceable path also reads a CPU tensor it holds (as transformers' static
    cache reads its CPU counter in the prefill): no call can be captured."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = torch.tensor(0.5)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = super().forward(x, mask)
        return y + self.offset.to(y.device) if torch.compiler.is_compiling() else y + 0.5


def test_calls_whose_session_capture_failed_run_op_by_op_as_that_one_did(recwarn):
    # After a sync, the next call is captured in a compile session; when that fails too, later
    # calls run op by op still in one, so they record the IR that call did: no compile each.
    torch.manual_seed(0)
    eager = CheckedWithHostOffset()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    compiles = []
    for k in range(4):
        x, mask = torch.randn(2, 4), torch.tensor([1.0, 1.0])
        before = counter("compiles")
        got = model(x.to("lazy"), mask.to("lazy"))
        assert_same(got, eager(x, mask))
        compiles.append(counter("compiles") - before)
    assert model.compiling == [False, True, True, True]
    assert compiles[2:] == [0, 0], compiles
    assert len(compile_warnings(recwarn.list)) == 1


def _model_output() -> type:
    from transformers.modeling_outputs import SequenceClassifierOutput

    return SequenceClassifierOutput


class Holder:
    """A result that is no pytree node, holding a tensor of the call and a shared object."""

    def __init__(self, value: torch.Tensor, config: dict) -> None:
        self.value = value
        self.parts = [value.relu(), 3]
        self.config = config


class Slotted:
    __slots__ = ("value",)

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


class NeedsArguments:
    def __new__(cls, value: torch.Tensor) -> NeedsArguments:  # noqa: PYI034
        obj = super().__new__(cls)
        obj.value = value
        return obj


def test_an_object_result_is_rebuilt_by_every_replay(recwarn):
    # Returned as the capture found it, it would hold the first call's tensors at every replay.
    model = nn.Linear(4, 3)
    config = {"name": "shared"}
    lazy_model = copy.deepcopy(model).to("lazy")
    fn = lazy_torch.compile(lambda x: Holder(lazy_model(x) * 2, config))
    results = []
    for k in range(3):
        x = torch.full((2, 4), float(k))
        got = fn(x.to("lazy"))
        expected = model(x) * 2
        assert type(got) is Holder and got.config == config  # a pytree node: rebuilt too
        assert call_nodes(got.value) == 1
        assert_same(got.value, expected, rtol=1e-6, atol=1e-6)
        assert_same(got.parts[0], expected.relu(), rtol=1e-6, atol=1e-6)
        assert got.parts[1] == 3
        results.append(got)
    assert results[1] is not results[2] and results[1].parts is not results[2].parts
    assert compile_warnings(recwarn.list) == []


@pytest.mark.parametrize("kind", [Slotted, NeedsArguments])
def test_a_result_out_of_sight_runs_op_by_op(kind):
    lazy_model = nn.Linear(4, 3).to("lazy")
    fn = lazy_torch.compile(lambda x: kind(lazy_model(x)))
    with pytest.warns(UserWarning, match=rf"returns a {kind.__name__} object, which a replay"):
        fn(torch.ones(2, 4, device="lazy"))
    for k in range(3):
        x = torch.full((2, 4), float(k))
        expected = x @ lazy_model.weight.detach().cpu().T + lazy_model.bias.detach().cpu()
        assert_same(fn(x.to("lazy")).value, expected, rtol=1e-6, atol=1e-6)


def _leaves(tree) -> list:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(tree)[0]


@pytest.mark.parametrize("kind", ["tuple", "dict", "model_output"])
def test_pytree_outputs_with_non_tensor_entries(kind):
    if kind == "model_output":
        pytest.importorskip("transformers")
        _model_output()
    torch.manual_seed(0)
    eager = Outputs(kind)
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    for step in range(3):
        x = torch.randn(2, 4)
        got, expected = model(x.to("lazy")), eager(x)
        assert type(got) is type(expected)
        if kind == "model_output":
            assert got.keys() == expected.keys() and got.hidden_states is None
        got_leaves, expected_leaves = _leaves(got), _leaves(expected)
        assert call_nodes(*(v for v in got_leaves if isinstance(v, torch.Tensor))) == 1
        sum(v.sum() for v in got_leaves if isinstance(v, torch.Tensor)).backward()
        sum(v.sum() for v in expected_leaves if isinstance(v, torch.Tensor)).backward()
        lazy_torch.mark_step()
        assert len(got_leaves) == len(expected_leaves)
        for a, b in zip(got_leaves, expected_leaves):
            if isinstance(b, torch.Tensor):
                assert_same(a, b, rtol=1e-5, atol=1e-6)
            else:
                assert a == b or (a is None and b is None)
        assert_same(model.lin.weight.grad, eager.lin.weight.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hook", ["forward", "forward_pre", "submodule"])
def test_a_module_with_hooks_runs_op_by_op_with_a_warning(hook):
    torch.manual_seed(0)
    eager = Net()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    seen = []
    for m in (eager, model):
        if hook == "forward":
            m.register_forward_hook(lambda mod, args, out: out * 2)
        elif hook == "forward_pre":
            m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
        else:
            m.lin1.register_forward_hook(lambda mod, args, out: seen.append(out.shape) or -out)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4, 6)
            got = model(x.to("lazy"))  # HOOKED CALL
            assert call_nodes(got) == 0
            got.sum().backward()
            eager(x).sum().backward()
            lazy_torch.mark_step()
            assert_same(got, eager(x), rtol=1e-4, atol=1e-5)
    assert_same(model.lin1.weight.grad, eager.lin1.weight.grad, rtol=1e-4, atol=1e-5)
    (message,) = compile_warnings(record)
    assert "the module has hooks" in message and here("HOOKED" + " CALL") in message
    if hook == "submodule":
        assert len(seen) == 9  # three calls each: compiled, eager, eager again


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 6))
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        return self.head(checkpoint(self.block, x, use_reentrant=False) + x)


def test_checkpoint_inside_a_compiled_module():
    """Activation checkpointing: captured like any forward (its backward recomputes inside the
    backward node) or run op by op with a warning; either way eager's values and gradients."""
    torch.manual_seed(0)
    eager = Checkpointed()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        replayed = []
        for _ in range(3):
            x = torch.randn(4, 6)
            got = model(x.to("lazy"))
            got.square().sum().backward()
            replayed.append(call_nodes(*(p.grad for p in model.parameters())))
            expected = eager(x)
            expected.square().sum().backward()
            lazy_torch.mark_step()
            assert_same(got, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    messages = compile_warnings(record)
    assert replayed == [0, 2, 2] or (replayed == [0, 0, 0] and len(messages) == 1), replayed


def test_a_module_called_twice_in_one_step():
    torch.manual_seed(0)
    eager = Net()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for step in range(3):
        a, b = torch.randn(4, 6), torch.randn(4, 6)
        loss = (model(a.to("lazy")) * model(b.to("lazy"))).sum()
        loss.backward()
        calls = call_nodes(*(p.grad for p in model.parameters()))
        assert calls == 4, calls  # two forward and two backward nodes
        expected = (eager(a) * eager(b)).sum()
        expected.backward()
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
        lazy_torch.mark_step()
        assert_same(loss, expected, rtol=1e-4, atol=1e-5)
    for name, value in eager.state_dict().items():
        assert_same(model.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert counter("captures") == 1


def test_module_api_of_a_compiled_module():
    torch.manual_seed(0)
    eager = Net()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    assert isinstance(model, Net) and lazy_torch.compile(model) is model
    x = torch.randn(4, 6)

    def check(m: nn.Module, e: nn.Module, device: str = "lazy", dtype=torch.float32) -> None:
        got = m(x.to(device, dtype))
        lazy_torch.mark_step()  # a call in training mode reads the statistics the last wrote
        assert got.dtype == dtype and got.device.type == device
        assert_same(got, e(x.to(dtype)), rtol=1e-4, atol=1e-5)

    check(model, eager)
    check(model, eager)
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in eager.named_parameters()]
    assert model.state_dict().keys() == eager.state_dict().keys()
    for name, value in eager.state_dict().items():
        assert_same(model.state_dict()[name], value, msg=name)

    # load_state_dict copies into the same tensors: the replay reads the new values.
    torch.manual_seed(1)
    eager.load_state_dict(Net().state_dict())
    model.load_state_dict(eager.state_dict())
    captures = counter("captures")
    check(model, eager)
    assert counter("captures") == captures
    # assign=True puts new tensors in: a recapture.
    model.load_state_dict({k: v.to("lazy") for k, v in eager.state_dict().items()}, assign=True)
    check(model, eager)
    assert counter("captures") == captures + 1

    # A deep copy is compiled too, bound to its own parameters.
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lin2.bias.add_(1)
    check(model, eager)
    eager_twin = copy.deepcopy(eager)
    with torch.no_grad():
        eager_twin.lin2.bias.add_(1)
    check(twin, eager_twin)
    check(twin, eager_twin)
    assert call_nodes(twin(x.to("lazy"))) == 1

    # .to(): another dtype recaptures; the CPU runs eagerly; back on the device, it replays.
    check(model.to(torch.float64), eager.to(torch.float64), dtype=torch.float64)
    check(model.to("cpu"), eager, device="cpu", dtype=torch.float64)
    model.to("lazy").float()
    eager.float()
    check(model, eager)
    assert call_nodes(model(x.to("lazy"))) == 1
    lazy_torch.mark_step()
    model.train()  # as it was: no recapture
    assert call_nodes(model(x.to("lazy"))) == 1


def _train_net(model: nn.Module, steps: int, *, autocast: bool = False, freeze_at: int = -1):
    """AdamW steps of a squared-output loss; the losses and the final state (CPU)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(steps):
        if step == freeze_at:
            model.lin1.requires_grad_(False)
        x = torch.randn(4, 6, generator=g).to("lazy")
        with lazy_torch.amp.autocast(enabled=autocast):
            y = model(x)
        loss = y.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lazy_torch.mark_step()
        losses.append(loss.detach().cpu())
    return torch.stack(losses), {k: v.cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("change", ["autocast", "freeze"])
def test_autocast_training_and_freezing_a_layer(change):
    """Training under lazy autocast (bfloat16) replays as the uncompiled path computes; a layer
    frozen mid-training (requires_grad_(False)) recaptures once and gets no more updates."""
    torch.manual_seed(0)
    net = Net()
    options = {"autocast": True} if change == "autocast" else {"freeze_at": 2}
    lazy_torch.metrics.reset()
    got = _train_net(lazy_torch.compile(copy.deepcopy(net).to("lazy")), 4, **options)
    assert counter("captures") == (1 if change == "autocast" else 2)
    if change == "freeze":
        (where,) = lazy_torch.metrics.sites()["recaptures"]
        assert where.endswith("(parameters changed)"), where
    expected = _train_net(copy.deepcopy(net).to("lazy"), 4, **options)
    assert_same(got[0], expected[0])
    for name, value in expected[1].items():
        assert_same(got[1][name], value, msg=name)


class Blocks(nn.Module):
    """Compiled blocks inside an uncompiled model; ``shared`` applies one block twice."""

    def __init__(self, shared: bool) -> None:
        super().__init__()
        self.shared = shared
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in [self.blocks[0]] * 2 if self.shared else self.blocks:
            x = block(x) + x
        return self.head(x)


@pytest.mark.parametrize("shared", [False, True])
def test_compiled_blocks_inside_a_model(shared):
    """Each block one forward and one backward node. A block applied to its own output reads
    the parameters its argument was computed from, so its second call runs op by op (with the
    warning): the capture's gradients would count that path twice."""
    torch.manual_seed(0)
    eager = Blocks(shared)
    model = copy.deepcopy(eager).to("lazy")
    for block in model.blocks:
        lazy_torch.compile(block)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in range(4):
            x = torch.randn(5, 8, generator=g)
            losses = [m(v).square().mean() for m, v in ((model, x.to("lazy")), (eager, x))]
            for loss, opt in zip(losses, opts):
                loss.backward()
            calls = call_nodes(*(p.grad for p in model.parameters() if p.grad is not None))
            if step:
                assert calls == (2 if shared else 6), calls
            for opt in opts:
                opt.step()
                opt.zero_grad()
            lazy_torch.mark_step()
            assert_same(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    for name, value in eager.state_dict().items():
        assert_same(model.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    messages = compile_warnings(record)
    assert len(messages) == shared, messages


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor):
        y = self.lin(x)
        return y, y.argmax(-1), y > 0


class Detaching(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple:
        y = self.lin(x)
        return y, y.detach() * 2, y.sum()


@pytest.mark.parametrize("module", [TwoHeads, Detaching])
def test_outputs_that_need_no_grad_in_eager_need_none_in_replays(module):
    # The replay's outputs come from one autograd Function: integer and bool outputs, and a
    # float one the capture computed from detached values, need no grad, as in eager (every
    # replay used to give the float one a grad).
    torch.manual_seed(0)
    eager = module()
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    for _ in range(3):
        x = torch.randn(5, 4)
        got, expected = model(x.to("lazy")), eager(x)
        assert call_nodes(*got) == 1
        assert [t.requires_grad for t in got] == [t.requires_grad for t in expected]
        sum(t.sum() for t in got if t.requires_grad).backward()
        sum(t.sum() for t in expected if t.requires_grad).backward()
        lazy_torch.mark_step()
        for a, b in zip(got, expected):
            assert a.dtype == b.dtype
            assert_same(a, b)
        assert_same(model.lin.weight.grad, eager.lin.weight.grad)
    assert counter("captures") == 1


def test_a_first_call_whose_replay_misses_keeps_its_own_result_and_writes(monkeypatch):
    # The watched call's result is its replay's; a replay that misses (a compiled step's state
    # changed) must leave the op-by-op result and what the call wrote, not the rewound values.
    from lazy_torch import capture

    monkeypatch.setattr(capture._Capture, "replay", lambda self, flat: capture.Miss("test"))
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model = lazy_torch.compile(copy.deepcopy(eager).to("lazy"))
    x = torch.randn(6, 4)
    with torch.no_grad():
        assert_same(model(x.to("lazy")), eager(x))
    for name, value in eager.state_dict().items():
        assert_same(model.state_dict()[name], value, msg=name)
