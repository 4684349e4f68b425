"""Tests for lowerings/scatter.py against eager CPU PyTorch: values and backward formulas."""

from __future__ import annotations

import warnings

import pytest
import torch

from lowerings import LOWERINGS, LoweringContext
from tests.lowerings.util import check_lowering, run_lowering, to_jax, to_torch

aten = torch.ops.aten
warnings.filterwarnings("ignore", message="index_reduce")


def _lowered(expected, name, *args, **kwargs):
    """The lowering of ``name`` on arguments eager rejects, given the output eager should give."""
    ctx = LoweringContext(shapes=(tuple(expected.shape),), dtypes=(str(expected.dtype)[6:],))

    def convert(v):
        return to_jax(v) if isinstance(v, torch.Tensor) else v

    args = [convert(a) for a in args]
    return to_torch(LOWERINGS[name](ctx, *args, **{k: convert(v) for k, v in kwargs.items()}))


def _randn(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------
# index_reduce

INDEX_REDUCE_CASES = [
    ((5, 4), 0, [0, 2, 2, 4, 0, 1]),  # duplicates
    ((5, 4), 1, [3, 3, 0]),
    ((3, 4, 2), -2, [1, -1, 1]),  # negative index wraps
    ((), 0, [0]),
    ((4,), 0, []),
]


@pytest.mark.parametrize("shape,dim,index", INDEX_REDUCE_CASES)
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_reduce(shape, dim, index, reduce, include_self, dtype):
    x = _randn(*shape, seed=1)
    index = torch.tensor(index, dtype=torch.int64)
    src_shape = list(shape) or [1]
    src_shape[dim] = index.numel()
    source = _randn(*src_shape, seed=2)
    if dtype == torch.int64:
        x, source = (x * 5).to(dtype), (source * 5).to(dtype)
    if shape == ():
        source = source.reshape(())
    if (index < 0).any():  # eager rejects negative indices; compare with the wrapped ones
        expected = aten.index_reduce.default(
            x, dim, index % x.shape[dim], source, reduce, include_self=include_self
        )
        got = _lowered(
            expected,
            "aten.index_reduce.default",
            x,
            dim,
            index,
            source,
            reduce,
            include_self=include_self,
        )
        torch.testing.assert_close(got, expected)
        return
    check_lowering(
        aten.index_reduce.default, x, dim, index, source, reduce, include_self=include_self
    )


def test_index_reduce_mean_integer_floors():
    x = torch.tensor([[-7, 3], [5, 0]])
    source = torch.tensor([[2, -4], [1, 1], [0, 0]])
    index = torch.tensor([0, 0, 1])
    for include_self in (True, False):
        check_lowering(
            aten.index_reduce.default, x, 0, index, source, "mean", include_self=include_self
        )


# ------------------------------------------------------------------------------------------------
# take / put


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_take(dtype):
    x = (_randn(3, 4) * 4).to(dtype)
    check_lowering(aten.take.default, x, torch.tensor([0, 11, -1, -12, 5, 5]))
    check_lowering(aten.take.default, x, torch.tensor([[2, 3], [-3, 0]]))
    check_lowering(aten.take.default, x, torch.tensor(7))
    check_lowering(aten.take.default, x.reshape(-1)[:1].reshape(()), torch.tensor([0, -1]))
    check_lowering(aten.take.default, torch.empty(0, 3, dtype=dtype), torch.empty(0).long())


def test_take_out_of_range_reads_nan():
    # Eager raises here; a compiled program cannot, so the read is NaN, never a plausible value.
    got = _lowered(torch.zeros(3), "aten.take.default", _randn(2, 2), torch.tensor([1, 4, -5]))
    assert not got[0].isnan() and got[1:].isnan().all()


@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_put(accumulate, dtype):
    x = (_randn(3, 4) * 4).to(dtype)
    unique = torch.tensor([0, 11, -2, 5])
    check_lowering(aten.put.default, x, unique, (_randn(4, seed=3) * 4).to(dtype), accumulate)
    check_lowering(
        aten.put.default, x, unique.reshape(2, 2), (_randn(2, 2) * 4).to(dtype), accumulate
    )
    check_lowering(
        aten.put.default,
        x.reshape(-1)[:1].reshape(()),
        torch.tensor(-1),
        torch.ones(()).to(dtype),
        accumulate,
    )
    if accumulate:  # repeats add up
        repeats = torch.tensor([3, 3, -9, 0, 3])
        check_lowering(aten.put.default, x, repeats, (_randn(5) * 4).to(dtype), True)


# ------------------------------------------------------------------------------------------------
# embedding_renorm


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
def test_embedding_renorm(norm_type):
    weight = _randn(6, 4) * 2
    indices = torch.tensor([[1, 3, 1], [5, 0, 3]])
    check_lowering(aten.embedding_renorm.default, weight, indices, 1.5, norm_type)
    check_lowering(aten.embedding_renorm.default, weight, torch.tensor([2]), 100.0, norm_type)


# ------------------------------------------------------------------------------------------------
# embedding_bag: indices (1-d), offsets, mode 0 sum / 1 mean / 2 max.

BAG_CASES = [
    ([1, 2, 2, 0, 5, 2, 3], [0, 3, 3, 5], False),  # an empty bag, repeated indices
    ([1, 2, 2, 0, 5, 2, 3], [0, 3, 3, 5, 7], True),
    ([4, 4, 4], [0, 1], False),
    ([], [0, 0], False),
    ([3, 1], [0, 2, 2], False),  # a trailing empty bag
]


def _bag_inputs(indices, offsets, seed=0):
    return _randn(6, 3, seed=seed), torch.tensor(indices).long(), torch.tensor(offsets).long()


@pytest.mark.parametrize("indices,offsets,include_last_offset", BAG_CASES)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_bag(indices, offsets, include_last_offset, mode, padding_idx):
    weight, indices, offsets = _bag_inputs(indices, offsets)
    args = (weight, indices, offsets, False, mode, False, None, include_last_offset, padding_idx)
    expected, got = run_lowering(aten._embedding_bag.default, *args)
    torch.testing.assert_close(got[0], expected[0])
    num_bags = expected[0].shape[0]
    if mode != 0:  # eager's bag sizes; offset2bag and max_indices where eager fills them
        torch.testing.assert_close(got[2][:num_bags], expected[2])
        torch.testing.assert_close(got[1], expected[1])
    if mode == 2:
        torch.testing.assert_close(got[3], expected[3])


@pytest.mark.parametrize("indices,offsets,include_last_offset", BAG_CASES)
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_bag_per_sample_weights(indices, offsets, include_last_offset, padding_idx):
    weight, indices, offsets = _bag_inputs(indices, offsets)
    psw = _randn(indices.numel(), seed=4)
    args = (weight, indices, offsets, False, 0, False, psw, include_last_offset, padding_idx)
    expected, got = run_lowering(aten._embedding_bag.default, *args)
    torch.testing.assert_close(got[0], expected[0])


@pytest.mark.parametrize("indices,offsets,include_last_offset", BAG_CASES)
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 2])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_bag_backward(
    indices, offsets, include_last_offset, mode, padding_idx, scale_grad_by_freq
):
    weight, indices, offsets = _bag_inputs(indices, offsets)
    fwd = aten._embedding_bag.default(
        weight, indices, offsets, False, mode, False, None, include_last_offset, padding_idx
    )
    grad = _randn(*fwd[0].shape, seed=5)
    check_lowering(
        aten._embedding_bag_backward.default,
        grad,
        indices,
        offsets,
        fwd[1],
        fwd[2],
        fwd[3],
        weight.shape[0],
        scale_grad_by_freq,
        mode,
        False,
        None,
        padding_idx,
    )


