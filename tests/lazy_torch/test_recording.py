"""Recording (lazy_torch/recording.py, lazy_torch/csrc/record.cpp): the C dispatch's attempt
records exactly what the op's handler records, declines to the handler everything it must decide
(errors included), and the recorders make the nodes their contracts say."""

import pytest
import torch

import lazy_torch
from lazy_core import scalar_leaf
from lazy_core.ir import Operand
from lazy_torch import dispatch, recording
from lazy_torch.tensor import _native, dense_meta

aten = torch.ops.aten
LAZY = torch.device("lazy", 0)

# (op, args builder from (x, y, w) lazy tensors, kwargs)
CASES = [
    (aten.add.Tensor, lambda x, y, w: (x, y), {}),
    (aten.add.Tensor, lambda x, y, w: (x, y), {"alpha": 2.5}),
    (aten.add.Tensor, lambda x, y, w: (x, torch.tensor(3.0)), {}),  # a wrapped number
    (aten.mul.Tensor, lambda x, y, w: (x, torch.tensor(1)), {}),  # the constant 1
    (aten.sub.Tensor, lambda x, y, w: (x, y), {"alpha": -0.0}),  # -0.0 is no constant
    (aten.mul.Scalar, lambda x, y, w: (x, 7), {}),
    (aten.pow.Tensor_Scalar, lambda x, y, w: (x, 2), {}),
    (aten.relu.default, lambda x, y, w: (x,), {}),
    (aten.sum.dim_IntList, lambda x, y, w: (x, [1], True), {}),
    (aten.sum.dim_IntList, lambda x, y, w: (x, [0]), {"dtype": torch.float64}),
    (aten.clone.default, lambda x, y, w: (x,), {"memory_format": torch.contiguous_format}),
    (aten.mm.default, lambda x, y, w: (x, w), {}),
    (aten.cat.default, lambda x, y, w: ([x, y], 1), {}),
    (aten.where.self, lambda x, y, w: (x > 0, x, y), {}),
    (aten.view.default, lambda x, y, w: (x, [3, 4]), {}),
    (aten.t.default, lambda x, y, w: (x,), {}),
    (aten.transpose.int, lambda x, y, w: (x, 0, 1), {}),
    (aten.expand.default, lambda x, y, w: (x[:1], [4, 3]), {}),
    (aten.slice.Tensor, lambda x, y, w: (x, 1, 0, 2), {}),
    (aten.split.Tensor, lambda x, y, w: (x, 2), {}),
    (aten.unbind.int, lambda x, y, w: (x,), {}),
    # (as_strided is not here: where it reads by address depends on its input, in Python.)
    (aten.detach.default, lambda x, y, w: (x,), {}),
    (aten.native_layer_norm.default, lambda x, y, w: (x, [3], y[0], None, 1e-5), {}),
    (aten.max.dim, lambda x, y, w: (x, 1), {}),
    (aten.var_mean.correction, lambda x, y, w: (x, [0]), {"keepdim": True}),
    (aten._to_copy.default, lambda x, y, w: (x,), {"dtype": torch.bfloat16}),
    (aten._to_copy.default, lambda x, y, w: (x,), {"dtype": torch.float64, "device": LAZY}),
]


def _lazy_inputs():
    torch.manual_seed(0)
    x, y, w = torch.randn(4, 3), torch.randn(4, 3), torch.randn(3, 5)
    return (x, y, w), tuple(t.to("lazy") for t in (x, y, w))


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_dispatch_in_c_records_what_the_handler_records(case):
    func, build, kwargs = CASES[case]
    cpu_inputs, lazy_inputs = _lazy_inputs()
    args = build(*lazy_inputs)
    func(*args, **kwargs)  # the first call resolves the op and fills the memos
    before = _native.stats()["native"]
    fast = _outputs(func(*args, **kwargs))
    assert _native.stats()["native"] == before + 1, "the op was not recorded in C"
    slow = _outputs(dispatch.dispatch(func, args, dict(kwargs)))
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert type(f) is type(s)
        assert f._meta == s._meta
        assert f._lazy.steps == s._lazy.steps
        assert f._lazy.node.hash == s._lazy.node.hash
        assert (f.shape, f.stride(), f.dtype, f.device) == (s.shape, s.stride(), s.dtype, s.device)
    eager_kwargs = {k: v for k, v in kwargs.items() if v is not LAZY}  # the oracle runs on the CPU
    expected = _outputs(func(*build(*cpu_inputs), **eager_kwargs))
    lazy_torch.mark_step()
    for f, e in zip(fast, expected):
        torch.testing.assert_close(f.cpu(), e)


