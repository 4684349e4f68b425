"""The changes lazy_torch makes to torch.optim (lazy_torch/optim_support.py): each applies to the
installed torch, a target in another form is left out with a warning, and calls on other tensors
go to PyTorch's own functions unchanged."""

import importlib
import warnings

import pytest
import torch
from torch.utils import _foreach_utils

from lazy_torch import optim_support
from lazy_torch.tensor import LazyTensor

# torch.optim drops its submodules' names from its namespace
adam, sgd, optimizer, swa_utils = (
    importlib.import_module(f"torch.optim.{name}")
    for name in ("adam", "sgd", "optimizer", "swa_utils")
)


def test_every_patch_applies_to_this_torch():
    assert optim_support.skipped == []
    for module in (_foreach_utils, optimizer, swa_utils):
        assert "lazy" in module._get_foreach_kernels_supported_devices()
    for module in (_foreach_utils, optimizer):
        assert "lazy" in module._get_fused_kernels_supported_devices()
        assert LazyTensor in module._foreach_supported_types
    assert adam._multi_tensor_adam.lazy_original is not None
    assert sgd._multi_tensor_sgd.lazy_original is not None


def test_a_foreach_function_of_another_form_is_left_alone_with_one_warning(monkeypatch):
    def other_sgd(params, grads, momentum_buffer_list, *, lr):  # lacks arguments the route reads
        raise AssertionError("not called")

    monkeypatch.setattr(sgd, "_multi_tensor_sgd", other_sgd)
    monkeypatch.setattr(optim_support, "skipped", [])
    with pytest.warns(RuntimeWarning, match="torch.optim.sgd._multi_tensor_sgd"):
        optim_support._route_foreach_steps()
    assert sgd._multi_tensor_sgd is other_sgd
    ((patch, reason),) = optim_support.skipped
    assert patch == "torch.optim.sgd._multi_tensor_sgd" and "has_sparse_grad" in reason


def test_installing_again_changes_nothing():
    routed = adam._multi_tensor_adam
    devices = _foreach_utils._get_foreach_kernels_supported_devices
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optim_support.install()
    assert adam._multi_tensor_adam is routed
    assert _foreach_utils._get_foreach_kernels_supported_devices is devices
    assert devices().count("lazy") == 1


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_cpu_parameters_step_as_with_pytorchs_own_functions(kind, monkeypatch):
    def run() -> list[torch.Tensor]:
        torch.manual_seed(0)
        params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
        if kind == "adamw":
            opt = torch.optim.AdamW(params, lr=0.1, foreach=True)
        else:
            opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True)
        for _ in range(3):
            opt.zero_grad()
            sum((p * p).sum() for p in params).backward()
            opt.step()
        return [p.detach().clone() for p in params]

    patched = run()
    for module, name in (
        (adam, "_multi_tensor_adam"),
        (sgd, "_multi_tensor_sgd"),
    ):
        monkeypatch.setattr(module, name, getattr(module, name).lazy_original)
    for got, want in zip(patched, run()):
        assert torch.equal(got, want)
