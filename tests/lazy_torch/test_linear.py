"""Linear layers as one node and one backward node (lazy_torch/linear.py), under lazy autocast
and in float32, with the C++ grad_fn and with the Python Function that stands in for it.

Oracles: the same calls through the ordinary kernels (``LAZY_FUSE_LINEAR=0``: autocast's casts,
then ``addmm``/``mm`` and their autograd), which must give the same bits; eager
``torch.autocast('cpu')``, whose matmuls also run in bfloat16, up to bfloat16 rounding; eager
float32 on the CPU, and its errors.
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import runtime
from lazy_torch.amp import autocast

BF16 = torch.bfloat16
FUSED = "LazyLinearBackward"


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _inputs(kind):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 16)
    if kind == "addmm":  # GPT-2's Conv1D: a (in, out) weight, the input's rows
        return x.reshape(-1, 16), torch.randn(16, 8), torch.randn(8)
    if kind == "linear 2d":
        return x.reshape(-1, 16), torch.randn(8, 16), torch.randn(8)
    if kind == "linear 3d":
        return x, torch.randn(8, 16), torch.randn(8)
    return x, torch.randn(8, 16), None  # "linear, no bias"


def _layer(kind, x, w, b, dtype_ctx):
    with dtype_ctx:
        if kind == "addmm":
            return torch.addmm(b, x, w)
        return F.linear(x, w, b)


def _run(kind, device, fuse=True, monkeypatch=None, dtype=None):
    """The layer's output, its grad_fn's name, and the gradients of x, w, b: under bf16
    autocast, or with ``dtype`` given, without it on inputs of that dtype."""
    if monkeypatch is not None:
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
    tensors = [
        None if t is None else t.to(device=device, dtype=dtype).requires_grad_()
        for t in _inputs(kind)
    ]
    if dtype is not None:
        ctx = contextlib.nullcontext()
    elif device == "lazy":
        ctx = autocast(dtype=BF16)
    else:
        ctx = torch.autocast("cpu", dtype=BF16)
    y = _layer(kind, *tensors, ctx)
    (y if dtype is not None else y.float()).square().sum().backward()
    grads = [None if t is None else t.grad.cpu() for t in tensors]
    return y.cpu(), y.grad_fn.name(), grads


@pytest.mark.parametrize("kind", ["addmm", "linear 2d", "linear 3d", "linear, no bias"])
def test_fused_layer_gives_the_ordinary_kernels_bits(kind, monkeypatch):
    y, name, grads = _run(kind, "lazy", True, monkeypatch)
    y0, name0, grads0 = _run(kind, "lazy", False, monkeypatch)
    assert name == FUSED and name0 != FUSED
    assert y.dtype == BF16 and torch.equal(y, y0)
    for g, g0, t in zip(grads, grads0, _inputs(kind)):
        if t is None:
            continue
        assert g.dtype == torch.float32 and torch.equal(g, g0)


@pytest.mark.parametrize("kind", ["addmm", "linear 3d", "linear, no bias"])
def test_fused_layer_matches_eager_cpu_autocast(kind):
    y, _, grads = _run(kind, "lazy")
    want, _, want_grads = _run(kind, "cpu")
    assert y.dtype == want.dtype == BF16
    torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)
    for g, w in zip(grads, want_grads):
        if w is not None:
            assert g.dtype == w.dtype
            torch.testing.assert_close(g, w, rtol=3e-2, atol=0.15)


@pytest.mark.parametrize("amp", [True, False], ids=["autocast", "float32"])
def test_fewer_ops_and_the_same_step(amp, monkeypatch):
    def step(fuse):
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
        )
        model = model.to("lazy")
        x = torch.randn(8, 16).to("lazy")
        with CountOps() as ops:
            with autocast(dtype=BF16) if amp else contextlib.nullcontext():
                loss = model(x).float().logsumexp(-1).mean()
            loss.backward()
        return ops.count, loss.item(), [p.grad.cpu() for p in model.parameters()]

    fused, loss, grads = step(True)
    ordinary, loss0, grads0 = step(False)
    # Per layer a transpose, a product and its backward's transposes, products and sum; under
    # autocast also the casts.
    assert fused < ordinary - (10 if amp else 8)
    assert loss == loss0 and all(torch.equal(g, g0) for g, g0 in zip(grads, grads0))


def test_only_the_gradients_asked_for(monkeypatch):
    def weight_grad(fuse):
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
        x, w, b = (t.to("lazy") for t in _inputs("linear 2d"))
        w.requires_grad_()
        with autocast(dtype=BF16):
            y = F.linear(x, w, b)  # neither x nor the bias needs a gradient
        y.float().sum().backward()
        assert x.grad is None and b.grad is None
        return y.grad_fn.name(), w.grad.cpu()

    (name, fused), (_, ordinary) = weight_grad(True), weight_grad(False)
    assert name == FUSED and torch.equal(fused, ordinary)


def test_double_backward_runs_differentiable_ops(monkeypatch):
    def penalty(fuse):
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
        x, w, b = (t.to("lazy").requires_grad_() for t in _inputs("linear 2d"))
        with autocast(dtype=BF16):
            y = F.linear(x, w, b)
        (gx,) = torch.autograd.grad(y.float().square().sum(), x, create_graph=True)
        gx.square().sum().backward()  # a gradient penalty
        return gx.cpu(), w.grad.cpu(), b.grad.cpu()

    fused, ordinary = penalty(True), penalty(False)
    for a, b in zip(fused, ordinary):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_inference_under_no_grad():
    x, w, b = (t.to("lazy") for t in _inputs("linear 3d"))
    with torch.no_grad(), autocast(dtype=BF16):
        y = F.linear(x, w, b)
    assert y.grad_fn is None and y.dtype == BF16 and y.shape == (4, 6, 8)
    with torch.autocast("cpu", dtype=BF16):
        want = F.linear(*_inputs("linear 3d"))
    torch.testing.assert_close(y.cpu(), want, rtol=2e-2, atol=2e-2)


def test_calls_eager_computes_otherwise_take_the_ordinary_kernels():
    x, w, b = (t.to("lazy").requires_grad_() for t in _inputs("linear 3d"))
    with autocast(dtype=BF16):
        scaled = torch.addmm(b, x[0], w.t(), beta=0.5)
        strided = F.linear(x.transpose(0, 1), w, b)  # bias added after the product's rounding
    assert scaled.grad_fn.name() == "AddmmBackward0"
    assert strided.grad_fn.name() != FUSED
    with torch.autocast("cpu", dtype=BF16):
        want = F.linear(_inputs("linear 3d")[0].transpose(0, 1), *_inputs("linear 3d")[1:])
    torch.testing.assert_close(strided.cpu(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("call", ["addmm", "linear"])
def test_shape_errors_are_eagers(call):
    x, w, b = torch.randn(4, 16), torch.randn(8, 15), torch.randn(8)

    def run(x, w, b, ctx):
        with ctx:
            return torch.addmm(b, x, w.t()) if call == "addmm" else F.linear(x, w, b)

    with pytest.raises(RuntimeError) as eager:
        run(x, w, b, torch.autocast("cpu", dtype=BF16))
    with pytest.raises(RuntimeError) as lazy:
        run(x.to("lazy"), w.to("lazy"), b.to("lazy"), autocast(dtype=BF16))
    assert str(lazy.value) == str(eager.value)


# --- float32 and other single-dtype layers (F.linear's AutogradLazy kernel) ---------------------


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("kind", ["linear 2d", "linear 3d", "linear, no bias"])
def test_single_dtype_layer_gives_the_ordinary_kernels_bits(kind, dtype, monkeypatch):
    y, name, grads = _run(kind, "lazy", True, monkeypatch, dtype)
    y0, name0, grads0 = _run(kind, "lazy", False, monkeypatch, dtype)
    assert name == FUSED and name0 != FUSED
    assert y.dtype == dtype and torch.equal(y, y0)
    for i, (g, g0, t) in enumerate(zip(grads, grads0, _inputs(kind))):
        if t is None:
            continue
        assert g.dtype == dtype
        if i == 2 and kind == "linear 3d" and dtype == torch.float32:
            # The bias gradient sums the (4, 6, 8) gradient's rows. Unfused, XLA sees a reshape
            # to (24, 8) between its producer and the sum and orders the float32 additions
            # otherwise: the two differ in the last bit (test_float32_layer_matches_eager checks
            # both against eager).
            torch.testing.assert_close(g, g0)
        else:
            assert torch.equal(g, g0)


@pytest.mark.parametrize("kind", ["linear 2d", "linear 3d", "linear, no bias"])
def test_float32_layer_matches_eager(kind):
    y, _, grads = _run(kind, "lazy", dtype=torch.float32)
    want, _, want_grads = _run(kind, "cpu", dtype=torch.float32)
    torch.testing.assert_close(y, want)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    "x, w, b",
    [
        ((4, 16), (8, 15), (8,)),  # shapes
        ((4, 16), (8, 16), (7,)),  # bias
        ((16,), (8, 16), (8,)),  # a 1-d input: matmul's path
    ],
)
def test_float32_errors_and_edge_shapes_are_eagers(x, w, b):
    torch.manual_seed(0)
    args = [torch.randn(s) for s in (x, w, b)]
    try:
        want = F.linear(*args)
    except RuntimeError as e:
        with pytest.raises(RuntimeError) as lazy:
            F.linear(*(a.to("lazy") for a in args))
        assert str(lazy.value) == str(e)
        return
    torch.testing.assert_close(F.linear(*(a.to("lazy") for a in args)).cpu(), want)


@pytest.mark.parametrize(
    "x, w",
    [((0, 16), (8, 16)), ((4, 0, 16), (8, 16)), ((4, 0), (8, 0)), ((2, 3, 0), (5, 0)),
     ((4, 16), (0, 16))],
)  # fmt: skip
def test_empty_dimensions_match_eager(x, w):
    torch.manual_seed(0)
    args = [torch.randn(x), torch.randn(w), torch.randn(w[0])]
    results = []
    for device in ("cpu", "lazy"):
        tensors = [a.detach().to(device).requires_grad_() for a in args]
        y = F.linear(*tensors)
        y.square().sum().backward()
        results.append([y.cpu(), *(t.grad.cpu() for t in tensors)])
    assert y.grad_fn.name() == FUSED
    for got, want in zip(results[1], results[0]):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_mixed_dtypes_raise_eagers_error():
    x, w, b = torch.randn(4, 16), torch.randn(8, 16, dtype=torch.float64), torch.randn(8)
    with pytest.raises(RuntimeError) as eager:
        F.linear(x, w, b)
    with pytest.raises(RuntimeError) as lazy:
        F.linear(x.to("lazy"), w.to("lazy"), b.to("lazy"))
    assert str(lazy.value) == str(eager.value)


def test_autograd_contract():
    """What autograd promises for any node: its edges lead to the inputs, a second backward
    through freed buffers raises eager's error, retain_graph allows it and accumulates (anomaly
    mode too), an input modified in place after the forward raises the version error, and the
    tensor's and the node's hooks run."""
    x, w, b = (t.to("lazy").requires_grad_() for t in _inputs("linear 2d"))
    y = F.linear(x, w, b)
    assert [type(f).__name__ for f, _ in y.grad_fn.next_functions] == ["AccumulateGrad"] * 3
    seen = []
    y.register_hook(lambda g: seen.append(g.shape))
    y.grad_fn.register_prehook(lambda grads: seen.append("pre"))
    y.grad_fn.register_hook(lambda grads, _: seen.append(len(grads)))
    y.sum().backward(retain_graph=True)
    first = w.grad.cpu().clone()
    with torch.autograd.set_detect_anomaly(True):
        y.sum().backward()
    torch.testing.assert_close(w.grad.cpu(), 2 * first)
    assert seen == [y.shape, "pre", 3] * 2
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()

    weight = torch.randn(8, 16).to("lazy").requires_grad_()
    rows = torch.randn(4, 16).to("lazy")
    out = F.linear(rows, weight)
    rows.add_(1)  # the weight's gradient reads rows
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_saved_tensor_hooks_see_the_inputs():
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t

    x, w = torch.randn(4, 16).to("lazy"), torch.randn(8, 16).to("lazy").requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = F.linear(x, w)
    y.sum().backward()
    assert packed == [(4, 16), (8, 16)]
    torch.testing.assert_close(w.grad.cpu(), torch.ones(4, 8).t() @ x.cpu())


def test_double_backward_in_float32(monkeypatch):
    def penalty(fuse):
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
        x, w, b = (t.to("lazy").requires_grad_() for t in _inputs("linear 3d"))
        y = F.linear(x, w, b)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        gx.square().sum().backward()
        return gx.cpu(), w.grad.cpu(), b.grad.cpu()

    # The two record the same products summed in different orders (XLA's CPU code differs by
    # processor): float32 rounding of sums of values in the hundreds.
    for a, b in zip(penalty(True), penalty(False)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_no_grad_and_inference_mode():
    x, w, b = (t.to("lazy") for t in _inputs("linear 3d"))
    want = F.linear(*_inputs("linear 3d"))
    with torch.no_grad():
        y = F.linear(x, w.requires_grad_(), b)
    with torch.inference_mode():
        z = F.linear(x, w, b)
    for out in (y, z):
        assert out.grad_fn is None and not out.requires_grad
        torch.testing.assert_close(out.cpu(), want)


def test_products_run_at_pytorchs_float32_matmul_precision():
    from lazy_core.dump import ir_text

    x, w = torch.randn(4, 16).to("lazy"), torch.randn(8, 16).to("lazy").requires_grad_()
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 allowed, as for eager's products
    try:
        y = F.linear(x, w)
        y.sum().backward()
    finally:
        torch.set_float32_matmul_precision(previous)
    text = ir_text([w.grad._lazy.node, y._lazy.node])
    assert "lazy.linear(" in text and "lazy.linear_backward(" in text
    assert text.count("_precision='high'") == 2
