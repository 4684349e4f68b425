"""Linear layers under lazy autocast as one node and one backward node (lazy_torch/linear.py).

Oracles: the same calls through the ordinary kernels (``LAZY_FUSE_LINEAR=0``: autocast's casts,
then ``addmm``/``mm`` and their autograd), which must give the same bits, and eager
``torch.autocast('cpu')``, whose matmuls also run in bfloat16, up to bfloat16 rounding.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import runtime
from lazy_torch.amp import autocast

BF16 = torch.bfloat16
FUSED = "_AutocastLinearBackward"


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


def _run(kind, device, fuse=True, monkeypatch=None):
    """The layer's output, its grad_fn's name, and the gradients of x, w, b."""
    if monkeypatch is not None:
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
    tensors = [None if t is None else t.to(device).requires_grad_() for t in _inputs(kind)]
    ctx = autocast(dtype=BF16) if device == "lazy" else torch.autocast("cpu", dtype=BF16)
    y = _layer(kind, *tensors, ctx)
    y.float().square().sum().backward()
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


def test_fewer_ops_and_the_same_step(monkeypatch):
    def step(fuse):
        monkeypatch.setattr(runtime.config, "FUSE_LINEAR", fuse)
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)
        )
        model = model.to("lazy")
        x = torch.randn(8, 16).to("lazy")
        with CountOps() as ops:
            with autocast(dtype=BF16):
                loss = model(x).float().logsumexp(-1).mean()
            loss.backward()
        return ops.count, loss.item(), [p.grad.cpu() for p in model.parameters()]

    fused, loss, grads = step(True)
    ordinary, loss0, grads0 = step(False)
    assert fused < ordinary - 10  # two layers: casts, transposes, products, their backward
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
