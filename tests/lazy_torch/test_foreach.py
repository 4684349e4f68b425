"""``aten._foreach_*`` ops on lazy tensors: every overload eager CPU runs gives eager's values with no
fallback, and PyTorch's optimizers take their foreach path on lazy parameters by default."""

import copy

import pytest
import torch
from torch.optim.optimizer import _default_to_fused_or_foreach

import lazy_torch
import runtime

aten = torch.ops.aten
SHAPES = [(3,), (2, 2), (4,)]


def _overloads():
    names = torch._C._dispatch_get_all_op_names()
    for full in sorted(n for n in names if n.startswith("aten::_foreach_")):
        name, _, overload = full.removeprefix("aten::").partition(".")
        yield f"{name}.{overload or 'default'}"


def _value(arg, lists: dict):
    """An eager CPU argument for schema argument ``arg``: lists of 3 tensors, scalars, ..."""
    t = arg.type
    kind = str(t)
    if isinstance(t, torch._C.ListType):
        element = str(t.getElementType())
        if "Tensor" in element:
            seed = len(lists)
            lists[arg.name] = [
                torch.rand(s, generator=torch.Generator().manual_seed(seed * 10 + i)) + 0.5
                for i, s in enumerate(SHAPES)
            ]
            return lists[arg.name]
        return [0.5, 2.0, 1.5]
    if arg.has_default_value():
        return None
    if arg.name == "scalars":
        return torch.tensor([0.5, 2.0, 1.5])
    if "Tensor" in kind:
        return torch.tensor(1.5)
    return 0.75


@pytest.mark.parametrize("name", list(_overloads()))
def test_foreach_op_matches_eager_without_fallback(name):
    packet_name, overload = name.split(".")
    op = getattr(getattr(aten, packet_name), overload)
    if any(a.kwarg_only and not a.has_default_value() for a in op._schema.arguments):
        pytest.skip("keyword-only arguments without defaults")
    args = []
    for a in op._schema.arguments:
        if a.kwarg_only:
            break
        v = _value(a, {})
        if v is None:
            break
        args.append(v)
    cpu_args = copy.deepcopy(args)
    try:
        expected = op(*cpu_args)
    except (RuntimeError, TypeError) as e:
        pytest.skip(f"eager CPU rejects these arguments: {e}")
    lazy_args = [
        [x.to("lazy") for x in v] if isinstance(v, list) and isinstance(v[0], torch.Tensor) else v
        for v in args
    ]
    # A single Tensor other is a device tensor; per-element scalars stay a CPU tensor.
    names = [a.name for a in op._schema.arguments]
    lazy_args = [
        v.to("lazy") if isinstance(v, torch.Tensor) and names[i] != "scalars" else v
        for i, v in enumerate(lazy_args)
    ]
    got = op(*lazy_args)
    if expected is None:  # in place: compare the mutated first list
        got, expected = lazy_args[0], cpu_args[0]
    for g, e in zip(got, expected):
        assert isinstance(g, lazy_torch.LazyTensor)
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g.cpu(), e, equal_nan=True)
    fallbacks = [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]
    assert fallbacks == []


OPTIMIZERS = [
    (torch.optim.AdamW, {}),
    (torch.optim.Adam, {"amsgrad": True}),
    (torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    (torch.optim.RMSprop, {"momentum": 0.5}),
    (torch.optim.Adagrad, {}),
    (torch.optim.NAdam, {}),
    (torch.optim.RAdam, {}),
    (torch.optim.Adamax, {}),
    (torch.optim.ASGD, {}),
    (torch.optim.Adadelta, {}),
]


@pytest.fixture(autouse=True)
def foreach_path(monkeypatch):
    """Adam, AdamW and SGD take their foreach path here, not their fused step (test_fused.py)."""
    monkeypatch.setattr(runtime.config, "FUSE_FOREACH_STEPS", False)


def test_optimizers_default_to_foreach_on_lazy_parameters():
    params = list(torch.nn.Linear(2, 2).to("lazy").parameters())
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, True)
    cpu = list(torch.nn.Linear(2, 2).parameters())
    assert _default_to_fused_or_foreach(cpu, differentiable=False) == (False, False)


