"""Tests for lowerings/convolution.py against eager CPU PyTorch."""

import pytest
import torch

from lowerings import LOWERINGS, LoweringContext
from tests.lowerings.util import check_lowering, to_jax, to_torch

aten = torch.ops.aten

_TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.bfloat16: {"atol": 5e-2, "rtol": 2e-2},
}


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# (input shape, weight shape, stride, padding, dilation, groups)
_CONVS = [
    ((2, 3, 11), (4, 3, 3), [1], [0], [1], 1),
    ((2, 4, 12), (6, 2, 4), [3], [2], [2], 2),
    ((2, 3, 9, 10), (4, 3, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((1, 4, 10, 9), (8, 1, 3, 2), [2, 3], [1, 0], [2, 1], 4),
    ((2, 6, 8, 8), (4, 3, 1, 1), [2, 2], [0, 0], [1, 1], 2),
    ((1, 2, 6, 7, 5), (4, 2, 3, 2, 3), [1, 2, 1], [1, 0, 2], [1, 1, 2], 1),
    ((2, 4, 5, 6, 7), (4, 2, 2, 3, 2), [2, 1, 3], [0, 1, 1], [2, 1, 1], 2),
]

# (input shape, weight shape, stride, padding, dilation, output_padding, groups)
_TRANSPOSED = [
    ((2, 3, 7), (3, 4, 3), [2], [1], [1], [1], 1),
    ((1, 4, 6), (4, 3, 2), [3], [0], [2], [2], 2),
    ((2, 2, 5, 6), (2, 3, 3, 3), [2, 2], [1, 1], [1, 1], [1, 0], 1),
    ((1, 4, 5, 4), (4, 2, 3, 2), [1, 3], [2, 0], [1, 2], [0, 2], 2),
    ((1, 2, 4, 3, 5), (2, 3, 2, 3, 2), [2, 1, 2], [0, 1, 1], [1, 1, 2], [1, 0, 0], 1),
    # Padding beyond the dilated kernel: the equivalent normal conv crops its input.
    ((1, 2, 8), (2, 2, 2), [1], [3], [1], [0], 1),
]


def _conv_args(case):
    x, w, stride, padding, dilation, groups = case
    return _rand(*x), _rand(*w), stride, padding, dilation, False, [0] * len(stride), groups


def _transposed_args(case):
    x, w, stride, padding, dilation, output_padding, groups = case
    return _rand(*x), _rand(*w), stride, padding, dilation, True, output_padding, groups


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("case", _CONVS + _TRANSPOSED)
def test_convolution(case, bias):
    args = _conv_args(case) if len(case) == 6 else _transposed_args(case)
    x, w, *rest = args
    out_channels = w.shape[1] * rest[-1] if rest[3] else w.shape[0]
    b = _rand(out_channels) if bias else None
    check_lowering(aten.convolution.default, x, w, b, *rest, **_TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", [_CONVS[3], _CONVS[6], _TRANSPOSED[3]])
def test_convolution_dtypes(case, dtype):
    args = _conv_args(case) if len(case) == 6 else _transposed_args(case)
    x, w, *rest = args
    out_channels = w.shape[1] * rest[-1] if rest[3] else w.shape[0]
    x, w, b = x.to(dtype), w.to(dtype), _rand(out_channels).to(dtype)
    check_lowering(aten.convolution.default, x, w, b, *rest, **_TOL[dtype])


def _backward_args(args, dtype):
    x, w, stride, padding, dilation, transposed, output_padding, groups = args
    x, w = x.to(dtype), w.to(dtype)
    out = aten.convolution.default(x, w, None, stride, padding, dilation, *args[5:])
    grad = _rand(*out.shape).to(dtype)
    bias_sizes = [out.shape[1]]
    return grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", _CONVS + _TRANSPOSED)
def test_convolution_backward(case, dtype):
    args = _conv_args(case) if len(case) == 6 else _transposed_args(case)
    bargs = _backward_args(args, dtype)
    check_lowering(aten.convolution_backward.default, *bargs, [True, True, True], **_TOL[dtype])


def test_convolution_backward_unreached_input():
    # Stride 3 over 11 columns with kernel 3 never reads the last column: its gradient is 0.
    args = _conv_args(((1, 2, 11), (3, 2, 3), [3], [0], [1], 1))
    bargs = _backward_args(args, torch.float32)
    check_lowering(aten.convolution_backward.default, *bargs, [True, True, True])


@pytest.mark.parametrize("mask", [[True, False, False], [False, True, False], [False, False, True]])
def test_convolution_backward_mask(mask):
    bargs = _backward_args(_conv_args(_CONVS[3]), torch.float32)
    op = aten.convolution_backward.default
    full = op(*bargs, [True, True, True])
    expected = op(*bargs, mask)
    # The oracle helper cannot describe undefined outputs, so build the context here; the lowering
    # reads only the slots of the outputs it is asked for.
    ctx = LoweringContext(
        shapes=tuple(tuple(t.shape) for t in full),
        dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in full),
    )
    got = LOWERINGS[str(op)](
        ctx, *[to_jax(a) if isinstance(a, torch.Tensor) else a for a in bargs], mask
    )
    for want, have, needed in zip(expected, got, mask):
        # Eager CPU sometimes computes unrequested gradients anyway; the lowering must not.
        if not needed:
            assert have is None
        else:
            torch.testing.assert_close(to_torch(have), want, atol=1e-4, rtol=1e-5)


def _pool_input(shape, dtype=torch.float32):
    # Small integers make ties common, so the tie-breaking of the indices is exercised.
    return torch.randint(-3, 4, shape).to(dtype)


# (input shape, kernel, stride, padding, dilation, ceil_mode)
_MAX_POOLS = [
    ((2, 3, 8, 8), [2, 2], [], [0, 0], [1, 1], False),
    ((2, 3, 9, 7), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((1, 2, 9, 10), [3, 2], [2, 3], [1, 1], [1, 1], True),
    ((3, 10, 11), [3, 3], [2, 2], [1, 0], [2, 2], True),
    ((1, 2, 7, 7), [2, 2], [2, 2], [1, 1], [1, 1], True),
    ((1, 2, 6, 7, 8), [2, 3, 2], [2, 2, 2], [1, 1, 0], [1, 1, 2], True),
    ((2, 5, 6, 5), [3, 3, 3], [1, 2, 2], [1, 1, 1], [1, 1, 1], False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("case", _MAX_POOLS)
def test_max_pool(case, dtype):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    x = _pool_input(shape, dtype)
    op = (
        aten.max_pool3d_with_indices.default
        if len(kernel) == 3
        else aten.max_pool2d_with_indices.default
    )
    check_lowering(op, x, kernel, stride, padding, dilation, ceil_mode)


def test_max_pool_defaults_and_specials():
    x = _rand(2, 3, 6, 6)
    x[0, 0, 0, :] = float("-inf")
    x[0, 0, 1, :2] = float("-inf")
    x[0, 1, 2, 2] = float("nan")
    x[0, 1, 3, 3] = float("nan")
    x[1, 2] = float("nan")
    check_lowering(aten.max_pool2d_with_indices.default, x, [2, 2])
    check_lowering(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1])
    check_lowering(aten.max_pool3d_with_indices.default, x[None], [1, 2, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", _MAX_POOLS)
def test_max_pool_backward(case, dtype):
    shape, kernel, stride, padding, dilation, ceil_mode = case
    x = _pool_input(shape, dtype)
    n = len(kernel)
    fwd = aten.max_pool3d_with_indices.default if n == 3 else aten.max_pool2d_with_indices.default
    bwd = (
        aten.max_pool3d_with_indices_backward.default
        if n == 3
        else aten.max_pool2d_with_indices_backward.default
    )
    out, indices = fwd(x, kernel, stride, padding, dilation, ceil_mode)
    grad = _rand(*out.shape).to(dtype)
    check_lowering(
        bwd, grad, x, kernel, stride, padding, dilation, ceil_mode, indices, **_TOL[dtype]
    )


# (input shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
_AVG_POOLS = [
    ((2, 3, 8, 8), [2, 2], [], [0, 0], False, True, None),
    ((2, 3, 9, 7), [3, 3], [2, 2], [1, 1], False, True, None),
    ((2, 3, 9, 7), [3, 3], [2, 2], [1, 1], False, False, None),
    ((1, 2, 9, 10), [3, 2], [2, 3], [1, 1], True, True, None),
    ((1, 2, 9, 10), [3, 2], [2, 3], [1, 1], True, False, None),
    ((3, 10, 11), [4, 3], [3, 2], [2, 1], True, False, 5),
    ((1, 2, 7, 7), [2, 2], [2, 2], [1, 1], True, True, None),
    ((1, 2, 11, 5), [3, 1], [3, 1], [0, 0], False, True, None),
    ((1, 2, 6, 7, 8), [2, 3, 2], [2, 2, 2], [1, 1, 0], True, True, None),
    ((2, 5, 6, 5), [3, 3, 3], [1, 2, 2], [1, 1, 1], True, False, None),
    ((2, 5, 6, 5), [3, 3, 3], [1, 2, 2], [1, 1, 1], False, True, 4),
]


def _avg_ops(n):
    if n == 3:
        return aten.avg_pool3d.default, aten.avg_pool3d_backward.default
    return aten.avg_pool2d.default, aten.avg_pool2d_backward.default


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", _AVG_POOLS)
def test_avg_pool(case, dtype):
    shape, kernel, *rest = case
    if dtype == torch.bfloat16 and len(kernel) == 3:
        pytest.skip("eager CPU avg_pool3d has no bfloat16 kernel to compare with")
    fwd, bwd = _avg_ops(len(kernel))
    x = _rand(*shape).to(dtype)
    check_lowering(fwd, x, kernel, *rest, **_TOL[dtype])
    stride, padding, ceil_mode, count_include_pad, divisor = rest
    grad = _rand(*fwd(x, kernel, *rest).shape).to(dtype)
    stride = stride or kernel
    check_lowering(
        bwd, grad, x, kernel, stride, padding, ceil_mode, count_include_pad, divisor, **_TOL[dtype]
    )


def test_avg_pool_int64_truncates():
    x = torch.randint(-20, 20, (1, 2, 7, 7))
    check_lowering(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False)
    check_lowering(aten.avg_pool2d.default, x, [2, 2])


def test_avg_pool_schema_defaults():
    x = _rand(1, 2, 6, 6)
    check_lowering(aten.avg_pool2d.default, x, [2, 2])
    check_lowering(aten.avg_pool2d.default, x, [3, 3], [1, 1], [1, 1], False, False)


# (input shape, output size)
_ADAPTIVE = [
    ((2, 3, 8, 8), [4, 4]),
    ((2, 3, 8, 8), [1, 1]),
    ((2, 3, 7, 9), [3, 4]),
    ((3, 10, 5), [4, 7]),
    ((1, 2, 5, 7), [5, 7]),
    ((1, 2, 6, 7, 5), [2, 3, 4]),
    ((2, 5, 9, 4), [2, 2, 2]),
]


def _adaptive_ops(n, kind):
    if kind == "avg":
        return getattr(aten, f"_adaptive_avg_pool{n}d").default, getattr(
            aten, f"_adaptive_avg_pool{n}d_backward"
        ).default
    return getattr(aten, f"adaptive_max_pool{n}d").default, getattr(
        aten, f"adaptive_max_pool{n}d_backward"
    ).default


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", _ADAPTIVE)
def test_adaptive_avg_pool(case, dtype):
    shape, size = case
    fwd, bwd = _adaptive_ops(len(size), "avg")
    x = _rand(*shape).to(dtype)
    check_lowering(fwd, x, size, **_TOL[dtype])
    grad = _rand(*fwd(x, size).shape).to(dtype)
    check_lowering(bwd, grad, x, **_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("case", _ADAPTIVE)
def test_adaptive_max_pool(case, dtype):
    shape, size = case
    fwd, bwd = _adaptive_ops(len(size), "max")
    x = _pool_input(shape, dtype)
    check_lowering(fwd, x, size)
    out, indices = fwd(x, size)
    grad = _rand(*out.shape).to(dtype)
    check_lowering(bwd, grad, x, indices, **_TOL[dtype])


def test_adaptive_max_pool_nan():
    x = _rand(1, 2, 7, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 0, 2, 0] = float("nan")
    x[0, 1, :3] = float("-inf")
    check_lowering(aten.adaptive_max_pool2d.default, x, [3, 4])
