"""Eager's checks that meta kernels skip (lazy_torch/eager_checks.py), against eager CPU."""

from __future__ import annotations

import warnings

import pytest
import torch

import lazy_torch
from lazy_torch import eager_checks

DEV = "lazy"


def _outcome(fn, device):
    """What ``fn(device)`` gives: each output's (shape, dtype, values), or the error it raises."""
    try:
        out = fn(device)
    except Exception as e:  # noqa: BLE001 (the error is the result)
        return type(e), str(e)
    outs = out if isinstance(out, tuple) else (out,)
    return [(tuple(t.shape), t.dtype, t.cpu().tolist()) for t in outs]


def _same_as_eager(fn):
    eager, lazy = _outcome(fn, "cpu"), _outcome(fn, DEV)
    assert lazy == eager
    return eager


# ----------------------------------------------------------------------------------------------
# Reductions with no identity over an empty dimension.

EMPTY_REDUCTIONS = {
    "max": lambda x: x.max(),
    "max.dim": lambda x: x.max(0),
    "max.dim keepdim": lambda x: x.max(-x.dim(), keepdim=True),
    "min": lambda x: x.min(),
    "min.dim": lambda x: x.min(0),
    "amax": lambda x: x.amax(0),
    "amax all": lambda x: x.amax(),
    "amin": lambda x: x.amin(0),
    "argmax": lambda x: x.argmax(),
    "argmax.dim": lambda x: x.argmax(0),
    "argmin.dim": lambda x: x.argmin(0),
    "aminmax": lambda x: torch.aminmax(x),
    "aminmax.dim": lambda x: torch.aminmax(x, dim=0),
    "kthvalue": lambda x: x.kthvalue(1, 0),
    "median": lambda x: x.median(0),
    "nanmedian": lambda x: x.nanmedian(0),
    "mode": lambda x: x.mode(0),
    "max out": lambda x: torch.amax(x, 0, out=torch.empty(0, device=x.device)),
}


@pytest.mark.parametrize("shape", [(0,), (0, 3)])
@pytest.mark.parametrize("name", list(EMPTY_REDUCTIONS))
def test_empty_reduction_raises_eager_error_at_the_call(name, shape):
    reduce = EMPTY_REDUCTIONS[name]
    result = _same_as_eager(lambda d: reduce(torch.ones(shape, device=d)))
    assert isinstance(result, tuple) and issubclass(result[0], Exception)
    lazy_torch.mark_step(wait=True)  # nothing failed was recorded: later barriers still work


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: x.max(1),
        lambda x: x.amin(1),
        lambda x: x.argmax(1, keepdim=True),
        lambda x: torch.aminmax(x, dim=1),
        lambda x: x.mode(1),
        lambda x: x[:, :0].median(0),
    ],
)
def test_empty_tensor_reduced_over_a_nonempty_dim_matches_eager(reduce):
    _same_as_eager(lambda d: reduce(torch.ones(0, 3, device=d)))


def test_empty_reduction_check_replays_once_per_signature(monkeypatch):
    calls = []
    replay = eager_checks.replay
    monkeypatch.setattr(
        eager_checks, "replay", lambda *a: calls.append(a[0]) or replay(*a), raising=True
    )
    x = torch.ones(0, 7, device=DEV)  # a signature no other test records
    for _ in range(3):
        assert tuple(x.amax(1).shape) == (0,)
    assert len(calls) == 1
    for _ in range(3):  # non-empty inputs are never replayed
        torch.ones(2, 7, device=DEV).amax(1)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.float16])
@pytest.mark.parametrize(
    "kwargs", [{}, {"dim": 0}, {"dim": -1, "keepdim": True}, {"keepdim": True}]
)
def test_aminmax_matches_eager(dtype, kwargs):
    values = torch.tensor([[1.5, -2.0, 3.0], [0.0, 4.0, -1.0]]).to(dtype)
    _same_as_eager(lambda d: torch.aminmax(values.to(d), **kwargs))
    _same_as_eager(lambda d: torch.aminmax(values[0, 0].to(d), **kwargs))


