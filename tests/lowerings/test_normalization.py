"""Tests for lowerings/normalization.py against eager CPU PyTorch."""

from __future__ import annotations

import jax
import pytest
import torch

from lowerings import LOWERINGS, LoweringContext
from tests.lowerings.util import check_lowering, run_lowering, to_jax, to_torch

aten = torch.ops.aten
EPS = 1e-5
# One bfloat16 ulp is 2**-8 relative; values rounded from slightly different float32 results may
# land one ulp apart.
BF16_TOL = {"atol": 2e-2, "rtol": 1e-2}
SHAPES = [(6, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 2, 3, 2)]


def _tol(dtype: torch.dtype) -> dict:
    return BF16_TOL if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float32).to(dtype)


def _channel_params(c: int, dtype=torch.float32, affine=True):
    if not affine:
        return None, None
    return _randn(c, dtype=dtype), _randn(c, dtype=dtype)


def _running_stats(c: int, dtype=torch.float32):
    return _randn(c, dtype=dtype) * 0.1, torch.rand(c, dtype=torch.float32).to(dtype) + 0.5


def _lower_direct(name, outputs, *args):
    """Run the lowering ``name`` on ``args``; ``outputs`` give the node's shapes and dtypes.

    ``None`` outputs (undefined gradients) get a placeholder, as the lowering must not use it.
    """
    outputs = [torch.empty(0) if o is None else o for o in outputs]
    ctx = LoweringContext(
        shapes=tuple(tuple(o.shape) for o in outputs),
        dtypes=tuple(str(o.dtype).removeprefix("torch.") for o in outputs),
    )
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def fn(*arrays):
        full = list(args)
        for i, array in zip(tensors, arrays):
            full[i] = array
        return LOWERINGS[name](ctx, *full)

    return jax.jit(fn)(*(to_jax(args[i]) for i in tensors))


def _assert_grads(expected, got, tol=None):
    """Compare backward outputs where ``None`` marks a gradient aten leaves undefined."""
    tol = tol or {"atol": 1e-5, "rtol": 1e-5}
    assert len(expected) == len(got), (len(expected), len(got))
    for exp, g in zip(expected, got):
        if exp is None:
            assert g is None
            continue
        g = to_torch(g)
        assert g.dtype == exp.dtype, (g.dtype, exp.dtype)
        assert g.shape == exp.shape, (g.shape, exp.shape)
        torch.testing.assert_close(g, exp, **tol)


def check_backward(op, *args, **tol):
    """``check_lowering`` for backward ops whose ``output_mask`` may leave outputs undefined."""
    expected = op(*args)
    _assert_grads(expected, _lower_direct(str(op), expected, *args), tol)


# ------------------------------------------------------------------------------------------------
# Batch norm


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_native_batch_norm(shape, training, affine):
    torch.manual_seed(0)
    c = shape[1]
    x = _randn(*shape) * 2 + 0.5
    weight, bias = _channel_params(c, affine=affine)
    rm, rv = _running_stats(c)
    check_lowering(aten.native_batch_norm.default, x, weight, bias, rm, rv, training, 0.1, EPS)


def test_native_batch_norm_without_running_stats():
    torch.manual_seed(1)
    x = _randn(4, 3, 5)
    check_lowering(aten.native_batch_norm.default, x, None, None, None, None, True, 0.1, EPS)


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float64, torch.float64),
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
    ],
    ids=["f64", "bf16-mixed", "bf16"],
)
@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_dtypes(dtypes, training):
    torch.manual_seed(2)
    x_dtype, param_dtype = dtypes
    x = _randn(4, 3, 6, dtype=x_dtype)
    weight, bias = _channel_params(3, param_dtype)
    rm, rv = _running_stats(3, param_dtype)
    check_lowering(
        aten.native_batch_norm.default, x, weight, bias, rm, rv, training, 0.1, EPS, **_tol(x_dtype)
    )


@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_legit(training):
    torch.manual_seed(3)
    x = _randn(2, 4, 3, 3)
    weight, bias = _channel_params(4)
    rm, rv = _running_stats(4)
    check_lowering(
        aten._native_batch_norm_legit.default, x, weight, bias, rm, rv, training, 0.1, 1e-3
    )


