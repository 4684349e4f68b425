"""Class targets of nll_loss and cross_entropy on device 'lazy' (the TARGETS checks of
lowerings/bounds.py, beside lowerings/losses.py): a target out of range raises eager's error at the
sync that reads the value, and ignored targets, weights, label smoothing and reductions keep
eager's values and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

import lazy_torch

aten = torch.ops.aten
W = torch.tensor([0.5, 2.0, 1.0])  # class weights: 3 classes everywhere


def _loss(kind: str, weighted: bool = False, **kwargs):
    """nll_loss (of log_softmax) or cross_entropy of (input, target), with eager's keywords."""

    def fn(x, t):
        kw = {**kwargs, "weight": W.to(x.device)} if weighted else kwargs
        if kind == "nll":
            return F.nll_loss(x.log_softmax(1 if x.dim() > 1 else 0), t, **kw)
        return F.cross_entropy(x, t, **kw)

    return fn


def _spatial(n, *rest, bad=None, at=(1,)):
    """Targets of shape (n, *rest) in [0, 3), with ``bad`` at ``at``."""
    t = torch.arange(n * math.prod(rest)).reshape(n, *rest) % 3
    if bad is not None:
        t[at] = bad
    return t


# name: (nll or ce, keywords, input shape, targets)
BAD = {
    "nll": ("nll", {}, (4, 3), [0, 1, 3, 2]),
    "nll_negative": ("nll", {}, (4, 3), [0, -1, 1, 2]),
    "nll_below_ignore_index": ("nll", {}, (4, 3), [0, -101, 1, 2]),
    "nll_first_of_several": ("nll", {}, (4, 3), [0, 4, -3, 9]),
    "nll_sum": ("nll", {"reduction": "sum"}, (4, 3), [0, 1, 2, 7]),
    "nll_none": ("nll", {"reduction": "none"}, (4, 3), [5, 1, 2, 0]),
    "nll_weighted": ("nll", {"weighted": True}, (4, 3), [0, 1, 3, 2]),
    "nll_ignored_beside_bad": ("nll", {}, (4, 3), [-100, 1, 3, 2]),
    "nll_custom_ignore": ("nll", {"ignore_index": 1}, (4, 3), [1, 1, -1, 2]),
    "nll_ignores_one_bad_not_another": ("nll", {"ignore_index": 5}, (4, 3), [5, 1, 3, 2]),
    "nll_one_sample": ("nll", {}, (3,), 7),
    "nll_one_sample_negative": ("nll", {"reduction": "sum"}, (3,), -2),
    "nll_3d": ("nll", {}, (2, 3, 4), _spatial(2, 4, bad=3, at=(1, 2))),
    "nll_4d": ("nll", {}, (2, 3, 2, 2), _spatial(2, 2, 2, bad=-1, at=(0, 1, 1))),
    "nll_4d_none": (
        "nll",
        {"reduction": "none"},
        (2, 3, 2, 2),
        _spatial(2, 2, 2, bad=3, at=(1, 0, 0)),
    ),
    "nll_5d": ("nll", {"weighted": True}, (2, 3, 2, 1, 2), _spatial(2, 2, 1, 2, bad=8)),
    "ce": ("ce", {}, (4, 3), [0, 1, 3, 2]),
    "ce_negative": ("ce", {}, (4, 3), [0, -2, 1, 2]),
    "ce_none": ("ce", {"reduction": "none"}, (4, 3), [0, 1, 2, 3]),
    "ce_weighted": ("ce", {"weighted": True}, (4, 3), [0, 1, 3, 2]),
    "ce_smoothing": ("ce", {"label_smoothing": 0.1}, (4, 3), [0, 1, 3, 2]),
    "ce_smoothing_none": (
        "ce",
        {"label_smoothing": 0.2, "reduction": "none"},
        (4, 3),
        [-1, 1, 2, 0],
    ),
    # Eager reaches the nll target check before its composite gathers the targets' class weights.
    "ce_smoothing_weighted": (
        "ce",
        {"weighted": True, "label_smoothing": 0.1},
        (4, 3),
        [0, 1, 3, 2],
    ),
    "ce_smoothing_weighted_sum": (
        "ce",
        {"weighted": True, "label_smoothing": 0.3, "reduction": "sum"},
        (4, 3),
        [0, -4, 1, 2],
    ),
    "ce_one_sample": ("ce", {}, (3,), 3),
    "ce_4d": ("ce", {}, (2, 3, 2, 2), _spatial(2, 2, 2, bad=4, at=(1, 1, 1))),
    "ce_4d_smoothing_weighted": (
        "ce",
        {"weighted": True, "label_smoothing": 0.1},
        (2, 3, 2, 2),
        _spatial(2, 2, 2, bad=-3, at=(0, 0, 1)),
    ),
    "ce_3d_custom_ignore": ("ce", {"ignore_index": 2}, (2, 3, 4), _spatial(2, 4, bad=3, at=(0, 3))),
}