def test_aminmax_propagates_nan():
    x = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    eager = torch.aminmax(x, dim=1)
    lazy = torch.aminmax(x.to(DEV), dim=1)
    for e, v in zip(eager, lazy):
        torch.testing.assert_close(v.cpu(), e, equal_nan=True)


# ----------------------------------------------------------------------------------------------
# pow of bools: eager's dtype, not the meta kernel's.

BOOL_POWS = {
    "Tensor_Scalar False": lambda b: torch.pow(b, False),
    "Tensor_Scalar True": lambda b: torch.pow(b, True),
    "operator": lambda b: b**True,
    "0-dim base": lambda b: torch.pow(b[0], False),
    "in place": lambda b: b.clone().pow_(False),
    "in place True": lambda b: b.clone().pow_(True),
    "out": lambda b: torch.pow(b, True, out=torch.empty(3, dtype=torch.bool, device=b.device)),
    "out long": lambda b: torch.pow(
        b, False, out=torch.empty(3, dtype=torch.long, device=b.device)
    ),
    "then arithmetic": lambda b: torch.pow(b, True) * 2 + torch.pow(b, False),
    "int exponent": lambda b: torch.pow(b, 2),
    "float exponent": lambda b: torch.pow(b, 0.5),
    "int base": lambda b: torch.pow(b.long(), True),
    "bool exponent of an int": lambda b: torch.pow(3, b),
}


@pytest.mark.parametrize("name", list(BOOL_POWS))
def test_bool_pow_matches_eager(name):
    values = torch.tensor([True, False, True])
    result = _same_as_eager(lambda d: BOOL_POWS[name](values.to(d)))
    assert isinstance(result, list)


@pytest.mark.parametrize("op", ["log_softmax", "softmax"])
@pytest.mark.parametrize("shape", [(1, 0), (1, 2)])
def test_kernels_eager_skips_for_empty_tensors(op, shape):
    """Eager's softmax kernels refuse bool tensors, but not empty ones (the meta kernel refuses
    both): an empty result takes eager's metadata."""
    _same_as_eager(
        lambda device: getattr(torch.ones(shape, dtype=torch.bool, device=device), op)(1)
    )


# ----------------------------------------------------------------------------------------------
# In-place ops whose input shares memory with the written tensor.

OVERLAPS = {
    "partial column": lambda x: x[:1].sub_(x[:1, 0]),
    "shifted": lambda x: x[0, 1:].mul_(x[0, :-1]),
    "transposed self": lambda x: x[:, :2].contiguous().view(2, 2).add_(x[:, :2].t()),
    "clamp bound": lambda x: x[0].clamp_(min=x[0, 2:3]),
    "lerp weight": lambda x: x[0].lerp_(x[1], x[0, :1]),
    "addcmul": lambda x: x[0].addcmul_(x[1], x[0, 1:2]),
    "masked_fill value": lambda x: x[0].masked_fill_(x[1] > 6, x[0, 0]),
    "dtype view": lambda x: x.view(torch.int32)[0, :2].add_(x.view(torch.int32)[0, 1:3]),
    "scatter from self": lambda x: x.scatter_(0, x[:1].long() * 0, x),
    "index_add from self": lambda x: x.index_add_(0, torch.arange(2, device=x.device), x),
    # Full overlap and disjoint views are fine.
    "self": lambda x: x.add_(x),
    "same view": lambda x: x.mul_(x[:]),
    "other row": lambda x: x[0].mul_(x[1]),
    "empty": lambda x: x[0, :0].add_(x[0, :0]),
    "matmul": lambda x: x[:, :2].addmm_(x[:, :2], x[:, 2:4]),
}