@pytest.mark.parametrize("affine", [True, False])
def test_native_batch_norm_legit_no_stats(affine):
    torch.manual_seed(4)
    x = _randn(5, 2, 7)
    weight, bias = _channel_params(2, affine=affine)
    check_lowering(aten._native_batch_norm_legit.no_stats, x, weight, bias, True, 0.1, EPS)


@pytest.mark.parametrize("shape", SHAPES)
def test_native_batch_norm_legit_no_training(shape):
    torch.manual_seed(5)
    c = shape[1]
    x = _randn(*shape)
    weight, bias = _channel_params(c)
    rm, rv = _running_stats(c)
    check_lowering(
        aten._native_batch_norm_legit_no_training.default, x, weight, bias, rm, rv, 0.1, EPS
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("momentum", [0.1, 0.5])
def test_native_batch_norm_legit_functional(shape, training, momentum):
    """The new running statistics: momentum blend with the unbiased batch variance."""
    torch.manual_seed(6)
    c = shape[1]
    x = _randn(*shape) * 3 - 1
    weight, bias = _channel_params(c)
    rm, rv = _running_stats(c)
    check_lowering(
        aten._native_batch_norm_legit_functional.default,
        *(x, weight, bias, rm, rv, training, momentum, EPS),
    )


def test_native_batch_norm_legit_functional_single_value_per_channel():
    """The unbiased variance of one value is 0 / 0: aten's new running variance is nan.

    A large eps keeps invstd near 1: with eps=1e-5 it is ~316, and aten's ``x * a + b`` form of
    the normalization then cancels catastrophically where this lowering's ``x - mean`` is exact.
    """
    torch.manual_seed(23)
    x = _randn(1, 3)
    weight, bias = _channel_params(3)
    rm, rv = _running_stats(3)
    check_lowering(
        aten._native_batch_norm_legit_functional.default,
        *(x, weight, bias, rm, rv, True, 0.1, 1.0),
    )


def test_native_batch_norm_legit_functional_bf16():
    torch.manual_seed(7)
    x = _randn(4, 3, 8, dtype=torch.bfloat16)
    weight, bias = _channel_params(3, torch.bfloat16)
    rm, rv = _running_stats(3, torch.bfloat16)
    check_lowering(
        aten._native_batch_norm_legit_functional.default,
        *(x, weight, bias, rm, rv, True, 0.1, EPS),
        **BF16_TOL,
    )


def test_batch_norm_update_variants():
    torch.manual_seed(8)
    x = _randn(3, 4, 5)
    weight, bias = _channel_params(4)
    rm, rv = _running_stats(4)
    check_lowering(
        aten._batch_norm_with_update_functional.default, x, weight, bias, rm, rv, 0.1, EPS
    )
    check_lowering(aten._batch_norm_no_update.default, x, weight, bias, rm, rv, 0.1, EPS)


MASKS = [[True, True, True], [True, False, False], [False, True, True], [True, False, True]]
# Without affine parameters aten accepts no request for their gradients.
AFFINE_MASKS = [(True, mask) for mask in MASKS] + [(False, [True, False, False])]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("mask", MASKS)
def test_native_batch_norm_backward(shape, train, mask):
    torch.manual_seed(9)
    c = shape[1]
    x = _randn(*shape)
    weight, bias = _channel_params(c)
    rm, rv = _running_stats(c)
    _, save_mean, save_invstd = aten.native_batch_norm.default(
        x, weight, bias, rm.clone(), rv.clone(), train, 0.1, EPS
    )
    grad = _randn(*shape)
    check_backward(
        aten.native_batch_norm_backward.default,
        *(grad, x, weight, rm, rv, save_mean, save_invstd, train, EPS, mask),
    )


@pytest.mark.parametrize("train", [True, False])
def test_native_batch_norm_backward_without_weight(train):
    torch.manual_seed(10)
    x = _randn(4, 2, 3)
    rm, rv = _running_stats(2)
    _, save_mean, save_invstd = aten.native_batch_norm.default(
        x, None, None, rm.clone(), rv.clone(), train, 0.1, EPS
    )
    check_backward(
        aten.native_batch_norm_backward.default,
        *(_randn(4, 2, 3), x, None, rm, rv, save_mean, save_invstd, train, EPS, [True] * 3),
    )


def test_native_batch_norm_backward_bf16():
    torch.manual_seed(11)
    x = _randn(4, 3, 6, dtype=torch.bfloat16)
    weight, bias = _channel_params(3)
    rm, rv = _running_stats(3)
    _, save_mean, save_invstd = aten.native_batch_norm.default(
        x, weight, bias, rm.clone(), rv.clone(), True, 0.1, EPS
    )
    grad = _randn(4, 3, 6, dtype=torch.bfloat16)
    check_backward(
        aten.native_batch_norm_backward.default,
        *(grad, x, weight, rm, rv, save_mean, save_invstd, True, EPS, [True] * 3),
        **BF16_TOL,
    )


@pytest.mark.parametrize("mask", MASKS)
def test_batch_norm_backward(mask):
    torch.manual_seed(12)
    x = _randn(3, 4, 5)
    weight, bias = _channel_params(4)
    rm, rv = _running_stats(4)
    _, save_mean, save_invstd, reserve, _, _ = aten._batch_norm_with_update_functional.default(
        x, weight, bias, rm, rv, 0.1, EPS
    )
    check_backward(
        aten.batch_norm_backward.default,
        *(_randn(3, 4, 5), x, weight, rm, rv, save_mean, save_invstd, True, EPS, mask, reserve),
    )


# ------------------------------------------------------------------------------------------------
# Layer norm

LAYER_CASES = [((4, 7), (7,)), ((2, 3, 5), (5,)), ((2, 3, 5), (3, 5)), ((2, 2, 3, 4), (2, 3, 4))]


@pytest.mark.parametrize("shape,normalized", LAYER_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_native_layer_norm(shape, normalized, affine):
    torch.manual_seed(13)
    x = _randn(*shape) * 2 + 1
    weight = _randn(*normalized) if affine != "none" else None
    bias = _randn(*normalized) if affine == "both" else None
    check_lowering(aten.native_layer_norm.default, x, list(normalized), weight, bias, EPS)


@pytest.mark.parametrize("param_dtype", [None, torch.float32, torch.bfloat16])
def test_native_layer_norm_bf16(param_dtype):
    torch.manual_seed(14)
    x = _randn(3, 4, 16, dtype=torch.bfloat16)
    weight = bias = None
    if param_dtype is not None:
        weight, bias = _randn(16, dtype=param_dtype), _randn(16, dtype=param_dtype)
    check_lowering(aten.native_layer_norm.default, x, [16], weight, bias, EPS, **BF16_TOL)


@pytest.mark.parametrize("shape,normalized", LAYER_CASES)
@pytest.mark.parametrize("affine,mask", AFFINE_MASKS)
def test_native_layer_norm_backward(shape, normalized, affine, mask):
    torch.manual_seed(15)
    x = _randn(*shape)
    weight = _randn(*normalized) if affine else None
    bias = _randn(*normalized) if affine else None
    _, mean, rstd = aten.native_layer_norm.default(x, list(normalized), weight, bias, EPS)
    check_backward(
        aten.native_layer_norm_backward.default,
        *(_randn(*shape), x, list(normalized), mean, rstd, weight, bias, mask),
    )


def test_native_layer_norm_backward_bf16():
    torch.manual_seed(16)
    x = _randn(4, 32, dtype=torch.bfloat16)
    weight, bias = _randn(32, dtype=torch.bfloat16), _randn(32, dtype=torch.bfloat16)
    _, mean, rstd = aten.native_layer_norm.default(x, [32], weight, bias, EPS)
    check_backward(
        aten.native_layer_norm_backward.default,
        *(_randn(4, 32, dtype=torch.bfloat16), x, [32], mean, rstd, weight, bias, [True] * 3),
        atol=5e-2,
        rtol=2e-2,
    )


# ------------------------------------------------------------------------------------------------
# Group norm

# Groups of few elements are avoided: their rstd can be huge, and roundoff with it.
GROUP_CASES = [((2, 6, 4, 4), 3), ((3, 4, 5), 2), ((4, 8), 2), ((2, 8, 2, 3, 2), 1)]


def _group_dims(shape):
    n, c = shape[:2]
    hxw = 1
    for s in shape[2:]:
        hxw *= s
    return n, c, hxw


@pytest.mark.parametrize("shape,group", GROUP_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_native_group_norm(shape, group, affine):
    torch.manual_seed(17)
    x = _randn(*shape) * 2 - 1
    weight, bias = _channel_params(shape[1], affine=affine)
    check_lowering(aten.native_group_norm.default, x, weight, bias, *_group_dims(shape), group, EPS)


def test_native_group_norm_bf16():
    torch.manual_seed(18)
    x = _randn(2, 4, 3, 3, dtype=torch.bfloat16)
    weight, bias = _channel_params(4)
    check_lowering(aten.native_group_norm.default, x, weight, bias, 2, 4, 9, 2, EPS, **BF16_TOL)


@pytest.mark.parametrize("shape,group", GROUP_CASES)
@pytest.mark.parametrize("affine,mask", AFFINE_MASKS)
def test_native_group_norm_backward(shape, group, affine, mask):
    torch.manual_seed(19)
    x = _randn(*shape)
    weight, bias = _channel_params(shape[1], affine=affine)
    dims = _group_dims(shape)
    _, mean, rstd = aten.native_group_norm.default(x, weight, bias, *dims, group, EPS)
    check_backward(
        aten.native_group_norm_backward.default,
        *(_randn(*shape), x, mean, rstd, weight, *dims, group, mask),
    )


# ------------------------------------------------------------------------------------------------
# RMS norm: ``_fused_rms_norm`` decomposes on CPU and its backward has no CPU kernel, so the
# backward is checked against autograd through the forward.


@pytest.mark.parametrize("shape,normalized", LAYER_CASES)
@pytest.mark.parametrize("eps", [None, 1e-3])
@pytest.mark.parametrize("affine", [True, False])
def test_fused_rms_norm(shape, normalized, eps, affine):
    torch.manual_seed(20)
    x = _randn(*shape)
    weight = _randn(*normalized) if affine else None
    check_lowering(aten._fused_rms_norm.default, x, list(normalized), weight, eps)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32, "same"])
def test_fused_rms_norm_dtypes(x_dtype, weight_dtype):
    torch.manual_seed(21)
    x = _randn(3, 4, 16, dtype=x_dtype)
    weight = None
    if weight_dtype is not None:
        weight = _randn(16, dtype=x_dtype if weight_dtype == "same" else weight_dtype)
    tol = BF16_TOL if x_dtype in (torch.bfloat16, torch.float16) else {}
    check_lowering(aten._fused_rms_norm.default, x, [16], weight, None, **tol)


def test_fused_rms_norm_zero_input_uses_compute_dtype_eps():
    """The default eps is float32's for a bfloat16 input: rstd of zeros is 1/sqrt(eps)."""
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    check_lowering(aten._fused_rms_norm.default, x, [8], None, None, **BF16_TOL)


@pytest.mark.parametrize("shape,normalized", LAYER_CASES)
@pytest.mark.parametrize(
    "affine,mask",
    [(True, (True, True)), (True, (True, False)), (True, (False, True)), (False, (True, False))],
)
def test_fused_rms_norm_backward(shape, normalized, affine, mask):
    torch.manual_seed(22)
    x = _randn(*shape).requires_grad_()
    weight = _randn(*normalized).requires_grad_() if affine else None
    out, rstd = aten._fused_rms_norm.default(x, list(normalized), weight, EPS)
    grad = _randn(*shape)
    expected = torch.autograd.grad(out, (x, weight) if affine else (x,), grad)
    got = _lower_direct(
        "aten._fused_rms_norm_backward.default",
        expected + (x,) * (2 - len(expected)),
        *(
            grad,
            x.detach(),
            tuple(normalized),
            rstd.detach(),
            None if weight is None else weight.detach(),
            mask,
        ),
    )
    _assert_grads(tuple(e if m else None for e, m in zip(expected + (None,), mask)), got)


def test_batch_norm_eval_saved_stats_are_empty():
    """In eval mode aten returns empty saved statistics; the lowering must too."""
    x = _randn(2, 3, 4)
    rm, rv = _running_stats(3)
    expected, got = run_lowering(
        aten.native_batch_norm.default, x, None, None, rm, rv, False, 0.1, EPS
    )
    assert (
        [tuple(t.shape) for t in got]
        == [tuple(t.shape) for t in expected]
        == [
            (2, 3, 4),
            (0,),
            (0,),
        ]
    )