@pytest.mark.parametrize("indices,offsets,include_last_offset", BAG_CASES)
@pytest.mark.parametrize("padding_idx", [-1, 2])
def test_embedding_bag_per_sample_weights_grads(indices, offsets, include_last_offset, padding_idx):
    weight, indices, offsets = _bag_inputs(indices, offsets)
    psw = _randn(indices.numel(), seed=4)
    fwd = aten._embedding_bag.default(
        weight, indices, offsets, False, 0, False, psw, include_last_offset, padding_idx
    )
    grad = _randn(*fwd[0].shape, seed=5)
    check_lowering(
        aten._embedding_bag_backward.default,
        grad,
        indices,
        offsets,
        fwd[1],
        fwd[2],
        fwd[3],
        weight.shape[0],
        False,
        0,
        False,
        psw,
        padding_idx,
    )
    check_lowering(
        aten._embedding_bag_per_sample_weights_backward.default,
        grad,
        weight,
        indices,
        offsets,
        fwd[1],
        0,
        padding_idx,
    )


def test_embedding_bag_max_ties_pick_first():
    weight = torch.tensor([[1.0, 2.0], [1.0, 0.0], [0.0, 2.0]])
    indices, offsets = torch.tensor([1, 0, 2]), torch.tensor([0])
    expected, got = run_lowering(aten._embedding_bag.default, weight, indices, offsets, False, 2)
    torch.testing.assert_close(got[3], expected[3])


# ------------------------------------------------------------------------------------------------
# segment_reduce

SEGMENT_CASES = [
    ((6,), [2, 0, 1, 3], 0),
    ((6, 2), [0, 3, 3, 0], 0),
    ((2, 5, 3), [[1, 4], [0, 5]], 1),  # batched lengths
    ((3,), [0, 3, 0], 0),
    ((7, 2), [1, 1, 1, 1, 1, 1, 1], 0),
]


def _segment_data(shape, seed=0):
    # Multiples of 0.5: ties for max/min and zeros, single and repeated, for prod's backward.
    return (_randn(*shape, seed=seed) * 2).round() / 2


@pytest.mark.parametrize("shape,lengths,axis", SEGMENT_CASES)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
@pytest.mark.parametrize("kind", ["lengths", "offsets"])
def test_segment_reduce_and_backward(shape, lengths, axis, reduce, initial, kind):
    data = _segment_data(shape)
    lengths = torch.tensor(lengths).long()
    kw = {"axis": axis, "initial": initial}
    if kind == "lengths":
        kw["lengths"] = lengths
    else:
        zero = torch.zeros(lengths.shape[:-1] + (1,), dtype=torch.long)
        kw["offsets"] = torch.cat([zero, lengths.cumsum(-1)], -1)
    check_lowering(aten.segment_reduce.default, data, reduce, **kw)
    output = aten.segment_reduce.default(data, reduce, **kw)
    grad = _randn(*output.shape, seed=6)
    check_lowering(aten._segment_reduce_backward.default, grad, output, data, reduce, **kw)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_embedding_bag_bfloat16_accumulates_in_float32(mode):
    weight = (_randn(6, 5) * 3).to(torch.bfloat16)
    indices, offsets = torch.tensor([1, 2, 2, 0, 5, 2, 3, 4, 4, 1]), torch.tensor([0, 6])
    expected, got = run_lowering(aten._embedding_bag.default, weight, indices, offsets, False, mode)
    torch.testing.assert_close(got[0], expected[0])
    grad = _randn(2, 5, seed=7).to(torch.bfloat16)
    check_lowering(
        aten._embedding_bag_backward.default,
        *(grad, indices, offsets, *expected[1:], 6, False, mode, False, None),
        atol=2e-2,
        rtol=1e-2,
    )