# Valid targets: ignored ones (the default, custom ones in range, above it and negative), class
# weights, label smoothing; each under every reduction.
GOOD = {
    "nll": ("nll", {}, (4, 3), [0, 1, 2, 2]),
    "nll_default_ignore": ("nll", {}, (4, 3), [0, -100, 2, 1]),
    "nll_custom_ignore_in_range": ("nll", {"ignore_index": 1}, (4, 3), [1, 1, 2, 0]),
    "nll_custom_ignore_above": ("nll", {"ignore_index": 7}, (4, 3), [7, 1, 2, 7]),
    "nll_custom_ignore_negative": (
        "nll",
        {"weighted": True, "ignore_index": -5},
        (4, 3),
        [0, -5, 2, 1],
    ),
    "nll_one_sample": ("nll", {}, (3,), 2),
    "nll_one_sample_ignored": ("nll", {}, (3,), -100),
    "nll_3d_ignore": (
        "nll",
        {"weighted": True, "ignore_index": -1},
        (2, 3, 4),
        _spatial(2, 4, bad=-1, at=(1, 2)),
    ),
    "nll_4d": ("nll", {}, (2, 3, 2, 2), _spatial(2, 2, 2, bad=-100, at=(1, 0, 1))),
    "nll_5d": ("nll", {"weighted": True}, (2, 3, 2, 1, 2), _spatial(2, 2, 1, 2)),
    "ce": ("ce", {}, (4, 3), [0, 1, 2, 1]),
    "ce_ignore": ("ce", {"ignore_index": 3}, (4, 3), [0, 3, 2, 1]),
    "ce_weighted": ("ce", {"weighted": True}, (4, 3), [0, -100, 2, 1]),
    "ce_smoothing": ("ce", {"label_smoothing": 0.1}, (4, 3), [0, -100, 2, 1]),
    "ce_smoothing_weighted": (
        "ce",
        {"weighted": True, "label_smoothing": 0.2, "ignore_index": 9},
        (4, 3),
        [0, 9, 2, 1],
    ),
    "ce_4d_smoothing_weighted": (
        "ce",
        {"weighted": True, "label_smoothing": 0.1},
        (2, 3, 2, 2),
        _spatial(2, 2, 2, bad=-100, at=(0, 1, 0)),
    ),
    "ce_one_sample": ("ce", {"label_smoothing": 0.1}, (3,), 1),
    "ce_probabilities": ("ce", {"weighted": True}, (4, 3), torch.eye(3)[[0, 1, 2, 1]]),
}


def _x(shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


def _outcome(kind, kwargs, shape, target, device: str):
    """("ok", loss, d(loss.sum())/d(input)) on the CPU, or ("error", type, message)."""
    x = _x(shape).to(device).requires_grad_()
    target = torch.as_tensor(target).to(device)
    try:
        loss = _loss(kind, **kwargs)(x, target)
        (grad,) = torch.autograd.grad(loss.sum(), x)
        return ("ok", loss.detach().cpu(), grad.cpu())
    except Exception as e:  # noqa: BLE001 (its traceback would keep the pending loss alive)
        return ("error", type(e), str(e))


@pytest.mark.parametrize("name", sorted(BAD))
def test_an_out_of_range_target_raises_eagers_error(name):
    expected = _outcome(*BAD[name], "cpu")
    assert expected[0] == "error" and expected[1] is IndexError, expected
    assert _outcome(*BAD[name], "lazy") == expected
    lazy_torch.mark_step(wait=True)  # reported once: nothing left fails a later barrier


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", sorted(GOOD))
def test_valid_targets_keep_eagers_values_and_gradients(name, reduction):
    kind, kwargs, shape, target = GOOD[name]
    case = (kind, {**kwargs, "reduction": reduction}, shape, target)
    expected = _outcome(*case, "cpu")
    got = _outcome(*case, "lazy")
    assert expected[0] == "ok" and got[0] == "ok", (expected, got)
    torch.testing.assert_close(got[1], expected[1], equal_nan=True)
    torch.testing.assert_close(got[2], expected[2], equal_nan=True)
    lazy_torch.mark_step(wait=True)


# The backward ops called directly: (op, input shape, targets, the one out of range).
BACKWARD = {
    "nll_loss": (aten.nll_loss_backward.default, (4, 3), [0, 1, 3, 2], 3),
    "nll_loss_one_sample": (aten.nll_loss_backward.default, (3,), -1, -1),
    "nll_loss2d": (aten.nll_loss2d_backward.default, (2, 3, 2, 2), _spatial(2, 2, 2, bad=5), 5),
}


def _backward_outcome(op, shape, target, reduction, device, ignore_index=-100):
    x, target = _x(shape).log_softmax(1 if len(shape) > 1 else 0), torch.as_tensor(target)
    grad = torch.ones(target.shape) if reduction == 0 else torch.tensor(1.5)
    args = (grad, x, target, W, reduction, ignore_index, torch.tensor(2.0))
    try:
        out = op(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))
        return ("ok", out.cpu())
    except Exception as e:  # noqa: BLE001 (its traceback would keep the pending result alive)
        return ("error", type(e), str(e))


