"""Tests for lowerings/linalg.py against eager CPU PyTorch."""

import pytest
import torch

from tests.lowerings.util import check_lowering, run_lowering

aten = torch.ops.aten

# bf16 products accumulate in fp32 on both sides but round differently along the way.
_TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}
_FLOATS = list(_TOL)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("dtype", _FLOATS)
def test_mm(dtype):
    check_lowering(
        aten.mm.default, _rand(5, 7, dtype=dtype), _rand(7, 3, dtype=dtype), **_TOL[dtype]
    )


def test_mm_large_k_float32_is_full_precision():
    # Catches a lowering that lets XLA pick a reduced (bf16/TF32-like) matmul precision.
    a, b = _rand(16, 512), _rand(512, 16)
    check_lowering(aten.mm.default, a, b, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.complex64])
def test_mm_other_dtypes(dtype):
    if dtype.is_complex:
        a, b = torch.randn(4, 5, dtype=dtype), torch.randn(5, 2, dtype=dtype)
    else:
        a, b = torch.randint(-9, 9, (4, 5), dtype=dtype), torch.randint(-9, 9, (5, 2), dtype=dtype)
    check_lowering(aten.mm.default, a, b)


def test_mm_transposed_operand():
    check_lowering(aten.mm.default, _rand(7, 5).t(), _rand(3, 7).t())


@pytest.mark.parametrize("dtype", _FLOATS)
def test_bmm(dtype):
    check_lowering(
        aten.bmm.default, _rand(3, 4, 6, dtype=dtype), _rand(3, 6, 2, dtype=dtype), **_TOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_mv_dot(dtype):
    check_lowering(aten.mv.default, _rand(4, 6, dtype=dtype), _rand(6, dtype=dtype), **_TOL[dtype])
    check_lowering(aten.dot.default, _rand(9, dtype=dtype), _rand(9, dtype=dtype), **_TOL[dtype])


def test_dot_int64():
    check_lowering(aten.dot.default, torch.arange(5), torch.arange(5) - 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128])
def test_vdot(dtype):
    a, b = torch.randn(6, dtype=dtype), torch.randn(6, dtype=dtype)
    check_lowering(aten.vdot.default, a, b)


@pytest.mark.parametrize("dtype", _FLOATS)
@pytest.mark.parametrize(
    "kw", [{}, {"beta": 0.5, "alpha": 2.0}, {"beta": 0, "alpha": -1.5}, {"beta": 2, "alpha": 1}]
)
def test_addmm(dtype, kw):
    check_lowering(
        aten.addmm.default,
        _rand(3, dtype=dtype),
        _rand(4, 5, dtype=dtype),
        _rand(5, 3, dtype=dtype),
        **kw,
        **_TOL[dtype],
    )


def test_addmm_full_self():
    check_lowering(aten.addmm.default, _rand(4, 3), _rand(4, 5), _rand(5, 3), beta=-0.25)


def test_addmm_beta_zero_ignores_nan():
    self = torch.full((4, 3), float("nan"))
    expected, (got,) = run_lowering(aten.addmm.default, self, _rand(4, 5), _rand(5, 3), beta=0)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected)


def test_addmm_int64():
    a = torch.randint(-5, 5, (3, 4))
    b = torch.randint(-5, 5, (4, 2))
    check_lowering(aten.addmm.default, torch.randint(-5, 5, (2,)), a, b, beta=3, alpha=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"beta": 0.5, "alpha": 2.0}, {"beta": 0}])
def test_baddbmm_addbmm(dtype, kw):
    b1, b2 = _rand(3, 4, 5, dtype=dtype), _rand(3, 5, 2, dtype=dtype)
    check_lowering(aten.baddbmm.default, _rand(4, 2, dtype=dtype), b1, b2, **kw, **_TOL[dtype])
    check_lowering(aten.baddbmm.default, _rand(3, 4, 2, dtype=dtype), b1, b2, **kw, **_TOL[dtype])
    check_lowering(aten.addbmm.default, _rand(4, 2, dtype=dtype), b1, b2, **kw, **_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"beta": -1.5, "alpha": 0.25}, {"beta": 0}])
def test_addmv_addr(dtype, kw):
    check_lowering(
        aten.addmv.default,
        _rand(4, dtype=dtype),
        _rand(4, 6, dtype=dtype),
        _rand(6, dtype=dtype),
        **kw,
        **_TOL[dtype],
    )
    check_lowering(
        aten.addr.default,
        _rand(4, 3, dtype=dtype),
        _rand(4, dtype=dtype),
        _rand(3, dtype=dtype),
        **kw,
        **_TOL[dtype],
    )


def test_addr_bool():
    self = torch.tensor([[True, False], [False, False], [True, True]])
    v1, v2 = torch.tensor([True, False, True]), torch.tensor([False, True])
    check_lowering(aten.addr.default, self, v1, v2)
    check_lowering(aten.addr.default, self, v1, v2, beta=False)
    check_lowering(aten.addr.default, self, v1, v2, alpha=False)


@pytest.mark.parametrize(
    "shapes",
    [
        ((5,), (5,)),
        ((3, 5), (5,)),
        ((5,), (5, 2)),
        ((3, 5), (5, 2)),
        ((2, 3, 5), (5, 4)),
        ((5,), (2, 5, 4)),
        ((2, 1, 3, 5), (4, 5, 2)),
    ],
)
def test_matmul(shapes):
    check_lowering(aten.matmul.default, _rand(*shapes[0]), _rand(*shapes[1]))


def test_matmul_bf16():
    a, b = _rand(2, 3, 8, dtype=torch.bfloat16), _rand(8, 4, dtype=torch.bfloat16)
    check_lowering(aten.matmul.default, a, b, **_TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_linear(dtype):
    x, w, b = _rand(2, 3, 6, dtype=dtype), _rand(4, 6, dtype=dtype), _rand(4, dtype=dtype)
    check_lowering(aten.linear.default, x, w, b, **_TOL[dtype])
    check_lowering(aten.linear.default, x, w, **_TOL[dtype])
    check_lowering(aten.linear.default, _rand(6, dtype=dtype), w, b, **_TOL[dtype])