def test_errors_are_eager_errors():
    x = torch.randn(4, 3, device="lazy")
    x + x  # cached shapes for (4, 3) + (4, 3)
    with pytest.raises(RuntimeError, match="must match the size"):
        x + torch.randn(5, 3, device="lazy")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.randn(4, 3)


def test_copies_to_another_device_go_to_the_handler():
    x = torch.randn(4, 3, device="lazy")
    x.to(torch.float16)
    before = _native.stats()
    half, cpu = x.to(torch.float16), x.to("cpu", torch.float16)
    after = _native.stats()
    assert (after["native"] - before["native"], after["python"] - before["python"]) == (1, 1)
    assert type(cpu) is torch.Tensor and cpu.device.type == "cpu"
    torch.testing.assert_close(cpu, half.cpu())


def test_sites_are_recorded_by_the_handler():
    x = torch.randn(4, 3, device="lazy")
    x * 2.0
    previous = lazy_torch.debug.record_sites(True)
    try:
        y = x * 2.0
    finally:
        lazy_torch.debug.record_sites(previous)
    assert y._lazy.node.site.endswith(f"test_recording.py:{_line_of('y = x * 2.0')}")


def test_nodes_of_equal_calls_share_one_template():
    x = torch.randn(4, 3, device="lazy")
    a, b = x * 2.5 + x, x * 3.5 + x  # other numbers, one template: mul(%0, %1), add(%0, %1)
    assert a._lazy.node.arg is b._lazy.node.arg
    assert a._lazy.node.src[0].arg is b._lazy.node.src[0].arg
    previous = lazy_torch.debug.record_sites(True)  # every op goes to its handler
    try:
        c = x * 4.5 + x
    finally:
        lazy_torch.debug.record_sites(previous)
    assert c._lazy.node.arg is a._lazy.node.arg


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip() == text)


@pytest.mark.parametrize("count", [3, 300])  # 300 tensors: past the table of operand markers
def test_foreach_elements_share_one_operand_list(count):
    plan = recording.plan_of(aten.addcmul.default)
    xs = [torch.randn(2, i % 3 + 1) for i in range(count)]
    lazy = [t.to("lazy") for t in xs]
    calls = [((t, t, t), {"value": 0.5}) for t in lazy]
    srcs, templates, metas, device, counts = _native.elements(plan, calls)
    assert device == 0 and counts == (4,) * count  # 3 tensors and the value, per element
    assert len(srcs) == 4 * count
    for i, t in enumerate(lazy):
        assert srcs[4 * i : 4 * i + 3] == (t._lazy.node,) * 3
        assert srcs[4 * i + 3].op == "scalar" and srcs[4 * i + 3].payload == 0.5
        assert metas[i] == t._meta
    # Markers count from each element's first operand: elements of one shape share a template.
    marks = (Operand(0), Operand(1), Operand(2))
    assert set(templates) == {(marks, (("value", Operand(3)),))}
    assert len({id(t) for t in templates}) == min(count, 3)
    out = torch._foreach_addcmul(lazy, lazy, lazy, value=0.5)
    expected = torch._foreach_addcmul(xs, xs, xs, value=0.5)
    lazy_torch.mark_step()
    for o, e in zip(out, expected):
        torch.testing.assert_close(o.cpu(), e)


def _foreach_found(func, calls):
    plan = recording.plan_of(func)
    srcs, templates, metas, device, counts = _native.elements(plan, calls)
    return srcs, recording.foreach_arg(plan.name, srcs, templates, counts), metas, device


