"""Tests for lowerings/losses.py against eager CPU PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.lowerings.util import check_lowering, run_lowering

aten = torch.ops.aten
REDUCTIONS = [0, 1, 2]
BF16_TOL = {"atol": 2e-2, "rtol": 1e-2}


def _tol(dtype: torch.dtype) -> dict:
    return BF16_TOL if dtype == torch.bfloat16 else {}


def _grad_output(loss: torch.Tensor) -> torch.Tensor:
    return torch.randn(loss.shape, dtype=torch.float32).to(loss.dtype)


# ------------------------------------------------------------------------------------------------
# nll_loss / nll_loss2d


def _log_probs(*shape, dtype=torch.float32, dim=1):
    return torch.randn(*shape).log_softmax(dim if len(shape) > 1 else 0).to(dtype)


def _targets(shape, classes, ignore_index, ignore_some):
    target = torch.randint(0, classes, shape)
    if ignore_some:
        target.view(-1)[::3] = ignore_index
    return target


NLL_CASES = [
    # (input shape, target shape)
    ((6, 4), (6,)),
    ((1, 3), (1,)),
    ((5,), ()),
]


@pytest.mark.parametrize("shape,target_shape", NLL_CASES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_nll_loss_forward_backward(shape, target_shape, reduction, weighted, ignore_index):
    torch.manual_seed(0)
    classes = shape[-1] if len(shape) == 1 else shape[1]
    x = _log_probs(*shape)
    target = _targets(target_shape, classes, ignore_index, ignore_some=True)
    weight = torch.rand(classes) + 0.1 if weighted else None
    check_lowering(aten.nll_loss_forward.default, x, target, weight, reduction, ignore_index)
    loss, total_weight = aten.nll_loss_forward.default(x, target, weight, reduction, ignore_index)
    check_lowering(
        aten.nll_loss_backward.default,
        *(_grad_output(loss), x, target, weight, reduction, ignore_index, total_weight),
    )


@pytest.mark.parametrize("shape,target_shape", NLL_CASES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_all_ignored(shape, target_shape, reduction, weighted):
    """Mean over nothing is 0/0 = nan in aten; the gradient is still all zeros."""
    classes = shape[-1] if len(shape) == 1 else shape[1]
    x = _log_probs(*shape)
    target = torch.full(target_shape, -100, dtype=torch.int64)
    weight = torch.rand(classes) + 0.1 if weighted else None
    check_lowering(aten.nll_loss_forward.default, x, target, weight, reduction, -100)
    loss, total_weight = aten.nll_loss_forward.default(x, target, weight, reduction, -100)
    check_lowering(
        aten.nll_loss_backward.default,
        *(_grad_output(loss), x, target, weight, reduction, -100, total_weight),
    )


@pytest.mark.parametrize("shape,target", [((4,), 1), ((1, 4), [1]), ((3, 4), [1, 1, 2])])
@pytest.mark.parametrize("total_weight", [5.0, 0.0])
def test_nll_loss_backward_zero_class_weight(shape, target, total_weight):
    """The gradient scales by the total weight passed in; 0 * (1 / 0) is nan as in aten."""
    x = _log_probs(*shape)
    weight = torch.tensor([1.0, 0.0, 3.0, 1.0])
    for reduction in REDUCTIONS:
        grad = torch.ones(shape[:1] if reduction == 0 and len(shape) > 1 else ())
        check_lowering(
            aten.nll_loss_backward.default,
            *(grad * 2, x, torch.tensor(target), weight, reduction, -100),
            torch.tensor(total_weight),
        )


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_dtypes(dtype, reduction):
    torch.manual_seed(1)
    x = _log_probs(8, 5, dtype=dtype)
    target = _targets((8,), 5, -100, ignore_some=True)
    weight = (torch.rand(5) + 0.1).to(dtype)
    check_lowering(aten.nll_loss_forward.default, x, target, weight, reduction, -100, **_tol(dtype))
    loss, total_weight = aten.nll_loss_forward.default(x, target, weight, reduction, -100)
    check_lowering(
        aten.nll_loss_backward.default,
        *(_grad_output(loss), x, target, weight, reduction, -100, total_weight),
        **_tol(dtype),
    )


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 4, 1, 3)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 0])
def test_nll_loss2d_forward_backward(shape, reduction, weighted, ignore_index):
    torch.manual_seed(2)
    n, c, h, w = shape
    x = _log_probs(*shape)
    target = _targets((n, h, w), c, ignore_index, ignore_some=True)
    weight = torch.rand(c) + 0.1 if weighted else None
    check_lowering(aten.nll_loss2d_forward.default, x, target, weight, reduction, ignore_index)
    loss, total_weight = aten.nll_loss2d_forward.default(x, target, weight, reduction, ignore_index)
    check_lowering(
        aten.nll_loss2d_backward.default,
        *(_grad_output(loss), x, target, weight, reduction, ignore_index, total_weight),
    )


# ------------------------------------------------------------------------------------------------
# Pointwise regression losses: (op, backward op, extra float parameter values to try)

POINTWISE = [
    (aten.mse_loss.default, aten.mse_loss_backward.default, [None]),
    (aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default, [None, 0.5, 0.0, 2.0]),
    (aten.huber_loss.default, aten.huber_loss_backward.default, [None, 0.5, 2.0]),
]
POINTWISE_CASES = [(fwd, bwd, param) for fwd, bwd, params in POINTWISE for param in params]
SHAPES = [(), (7,), (3, 4), (2, 3, 5)]


def _pointwise_inputs(shape, dtype=torch.float32):
    x = torch.randn(shape) * 2
    target = torch.randn(shape) * 2
    # Exact ties (d == 0) and the beta/delta boundaries exercise the branch choices.
    if x.numel() >= 4:
        target.view(-1)[0] = x.view(-1)[0]
        target.view(-1)[1] = x.view(-1)[1] - 0.5
        target.view(-1)[2] = x.view(-1)[2] + 2.0
    return x.to(dtype), target.to(dtype)


def _pointwise_extra(fwd, reduction, param):
    """Extra forward and backward arguments; ``None`` leaves a forward default out, as PyTorch's
    dispatcher does (the backward ops have no defaults)."""
    forward = () if reduction is None else (reduction,)
    if param is not None:
        forward = (1 if reduction is None else reduction, param)
    backward = (1 if reduction is None else reduction,)
    if fwd is not aten.mse_loss.default:
        backward += (1.0 if param is None else param,)
    return forward, backward


@pytest.mark.parametrize("fwd,bwd,param", POINTWISE_CASES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", [None, 0, 1, 2])
def test_pointwise_losses(fwd, bwd, param, shape, reduction):
    torch.manual_seed(3)
    x, target = _pointwise_inputs(shape)
    forward, backward = _pointwise_extra(fwd, reduction, param)
    check_lowering(fwd, x, target, *forward)
    check_lowering(bwd, _grad_output(fwd(x, target, *forward)), x, target, *backward)


@pytest.mark.parametrize("fwd,bwd,param", POINTWISE_CASES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_pointwise_losses_bf16(fwd, bwd, param, reduction):
    torch.manual_seed(4)
    x, target = _pointwise_inputs((4, 6), torch.bfloat16)
    forward, backward = _pointwise_extra(fwd, reduction, param)
    check_lowering(fwd, x, target, *forward, **BF16_TOL)
    grad = _grad_output(fwd(x, target, *forward))
    check_lowering(bwd, grad, x, target, *backward, **BF16_TOL)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss_broadcasts(reduction):
    torch.manual_seed(5)
    with pytest.warns(UserWarning):
        torch.nn.functional.mse_loss(torch.randn(3, 1), torch.randn(3))
    check_lowering(aten.mse_loss.default, torch.randn(3, 1), torch.randn(4), reduction)


# ------------------------------------------------------------------------------------------------
# Binary losses


def _probabilities(shape, dtype=torch.float32):
    p = torch.rand(shape) * 0.98 + 0.01
    if p.numel() >= 4:
        # Exact 0 and 1 hit the -100 floor on the log terms.
        p.view(-1)[0] = 0.0
        p.view(-1)[1] = 1.0
    return p.to(dtype)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("reduction", [None, 0, 1, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy(shape, reduction, weighted):
    torch.manual_seed(6)
    x = _probabilities(shape)
    target = torch.rand(shape)
    weight = torch.rand(shape[-1:]) if weighted else None
    args = (x, target, weight) + (() if reduction is None else (reduction,))
    if not weighted and reduction is None:
        args = (x, target)
    check_lowering(aten.binary_cross_entropy.default, *args)
    # Away from 0 and 1: there the gradient is (x - t) / 1e-12 and differs by roundoff only.
    x = torch.rand(shape) * 0.98 + 0.01
    loss = aten.binary_cross_entropy.default(*((x,) + args[1:]))
    check_lowering(
        aten.binary_cross_entropy_backward.default, _grad_output(loss), x, *args[1:], rtol=1e-4
    )


def test_binary_cross_entropy_saturated_gradient():
    x = torch.tensor([0.0, 1.0, 0.5, 1e-7])
    target = torch.tensor([0.0, 1.0, 1.0, 0.0])
    check_lowering(
        aten.binary_cross_entropy_backward.default, torch.tensor(1.0), x, target, None, 2
    )


def test_binary_cross_entropy_bf16():
    torch.manual_seed(7)
    x = _probabilities((4, 8), torch.bfloat16)
    target = torch.rand(4, 8).to(torch.bfloat16)
    for reduction in REDUCTIONS:
        check_lowering(aten.binary_cross_entropy.default, x, target, None, reduction, **BF16_TOL)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pos_weighted", [False, True])
def test_binary_cross_entropy_with_logits(shape, reduction, weighted, pos_weighted):
    torch.manual_seed(8)
    x = torch.randn(shape) * 4
    x.view(-1)[0] = 100.0
    x.view(-1)[1] = -100.0
    target = torch.rand(shape)
    weight = torch.rand(shape[-1:]) if weighted else None
    pos_weight = torch.rand(shape[-1:]) * 3 if pos_weighted else None
    check_lowering(
        aten.binary_cross_entropy_with_logits.default, x, target, weight, pos_weight, reduction
    )


def test_binary_cross_entropy_with_logits_defaults():
    torch.manual_seed(9)
    check_lowering(
        aten.binary_cross_entropy_with_logits.default, torch.randn(3, 5), torch.rand(3, 5)
    )


@pytest.mark.parametrize("shape", [(), (6,), (3, 4)])
@pytest.mark.parametrize("reduction", [None, 0, 1, 2])
def test_soft_margin_loss(shape, reduction):
    torch.manual_seed(10)
    x = torch.randn(shape) * 3
    target = torch.randn(shape).sign()
    extra = () if reduction is None else (reduction,)
    check_lowering(aten.soft_margin_loss.default, x, target, *extra)
    loss = aten.soft_margin_loss.default(x, target, *extra)
    check_lowering(
        aten.soft_margin_loss_backward.default,
        *(_grad_output(loss), x, target, 1 if reduction is None else reduction),
    )


# ------------------------------------------------------------------------------------------------
# Multi-class margin losses


@pytest.mark.parametrize("shape", [(5, 4), (4,), (1, 3)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,margin", [(1, 1.0), (2, 0.7), (1, 0.0)])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin_loss(shape, reduction, p, margin, weighted):
    torch.manual_seed(4)
    classes = shape[-1]
    x = torch.randn(shape)
    target = torch.randint(0, classes, shape[:-1])
    weight = torch.rand(classes) + 0.1 if weighted else None
    args = (x, target, p, margin, weight, reduction)
    check_lowering(aten.multi_margin_loss.default, *args)
    loss = aten.multi_margin_loss.default(*args)
    check_lowering(aten.multi_margin_loss_backward.default, _grad_output(loss), *args)


@pytest.mark.parametrize(
    "x,target",
    [(torch.tensor(0.3), torch.tensor(0)), (torch.randn(5), torch.tensor([3]))],
    ids=["0-d", "target-of-one"],
)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_margin_loss_unbatched_shapes(x, target, reduction):
    args = (x, target, 2, 1.0, None, reduction)
    check_lowering(aten.multi_margin_loss.default, *args)
    loss = aten.multi_margin_loss.default(*args)
    check_lowering(aten.multi_margin_loss_backward.default, _grad_output(loss), *args)


def test_multilabel_margin_loss_0d():
    x, target = torch.tensor(0.4), torch.tensor(0)
    check_lowering(aten.multilabel_margin_loss_forward.default, x, target, 0)
    _, is_target = aten.multilabel_margin_loss_forward.default(x, target, 0)
    check_lowering(
        aten.multilabel_margin_loss_backward.default, torch.tensor(2.0), x, target, 0, is_target
    )


def test_multi_margin_loss_hinge_at_zero():
    """A hinge exactly at 0 contributes neither loss nor gradient (strict > 0 as in aten)."""
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 1.0, 0.5]])
    target = torch.tensor([1, 0])
    args = (x, target, 1, 1.0, None, 2)
    check_lowering(aten.multi_margin_loss.default, *args)
    check_lowering(aten.multi_margin_loss_backward.default, torch.tensor(1.5), *args)


MULTILABEL_TARGETS = [
    torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [1, 1, -1, 2], [-1, 2, 0, 1]]),
    torch.tensor([2, -1, 0, 0]),
]


@pytest.mark.parametrize("target", MULTILABEL_TARGETS, ids=["batched", "unbatched"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss(target, reduction):
    torch.manual_seed(5)
    x = torch.randn(target.shape)
    check_lowering(aten.multilabel_margin_loss_forward.default, x, target, reduction)
    loss, is_target = aten.multilabel_margin_loss_forward.default(x, target, reduction)
    check_lowering(
        aten.multilabel_margin_loss_backward.default,
        *(_grad_output(loss), x, target, reduction, is_target),
    )


def test_multilabel_margin_loss_float64():
    x = torch.randn(3, 4, dtype=torch.float64)
    target = MULTILABEL_TARGETS[0][:3]
    check_lowering(aten.multilabel_margin_loss_forward.default, x, target, 1)
    _, is_target = aten.multilabel_margin_loss_forward.default(x, target, 1)
    check_lowering(
        aten.multilabel_margin_loss_backward.default,
        *(torch.tensor(0.7, dtype=torch.float64), x, target, 1, is_target),
    )


# ------------------------------------------------------------------------------------------------
# CTC


def _ctc_case(concatenated, tensor_lengths, seed=6):
    torch.manual_seed(seed)
    steps, batch, classes = 12, 3, 5
    log_probs = torch.randn(steps, batch, classes).log_softmax(2)
    input_lengths = [12, 9, 11]
    target_lengths = [4, 0, 3]
    targets = torch.randint(1, classes, (batch, 5))
    targets[0, 1] = targets[0, 2]  # a repeated label must keep its blank in between
    if concatenated:
        targets = torch.cat([targets[i, :n] for i, n in enumerate(target_lengths)])
    if tensor_lengths:
        input_lengths, target_lengths = torch.tensor(input_lengths), torch.tensor(target_lengths)
    return log_probs, targets, input_lengths, target_lengths


@pytest.mark.parametrize("concatenated", [False, True])
@pytest.mark.parametrize("tensor_lengths", [False, True])
@pytest.mark.parametrize("blank", [0, 4])
def test_ctc_loss_forward_backward(concatenated, tensor_lengths, blank):
    log_probs, targets, input_lengths, target_lengths = _ctc_case(concatenated, tensor_lengths)
    if blank:
        targets = targets - 1
    overload = "Tensor" if tensor_lengths else "default"
    forward = getattr(aten._ctc_loss, overload)
    backward = getattr(aten._ctc_loss_backward, overload)
    args = (log_probs, targets, input_lengths, target_lengths, blank)
    nll, log_alpha = forward(*args)
    # log_alpha past each sample's input and target lengths is scratch space in aten.
    _, (got_nll, _) = run_lowering(forward, *args)
    torch.testing.assert_close(got_nll, nll)
    grad = torch.rand(nll.shape) + 0.5
    check_lowering(backward, grad, *args[:4], nll, log_alpha, blank, atol=1e-4, rtol=1e-4)


def test_ctc_loss_impossible_alignment_zero_infinity():
    """A target longer than its input has infinite loss; zero_infinity zeroes its gradient."""
    torch.manual_seed(7)
    log_probs = torch.randn(4, 2, 3).log_softmax(2)
    targets = torch.tensor([[1, 2, 1, 2, 1], [1, 2, 0, 0, 0]])
    args = (log_probs, targets, [4, 4], [5, 2], 0, True)
    nll, log_alpha = aten._ctc_loss.default(*args)
    assert torch.isinf(nll[0])
    _, (got_nll, _) = run_lowering(aten._ctc_loss.default, *args)
    torch.testing.assert_close(got_nll, nll)
    check_lowering(
        aten._ctc_loss_backward.default,
        *(torch.ones(2), log_probs, targets, [4, 4], [5, 2], nll, log_alpha, 0, True),
        atol=1e-4,
        rtol=1e-4,
    )
