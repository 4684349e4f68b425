"""float32 matmuls follow PyTorch's precision setting, never XLA's TF32 default."""

import pytest
import torch

import lazy_torch


@pytest.fixture
def restore_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_float32_matmul_runs_at_full_precision_by_default():
    a, b = torch.randn(64, 128, dtype=torch.float32), torch.randn(128, 32, dtype=torch.float32)
    got = a.to("lazy") @ b.to("lazy")
    assert "_precision='highest'" in lazy_torch.debug.ir_text(got)
    torch.testing.assert_close(got.cpu(), a @ b, rtol=1e-5, atol=1e-5)


def test_precision_setting_reaches_the_graph(restore_precision):
    a = torch.randn(8, 8, device="lazy")
    torch.set_float32_matmul_precision("high")
    assert "_precision='high'" in lazy_torch.debug.ir_text(a @ a)
    torch.set_float32_matmul_precision("medium")
    assert "_precision='medium'" in lazy_torch.debug.ir_text(a @ a)


def test_float64_and_bfloat16_matmuls_keep_their_dtype():
    a = torch.randn(16, 16, dtype=torch.float64)
    got = (a.to("lazy") @ a.to("lazy")).cpu()
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, a @ a, rtol=1e-12, atol=1e-12)
    h = a.to(torch.bfloat16)
    got = (h.to("lazy") @ h.to("lazy")).cpu()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), (h @ h).float(), rtol=2e-2, atol=5e-2)