def test_foreach_outputs_are_one_node():
    xs = [torch.randn(2, i + 1, device="lazy") for i in range(4)]
    found = _foreach_found(aten.mul.Tensor, [((t, t), {}) for t in xs])
    out = _native.foreach_outputs(recording.FOREACH, *found, None)
    assert type(out) is list and len(out) == 4
    node = out[0]._lazy.node.src[0]
    assert node.op == recording.FOREACH and node.num_outputs == 4
    for i, (o, x) in enumerate(zip(out, xs)):
        assert o._meta == x._meta and o._lazy.node.op == "getitem" and o._lazy.node.arg == i
        assert o._lazy.node.src[0] is node
    # In place: each target's storage gets its output of one shared node.
    targets = [t.clone() for t in xs]
    assert _native.foreach_outputs(recording.FOREACH, *found, targets) is targets
    nodes = [t._lazy.node for t in targets]
    assert len({id(n.src[0]) for n in nodes}) == 1
    assert nodes[0].src[0].digest == node.digest
    lazy_torch.mark_step()
    for o, t, x in zip(out, targets, xs):
        torch.testing.assert_close(t.cpu(), x.cpu() * x.cpu())
        torch.testing.assert_close(o.cpu(), x.cpu() * x.cpu())


@pytest.mark.parametrize(
    "case", ["integer result", "target of another shape", "target of another dtype"]
)
def test_foreach_outputs_decline_what_does_not_fit(case):
    xs = [torch.randn(3, device="lazy"), torch.randn(3, device="lazy")]
    if case == "integer result":
        xs = [torch.ones(3, dtype=torch.int64, device="lazy") for _ in xs]
    found = _foreach_found(aten.add.Tensor, [((t, t), {}) for t in xs])
    targets = None
    if case == "target of another shape":
        targets = [xs[0], torch.randn(4, device="lazy")]
    elif case == "target of another dtype":
        targets = [xs[0], torch.randn(3, dtype=torch.float64, device="lazy")]
    before = [t._lazy.node for t in targets or xs]
    assert _native.foreach_outputs(recording.FOREACH, *found, targets) is None
    assert [t._lazy.node for t in targets or xs] == before


@pytest.mark.parametrize("metas", ["one", "tuple", "list"])
def test_record_op_makes_one_node_over_its_values(metas):
    x, w = torch.randn(4, 3, device="lazy"), torch.randn(5, 3, device="lazy")
    leaf = scalar_leaf(0.5, "float64")
    values = [x, w, 2.5, 0, leaf]  # tensors, a graph scalar, a constant, a node
    one = dense_meta((4, 5), torch.float32)
    meta = {
        "one": one,
        "tuple": (one, None, dense_meta((5,), torch.float64)),
        "list": [None, one],
    }[metas]
    torch.set_float32_matmul_precision("high")
    try:
        out = recording.record_op("lazy.test", values, (True, "a"), meta, matmul=True)
    finally:
        torch.set_float32_matmul_precision("highest")
    outs = _outputs(out)
    assert type(out) is (lazy_torch.LazyTensor if metas == "one" else type(meta))
    metas_list = [meta] if metas == "one" else list(meta)
    assert [o is None for o in outs] == [m is None for m in metas_list]
    nodes = [o._lazy.node for o in outs if o is not None]
    node = nodes[0] if metas == "one" else nodes[0].src[0]
    assert node.op == "lazy.test"
    assert node.arg == ((tuple(Operand(i) for i in range(5)), True, "a"), (("_precision", "high"),))
    assert node.src[:2] == (x._lazy.node, w._lazy.node) and node.src[4] is leaf
    assert (node.src[2].op, node.src[2].payload) == ("scalar", 2.5)
    assert (node.src[3].op, node.src[3].arg) == ("constant", (True, 0))
    for o, m in zip(outs, metas_list):
        if o is not None:
            assert type(o) is lazy_torch.LazyTensor and o._meta == m


def test_record_op_raises_eager_errors():
    x, cpu = torch.randn(2, device="lazy"), torch.randn(2)
    meta = dense_meta((2,), torch.float32)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        recording.record_op("lazy.test", [x, cpu], (), meta)
    unnamed = dense_meta((2,), torch.float8_e4m3fn)  # a dtype the graph has no name for
    with pytest.raises(TypeError, match="float8_e4m3fn is not supported on the lazy device"):
        recording.record_op("lazy.test", [x], (), unnamed)
    with pytest.raises(TypeError, match="an operand is a tensor, a Node or a number"):
        recording.record_op("lazy.test", [x, "text"], (), meta)
