"""The C++ ``make_wrapper`` (lazy_torch/csrc/wrapper.cpp) against PyTorch's
``_make_wrapper_subclass``, its errors, and the build's fallback."""

from __future__ import annotations

import pytest
import torch

import runtime
from lazy_torch import _wrapper
from lazy_torch.tensor import LazyTensor, make_wrapper

DEVICE = torch.device("lazy", 0)


def _describe(t: torch.Tensor) -> tuple:
    return (
        type(t), t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, t.layout,
        t.requires_grad, t.is_leaf, t.is_contiguous(), str(torch._C._dispatch_keys(t)),
        t.untyped_storage().nbytes(),
    )  # fmt: skip


def test_in_use_wherever_the_package_installed():
    assert make_wrapper is not torch.Tensor._make_wrapper_subclass


@pytest.mark.parametrize(
    "shape, extra",
    [
        ((2, 3), {}),
        ((), {}),
        ((0, 4), {}),
        ((5, 1, 7), {"requires_grad": True}),
        ((2, 3), {"strides": (1, 2), "storage_offset": 1}),
        ((4, 3), {"strides": (0, 1), "storage_offset": 0}),  # expanded
        ((3, 0), {"strides": (1, 3), "storage_offset": 5}),
        ((2, 2), {"strides": (2, 1), "storage_offset": 3, "requires_grad": True}),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_matches_make_wrapper_subclass(shape, extra, dtype):
    made = []
    for make in (make_wrapper, torch.Tensor._make_wrapper_subclass):
        try:
            made.append(_describe(make(LazyTensor, shape, dtype=dtype, device=DEVICE, **extra)))
        except RuntimeError as e:  # integer tensors that require grad
            made.append(str(e))
    assert made[0] == made[1]


def test_the_class_sees_its_ops():
    calls = []

    class Seen(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            return make_wrapper(cls, args[0].shape, dtype=args[0].dtype, device=DEVICE)

        __torch_function__ = torch._C._disabled_torch_function_impl

    t = make_wrapper(Seen, (3,), dtype=torch.float32, device=DEVICE)
    out = t + t
    assert type(out) is Seen and calls == [torch.ops.aten.add.Tensor]


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((int, (2,)), {}, TypeError, "cls must be a torch.Tensor subclass"),
        ((LazyTensor, (2,)), {"device": DEVICE}, TypeError, "dtype"),
        ((LazyTensor, (2,)), {"dtype": torch.float32, "device": "lazy"}, TypeError, "device"),
        ((LazyTensor, (2, "a")), {}, TypeError, "shape must be a tuple of ints"),
        ((LazyTensor, 2), {}, TypeError, "shape must be a tuple of ints"),
        ((LazyTensor, (2, 3)), {"strides": (1,)}, ValueError, "differ in length"),
        ((LazyTensor, (2, -1)), {}, ValueError, "negative dimension"),
        ((LazyTensor, (2,)), {"pin_memory": True}, TypeError, "unexpected keyword"),
        ((LazyTensor,), {}, TypeError, "2 positional arguments"),
    ],
)
def test_bad_arguments(args, kwargs, error, match):
    full = {"dtype": torch.float32, "device": DEVICE}
    if "device" in kwargs and "dtype" not in kwargs:
        full = {}
    with pytest.raises(error, match=match):
        make_wrapper(*args, **{**full, **kwargs})


def test_a_failed_build_says_where_its_output_is_and_is_tried_once(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(runtime.config, "EXTENSION_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that always fails
    with pytest.raises(ImportError, match=r"failed; the compiler's output is in .*\.failed"):
        _wrapper.load()
    assert "building lazy_torch_wrapper" in capfd.readouterr().err
    assert len(list(tmp_path.glob("*.failed"))) == 1
    with pytest.raises(ImportError, match="remove that file to try again"):
        _wrapper.load()
    assert capfd.readouterr().err == ""  # not tried again for the same torch and source


# Autograd's detaches of lazy tensors: wrapper.cpp's own route to __torch_dispatch__, and
# PyTorch's (set_detach(None, None)), must give the same tensors and errors.


@pytest.fixture(params=["extension", "pytorch"])
def detach_route(request):
    from lazy_torch.tensor import extension

    if request.param == "pytorch":
        extension.set_detach(None, None)
    yield request.param
    extension.set_detach(LazyTensor.__torch_dispatch__, torch.ops.aten.detach.default)


def test_saved_outputs_are_lazy_and_gradients_match_eager(detach_route):
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    lx = x.detach().to("lazy").requires_grad_()
    for t in (x, lx):
        y = t.exp().tanh().sigmoid()  # each saves its output
        y.sum().backward()
    saved, eager = lx.exp().grad_fn._saved_result, x.exp().grad_fn._saved_result
    assert type(saved) is LazyTensor
    assert (saved.requires_grad, saved.is_leaf, type(saved.grad_fn)) == (
        eager.requires_grad,
        eager.is_leaf,
        type(eager.grad_fn),
    )
    torch.testing.assert_close(saved.cpu(), eager.detach())
    torch.testing.assert_close(lx.grad.cpu(), x.grad)
    d = lx.exp().data
    assert type(d) is LazyTensor and not d.requires_grad
    torch.testing.assert_close(d.cpu(), x.detach().exp())


def test_modifying_a_saved_output_raises_eagers_error(detach_route):
    def error(device: str) -> str:
        t = torch.ones(4, device=device, requires_grad=True)
        y = t.exp()
        y.add_(1)
        with pytest.raises(RuntimeError) as e:
            y.sum().backward()
        return str(e.value).split("]], ")[1]  # after the tensor's type name

    assert error("lazy") == error("cpu")
    assert "is at version 1; expected version 0" in error("cpu")


def test_a_dispatch_mode_sees_the_detach(detach_route):
    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.funcs = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.funcs.append(func)
            return func(*args, **(kwargs or {}))

    x = torch.ones(2, device="lazy", requires_grad=True)
    with Seen() as seen:
        x.exp()
    assert torch.ops.aten.detach.default in seen.funcs


def test_an_error_in_the_detach_reaches_the_caller():
    from lazy_torch.tensor import extension

    def failing(func, types, args, kwargs):
        raise ValueError("detach failed")

    x = torch.ones(2, device="lazy", requires_grad=True)
    extension.set_detach(failing, torch.ops.aten.detach.default)
    try:
        with pytest.raises(ValueError, match="detach failed"):
            x.exp()  # autograd saves the output
    finally:
        extension.set_detach(LazyTensor.__torch_dispatch__, torch.ops.aten.detach.default)
    assert x.exp().grad_fn is not None