@pytest.mark.parametrize(
    ("opt_class", "kwargs"), OPTIMIZERS, ids=lambda o: getattr(o, "__name__", "")
)
def test_foreach_optimizer_steps_match_eager(opt_class, kwargs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 6)
    results = []
    for device in ("cpu", "lazy"):
        m = copy.deepcopy(model).to(device)
        opt = opt_class(m.parameters(), lr=1e-2, **kwargs)  # foreach chosen by PyTorch
        for _ in range(3):
            opt.zero_grad()
            m(x.to(device)).square().mean().backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
            opt.step()
            if device == "lazy":
                lazy_torch.mark_step()
        results.append([p.detach().cpu() for p in m.parameters()])
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    counters = lazy_torch.metrics.counters()
    assert not [k for k in counters if k.startswith("fallback::")]


def test_a_foreach_adamw_step_dispatches_one_op_per_foreach_call():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)]).to("lazy")
    model(torch.ones(2, 4, device="lazy")).sum().backward()
    opt = torch.optim.AdamW(model.parameters())
    with Count() as counter:
        opt.step()
    lazy_ops = [op for op in counter.ops if op.startswith("aten._foreach_")]
    assert lazy_ops  # the foreach path was taken
    # 10 parameters, yet no per-parameter elementwise op reaches the dispatcher.
    assert not [op for op in counter.ops if op in ("aten.lerp_.Scalar", "aten.addcdiv_.default")]


def test_an_optimizer_step_records_one_node_per_foreach_call():
    import collections

    from lazy_core import cut_graph, pending_storages

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)]).to("lazy")
    model(torch.ones(2, 4, device="lazy")).sum().backward()
    lazy_torch.mark_step()
    torch.optim.AdamW(model.parameters()).step()
    ops = collections.Counter(n.op for n in cut_graph([s.node for s in pending_storages()]).nodes)
    assert ops["lazy.foreach"] >= 5
    assert not [op for op in ops if op.startswith(("aten.lerp", "aten.addcdiv", "aten.mul"))]
    assert ops["getitem"] == 10 * ops["lazy.foreach"]  # one output per parameter


def test_one_number_for_every_element_is_one_graph_parameter():
    from lazy_core import cut_graph, pending_storages
    from lazy_core.ir import SCALAR

    xs = [torch.rand(3, i + 1) for i in range(6)]
    lazy = [t.to("lazy") for t in xs]
    lazy_torch.mark_step()
    scale, steps = 0.7, [0.1 * (i + 1) for i in range(6)]  # one number; one number per element
    torch._foreach_mul_(lazy, scale)
    torch._foreach_add_(lazy, steps)
    params = cut_graph([s.node for s in pending_storages()]).params
    assert sorted(p.payload for p in params if p.op == SCALAR) == sorted([scale, *steps])
    for got, x, step in zip(lazy, xs, steps):
        torch.testing.assert_close(got.cpu(), x * scale + step)


def test_integer_and_mixed_dtype_lists_take_the_per_element_path():
    ints = [torch.arange(3), torch.arange(4) * 2]
    floats = [torch.rand(3), torch.rand(4)]
    lazy_ints = [t.to("lazy") for t in ints]
    lazy_floats = [t.to("lazy") for t in floats]
    torch._foreach_add_(lazy_ints, 3)
    torch._foreach_add_(ints, 3)
    got = torch._foreach_mul(lazy_floats, lazy_ints)  # float results from mixed operands
    expected = torch._foreach_mul(floats, ints)
    for g, e in zip([*lazy_ints, *got], [*ints, *expected]):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g.cpu(), e)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_mul_([t.to("lazy") for t in ints], 0.5)  # eager refuses int *= float
