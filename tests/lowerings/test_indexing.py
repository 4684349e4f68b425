"""Tests for lowerings/indexing.py against eager CPU PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.lowerings.util import check_lowering

aten = torch.ops.aten
BF16_TOL = {"atol": 2e-2, "rtol": 1e-2}
DTYPES = [torch.float32, torch.int64]


def _values(*shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-20, 20, shape, dtype=dtype)


def _unique_index(self_shape, index_shape, dim):
    """An index along ``dim`` with no repeats among elements that write the same ``self`` row."""
    full = list(index_shape)
    full[dim] = self_shape[dim]
    perm = torch.rand(full).argsort(dim)
    return perm.narrow(dim, 0, index_shape[dim]).contiguous()


# ------------------------------------------------------------------------------------------------
# gather / scatter: (self shape, index shape, dim); index may be smaller than self in every dim.

GATHER_CASES = [
    ((5,), (3,), 0),
    ((4, 6), (4, 6), 1),
    ((4, 6), (2, 3), 0),
    ((4, 6), (3, 8), -1),
    ((3, 4, 5), (2, 4, 3), 1),
    ((3, 4, 5), (3, 2, 5), -3),
    ((), (), 0),
]


@pytest.mark.parametrize("self_shape,index_shape,dim", GATHER_CASES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
def test_gather(self_shape, index_shape, dim, dtype):
    torch.manual_seed(0)
    x = _values(*self_shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, index_shape)
    check_lowering(aten.gather.default, x, dim, index)


# Index rows no longer than self's dim, so that they can hold no repeats.
SCATTER_CASES = [c for c in GATHER_CASES if c[1] != (3, 8)]


@pytest.mark.parametrize("self_shape,index_shape,dim", SCATTER_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_src_and_value(self_shape, index_shape, dim, dtype):
    torch.manual_seed(1)
    x = _values(*self_shape, dtype=dtype)
    index = _unique_index(self_shape, index_shape, dim) if self_shape else torch.tensor(0)
    # src may also be larger than index.
    src = _values(*(s + 1 for s in index_shape), dtype=dtype)
    check_lowering(aten.scatter.src, x, dim, index, src)
    check_lowering(aten.scatter.value, x, dim, index, 7)
    check_lowering(aten.scatter.value, x, dim, index, 0)
    check_lowering(aten.scatter.value, x, dim, index, -2.75 if dtype.is_floating_point else -3)


@pytest.mark.parametrize("self_shape,index_shape,dim", GATHER_CASES)
@pytest.mark.parametrize("reduce", ["add", "multiply"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_reduce_modes(self_shape, index_shape, dim, reduce, dtype):
    torch.manual_seed(2)
    x = _values(*self_shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, index_shape)
    src = _values(*index_shape, dtype=dtype)
    if not dtype.is_floating_point:
        src = src.clamp(-3, 3)
    check_lowering(aten.scatter.reduce, x, dim, index, src, reduce=reduce)
    check_lowering(aten.scatter.value_reduce, x, dim, index, 3, reduce=reduce)


@pytest.mark.parametrize("self_shape,index_shape,dim", GATHER_CASES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
def test_scatter_add(self_shape, index_shape, dim, dtype):
    torch.manual_seed(3)
    x = _values(*self_shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, index_shape)
    src = _values(*(s + 2 for s in index_shape), dtype=dtype)
    tol = BF16_TOL if dtype == torch.bfloat16 else {}
    check_lowering(aten.scatter_add.default, x, dim, index, src, **tol)


@pytest.mark.parametrize("self_shape,index_shape,dim", GATHER_CASES)
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [None, True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_reduce_two(self_shape, index_shape, dim, reduce, include_self, dtype):
    torch.manual_seed(4)
    x = _values(*self_shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, index_shape)
    src = _values(*index_shape, dtype=dtype)
    if reduce == "prod" and not dtype.is_floating_point:
        src = src.clamp(-3, 3)
    kwargs = {} if include_self is None else {"include_self": include_self}
    check_lowering(aten.scatter_reduce.two, x, dim, index, src, reduce, **kwargs)


# ------------------------------------------------------------------------------------------------
# index_select / index_add

SELECT_CASES = [((7,), 0), ((4, 5), 0), ((4, 5), 1), ((4, 5), -1), ((2, 3, 4), -2), ((), 0)]


@pytest.mark.parametrize("shape,dim", SELECT_CASES)
@pytest.mark.parametrize("index_kind", ["vector", "scalar", "int32"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(shape, dim, index_kind, dtype):
    torch.manual_seed(5)
    x = _values(*shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, (6 if x.ndim else 1,))
    if index_kind == "scalar":
        index = index[0]
    elif index_kind == "int32":
        index = index.int()
    check_lowering(aten.index_select.default, x, dim, index)


@pytest.mark.parametrize("shape,dim", SELECT_CASES)
@pytest.mark.parametrize("alpha", [None, 1, 2, -0.5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add(shape, dim, alpha, dtype):
    if alpha == -0.5 and not dtype.is_floating_point:
        pytest.skip("PyTorch rejects a float alpha for an integer tensor")
    torch.manual_seed(6)
    x = _values(*shape, dtype=dtype)
    size = x.shape[dim] if x.ndim else 1
    count = 5 if x.ndim else 1
    index = torch.randint(0, size, (count,))
    source_shape = list(shape)
    if shape:
        source_shape[dim] = count
    source = _values(*source_shape, dtype=dtype)
    kwargs = {} if alpha is None else {"alpha": alpha}
    check_lowering(aten.index_add.default, x, dim, index, source, **kwargs)


# ------------------------------------------------------------------------------------------------
# Advanced indexing: aten's index list, with None for "all of this dim".


def _ix(*values):
    return torch.tensor(values, dtype=torch.int64)


INDEX_CASES = {
    "first": (_ix(0, 2, -1, 1),),
    "second": (None, _ix(3, -2, 0)),
    "adjacent": (None, _ix(0, 1, -1), _ix(2, 0, 4)),
    "leading-adjacent": (_ix(1, 0), _ix(-1, 2)),
    "separated": (_ix(1, 0, 2), None, _ix(4, 0, -5)),
    "separated-late": (None, _ix(1, 3), None, _ix(0, 5)),
    "broadcast": (_ix(0, 1, 2).reshape(3, 1), _ix(3, -1)),
    "broadcast-separated": (_ix(0, 2).reshape(2, 1), None, _ix(0, 1, 4)),
    "2d-index": (None, torch.tensor([[0, 1], [3, -1]])),
    "zero-dim": (torch.tensor(-1), None, _ix(1, 2)),
    "zero-dim-adjacent": (None, torch.tensor(2), _ix(1, 2)),
    "all-dims": (_ix(0, 2), _ix(1, 1), _ix(4, 0), _ix(5, 1)),
    "int32": (None, _ix(3, -2, 0).int()),
}
INDEX_SHAPE = (3, 4, 5, 6)


@pytest.mark.parametrize("name", list(INDEX_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_index(name, dtype):
    torch.manual_seed(7)
    x = _values(*INDEX_SHAPE, dtype=dtype)
    check_lowering(aten.index.Tensor, x, list(INDEX_CASES[name]))


def test_index_bf16():
    torch.manual_seed(8)
    x = _values(*INDEX_SHAPE, dtype=torch.bfloat16)
    check_lowering(aten.index.Tensor, x, list(INDEX_CASES["separated"]))


def _unique_positions(indices):
    """Whether ``indices`` (broadcast together) address every element at most once."""
    wrapped = [i % INDEX_SHAPE[d] for d, i in enumerate(indices) if i is not None]
    rows = torch.stack([t.reshape(-1) for t in torch.broadcast_tensors(*wrapped)])
    return rows.unique(dim=1).shape[1] == rows.shape[1]


@pytest.mark.parametrize("name", list(INDEX_CASES))
@pytest.mark.parametrize("accumulate", [None, False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put(name, accumulate, dtype):
    torch.manual_seed(9)
    indices = list(INDEX_CASES[name])
    if not accumulate and not _unique_positions(indices):
        pytest.skip("a repeated position makes a non-accumulating write order-dependent")
    x = _values(*INDEX_SHAPE, dtype=dtype)
    out_shape = aten.index.Tensor(x, indices).shape
    extra = () if accumulate is None else (accumulate,)
    check_lowering(aten.index_put.default, x, indices, _values(*out_shape, dtype=dtype), *extra)
    # Values broadcast against the indexed shape.
    check_lowering(aten.index_put.default, x, indices, _values(dtype=dtype), *extra)
    check_lowering(
        aten.index_put.default, x, indices, _values(*out_shape[-1:], dtype=dtype), *extra
    )


def test_index_put_accumulates_repeats():
    torch.manual_seed(10)
    x = torch.zeros(4, 3)
    index = (_ix(0, 2, 0, 0, -1),)
    check_lowering(aten.index_put.default, x, index, torch.randn(5, 3), True)
    check_lowering(aten.index_put.hacked_twin, x, [_ix(1, 1), _ix(2, 2)], torch.ones(2), True)


def test_index_hacked_twin():
    x = torch.randn(4, 5)
    check_lowering(aten.index.Tensor_hacked_twin, x, [_ix(0, 3), _ix(-1, 2)])


# ------------------------------------------------------------------------------------------------
# embedding


@pytest.mark.parametrize("index_shape", [(), (5,), (2, 3), (2, 2, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra", [(), (1,), (1, True)])
def test_embedding(index_shape, dtype, extra):
    torch.manual_seed(11)
    weight = _values(10, 4, dtype=dtype)
    indices = torch.randint(0, 10, index_shape)
    check_lowering(aten.embedding.default, weight, indices, *extra)


@pytest.mark.parametrize("index_shape", [(), (7,), (3, 4), (2, 3, 2)])
@pytest.mark.parametrize("padding_idx", [-1, 0, 3])
@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_dense_backward(index_shape, padding_idx, scale_grad_by_freq):
    torch.manual_seed(12)
    indices = torch.randint(0, 6, index_shape)
    grad = torch.randn(*index_shape, 5)
    check_lowering(
        aten.embedding_dense_backward.default,
        *(grad, indices, 6, padding_idx, scale_grad_by_freq),
    )


@pytest.mark.parametrize("scale_grad_by_freq", [False, True])
def test_embedding_dense_backward_bf16(scale_grad_by_freq):
    torch.manual_seed(13)
    indices = torch.randint(0, 4, (3, 5))
    grad = torch.randn(3, 5, 8).bfloat16()
    check_lowering(
        aten.embedding_dense_backward.default,
        *(grad, indices, 4, 1, scale_grad_by_freq),
        **BF16_TOL,
    )


# ------------------------------------------------------------------------------------------------
# masked_scatter

MASK_CASES = [((6,), (6,)), ((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (3, 4)), ((2, 3, 4), (3, 1))]


@pytest.mark.parametrize("self_shape,mask_shape", MASK_CASES)
@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
def test_masked_scatter(self_shape, mask_shape, dtype):
    torch.manual_seed(14)
    x = _values(*self_shape, dtype=dtype)
    mask = torch.rand(mask_shape) > 0.4
    out_shape = torch.broadcast_shapes(self_shape, mask_shape)
    # source may hold more elements than the mask consumes, in any shape.
    source = _values(2, *out_shape, dtype=dtype)
    check_lowering(aten.masked_scatter.default, x, mask, source)


@pytest.mark.parametrize("self_shape,mask_shape", MASK_CASES)
def test_masked_scatter_backward(self_shape, mask_shape):
    torch.manual_seed(15)
    out_shape = torch.broadcast_shapes(self_shape, mask_shape)
    mask = (torch.rand(mask_shape) > 0.4).expand(out_shape)
    grad = torch.randn(out_shape)
    source_shape = [2] + list(out_shape)
    check_lowering(aten.masked_scatter_backward.default, grad, mask, source_shape)