@pytest.mark.parametrize("reduction", [1, 2])
@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_the_backward_ops_raise_eagers_error(name, reduction):
    op, shape, target, _ = BACKWARD[name]
    expected = _backward_outcome(op, shape, target, reduction, "cpu")
    assert expected[0] == "error", expected
    assert _backward_outcome(op, shape, target, reduction, "lazy") == expected
    lazy_torch.mark_step(wait=True)


@pytest.mark.parametrize("name", ["nll_loss", "nll_loss2d"])
def test_the_unreduced_backward_ops_raise_where_eager_checks_nothing(name):
    # Eager's CPU kernels skip the check for reduction='none' and write outside the target's row
    # (or past the buffer): eager is not run here. Every other case raises this error.
    op, shape, target, bad = BACKWARD[name]
    expected = ("error", IndexError, f"Target {bad} is out of bounds.")
    assert _backward_outcome(op, shape, target, 0, "lazy") == expected
    lazy_torch.mark_step(wait=True)


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_the_backward_ops_skip_ignored_targets(name, reduction):
    op, shape, target, bad = BACKWARD[name]
    expected = _backward_outcome(op, shape, target, reduction, "cpu", ignore_index=bad)
    got = _backward_outcome(op, shape, target, reduction, "lazy", ignore_index=bad)
    assert expected[0] == "ok" and got[0] == "ok", (expected, got)
    torch.testing.assert_close(got[1], expected[1])
    lazy_torch.mark_step(wait=True)


# ------------------------------------------------------------------------------------------------
# Where the error is raised: at the sync that reads the value, never while recording, and a failed
# sync leaves every value as it was.

MESSAGE = r"^Target 3 is out of bounds\.$"


def _bad_loss(x):
    return F.cross_entropy(x, torch.tensor([0, 1, 3, 2]).to(x.device))


def test_recording_the_loss_and_its_backward_runs_nothing():
    x = _x((4, 3)).to("lazy").requires_grad_()
    loss = _bad_loss(x)
    loss.backward()
    assert lazy_torch.metrics.counters().get("executions", 0) == 0
    with pytest.raises(IndexError, match=MESSAGE):
        x.grad.cpu()
    with pytest.raises(IndexError, match=MESSAGE):
        loss.item()
    del loss, x
    lazy_torch.mark_step(wait=True)


def test_a_failed_item_leaves_every_value_intact():
    x = _x((4, 3)).to("lazy")
    p = torch.ones(3, device="lazy")
    p.add_(x.sum(0))  # pending in-place update of a tensor the failed graph may compute too
    y = x * 2
    loss = _bad_loss(x)
    with pytest.raises(IndexError, match=MESSAGE):
        loss.item()
    torch.testing.assert_close(p.cpu(), 1 + _x((4, 3)).sum(0))
    torch.testing.assert_close(y.cpu(), _x((4, 3)) * 2)
    torch.testing.assert_close(x.cpu(), _x((4, 3)))
    del loss
    lazy_torch.mark_step(wait=True)  # nothing left behind fails a later barrier


def test_a_training_step_with_a_bad_target_reports_at_the_next_barrier_once():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 3).to("lazy")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(4, 2).to("lazy")
    loss = _bad_loss(model(data))
    loss.backward()
    opt.step()
    lazy_torch.mark_step()  # asynchronous: returns before the check is read
    with pytest.raises(IndexError, match=MESSAGE):
        lazy_torch.mark_step()
    lazy_torch.mark_step(wait=True)  # reported once


def test_a_value_of_a_step_with_a_bad_target_raises_when_read():
    x = _x((4, 3)).to("lazy")
    total = x.sum()
    loss = _bad_loss(x)
    lazy_torch.mark_step()  # the step computes total and the failing loss
    with pytest.raises(IndexError, match=MESSAGE):
        total.item()
    del loss
    assert total.item() == pytest.approx(float(_x((4, 3)).sum()))  # reported once