@pytest.mark.parametrize("name", list(OVERLAPS))
def test_inplace_overlap_matches_eager(name):
    def run(device):
        x = torch.arange(10.0, device=device).reshape(2, 5)
        OVERLAPS[name](x)
        return x

    _same_as_eager(run)


# out= calls whose out tensor shares memory with an input (cat refuses any overlap).
OUT_OVERLAPS = {
    "cat into its input": lambda x: torch.cat([x, x], -1, out=x),
    "cat of its own halves": lambda x: torch.cat([x[:, :2], x[:, 2:]], -1, out=x),
    "stack into a view of its input": lambda x: torch.stack([x[0], x[1]], out=x[:, :0]),
    "add into itself": lambda x: torch.add(x, 1, out=x),
    "add into a shifted view": lambda x: torch.add(x[:, 1:], 1, out=x[:, :4]),
    "mul into another row": lambda x: torch.mul(x[0], 2, out=x[1]),
    # Out tensors whose own elements share memory: eager accepts overlapping windows (not an
    # expand's repeated elements) and writes element by element in its loops' order, each
    # reading what earlier ones wrote (differential seed 100688).
    "clamp into itself, overlapping": lambda x: _into_itself(x.unfold(1, 3, 1), torch.clamp, 4.0),
    "add into itself, overlapping": lambda x: _into_itself(x.unfold(1, 3, 1), torch.add, 1),
    "where into itself, overlapping": lambda x: _into_itself(x.unfold(1, 2, 1), _where_above_2),
    "neg into overlapping windows": lambda x: torch.neg(
        torch.arange(9.0, device=x.device).view(3, 3), out=x[0].unfold(0, 3, 1)
    ),
    "neg into a window of one element": lambda x: torch.neg(x[1], out=x[0].as_strided((5,), (0,))),
    "cumsum into overlapping windows": lambda x: torch.cumsum(
        x[:, :3] * 1, 1, out=x[0].unfold(0, 3, 1)[:2]
    ),
    "add into an expanded row": lambda x: _into_itself(x[:1].expand(3, 5), torch.add, 1),
}


def _into_itself(w, op, *args):
    return op(w, *args, out=w)


def _where_above_2(w, out):  # other: a value per element of a window, so the last write shows
    return torch.where(w > 2, w, -torch.arange(2.0, device=w.device), out=out)


@pytest.mark.parametrize("name", list(OUT_OVERLAPS))
def test_out_overlap_matches_eager(name):
    def run(device):
        x = torch.arange(10.0, device=device).reshape(2, 5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager's warning for resized outs
            OUT_OVERLAPS[name](x)
        return x

    _same_as_eager(run)


def test_inplace_overlap_refusal_keeps_the_target():
    x = torch.ones(1, 5, device=DEV)
    with pytest.raises(RuntimeError, match="some elements of the input tensor and the written-to"):
        x.sub_(x[:, 0])
    assert x.cpu().tolist() == [[1.0] * 5]


def test_inplace_overlap_replays_once_per_layout(monkeypatch):
    calls = []
    replay = eager_checks._replay_aliased
    monkeypatch.setattr(eager_checks, "_replay_aliased", lambda *a: calls.append(1) or replay(*a))
    for _ in range(3):
        x = torch.ones(3, 11, device=DEV)
        x.add_(x)
        x[0].add_(x[1])
    assert len(calls) == 2
    y = torch.ones(11, device=DEV)
    for _ in range(3):  # no shared storage: no replay
        y.add_(torch.ones(11, device=DEV))
    assert len(calls) == 2


def test_copy_between_partly_overlapping_views_raises_as_eager():
    for device in ("cpu", "lazy"):
        x = torch.arange(6.0, device=device).view(2, 3)
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            x[0, 1:].copy_(x[0, :-1])
        y = torch.arange(6.0, device=device)
        y.copy_(y)  # full overlap and disjoint halves are fine
        y[:3].copy_(y[3:])
        assert y.cpu().tolist() == [3.0, 4.0, 5.0, 3.0, 4.0, 5.0]
