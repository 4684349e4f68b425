"""Invalid indexing raises eager's error (type and message) at the user's line, before anything is
recorded, so no later barrier fails for it; valid indexing computes eager's values. Index tensors
are lazy or, for advanced indexing (which eager CUDA moves to the device), on the CPU."""

import math

import pytest
import torch

import lazy_torch

aten = torch.ops.aten
pytestmark = pytest.mark.filterwarnings("ignore:indexing with dtype torch.uint8")


class Make:
    """Tensors of one run: operands on ``device``, index tensors and masks on ``index_device``."""

    def __init__(self, device: str, index_device: str):
        self.device, self.index_device = device, index_device

    def x(self, *shape, dtype=torch.float32):
        n = math.prod(shape)
        return torch.arange(n, dtype=dtype).reshape(shape).to(self.device)

    def t(self, data, dtype=None):
        return torch.tensor(data, dtype=dtype, device=self.device)

    def i(self, data, dtype=None):
        return torch.tensor(data, dtype=dtype, device=self.index_device)


def _setitem(shape, index, value):
    def run(m):
        x = m.x(*shape)
        x[index(m)] = value(m)
        return x

    return run


def _put(shape, indices, values, accumulate=False, method=True):
    def run(m):
        x = m.x(*shape)
        args = (tuple(i(m) if callable(i) else i for i in indices), values(m), accumulate)
        if method:
            return x.index_put_(*args)
        return aten.index_put_.default(x, *args)  # allows None entries

    return run


T, F = True, False
# Advanced indexing (index, index_put_, x[...] = v): index tensors lazy or on the CPU.
ADVANCED = {
    "mask_shape": lambda m: m.x(5, 4, 3)[m.i([T])],
    "mask_shape_2d": lambda m: m.x(5, 4, 3)[m.i([[T, F]])],
    "mask_shape_second_dim": lambda m: m.x(5, 4, 3)[:, m.i([T, F])],
    "mask_too_many_dims": lambda m: m.x(3)[m.i([[T, F, T]] * 3)],
    "uint8_mask_shape": lambda m: m.x(5, 4)[m.i([1, 0], torch.uint8)],
    "mask_and_index": lambda m: m.x(3, 3)[m.i([0, 1]), m.i([T, F, T])],
    "mask_and_index_mismatch": lambda m: m.x(3, 3)[m.i([0, 1, 2]), m.i([T, F, T])],
    "mask_then_bad_dtype": lambda m: m.x(3, 3)[m.i([T, F]), m.i([0.0])],
    "mask_ok": lambda m: m.x(5, 4, 3)[m.i([T, F, T, F, T])],
    "empty_dim": lambda m: torch.empty(10, 0, device=m.device)[:, m.i([0, 1])],
    "empty_dim_first": lambda m: torch.empty(0, 3, device=m.device)[m.i([0])],
    "empty_dim_empty_index": lambda m: torch.empty(10, 0, device=m.device)[:, m.i([], torch.long)],
    "no_broadcast": lambda m: m.x(3, 3)[m.i([0, 1]), m.i([0, 1, 2])],
    "too_many": lambda m: m.x(3)[m.i([0]), m.i([0])],
    "float_index": lambda m: m.x(3)[m.i([0.0])],
    "int32_index": lambda m: m.x(3)[m.i([0, 2], torch.int32)],
    "broadcast_ok": lambda m: m.x(3, 4)[m.i([[0], [2]]), m.i([1, 3])],
    "apart": lambda m: m.x(2, 3, 4)[m.i([0, 1]), :, m.i([1, 3])],
    "put_no_broadcast": _put(
        (3, 3), (lambda m: m.i([0, 1]), lambda m: m.i([0, 1, 2])), lambda m: m.t(0.0)
    ),
    "put_no_broadcast_acc": _put(
        (3, 3), (lambda m: m.i([0, 1]), lambda m: m.i([0, 1, 2])), lambda m: m.t(0.0), True
    ),
    "put_values_shape": _put((3, 3), (lambda m: m.i([0, 1]),), lambda m: m.t([1.0, 2.0])),
    "put_values_shape_acc": _put((3, 3), (lambda m: m.i([0, 1]),), lambda m: m.t([1.0, 2.0]), True),
    "put_values_ok": _put((3, 3), (lambda m: m.i([0, 1]),), lambda m: m.t([1.0, 2.0, 3.0])),
    "put_values_ok_acc": _put(
        (3, 3), (lambda m: m.i([0, 0]),), lambda m: m.t([1.0, 2.0, 3.0]), True
    ),
    "put_values_dtype": _put((3, 3), (lambda m: m.i([0, 1]),), lambda m: m.t([1, 2, 3])),
    "put_values_dtype_acc": _put((3, 3), (lambda m: m.i([0, 1]),), lambda m: m.t([1, 2, 3]), True),
    "put_mask_shape": _put((3, 3), (lambda m: m.i([T, F]),), lambda m: m.t(1.0)),
    "put_mask_shape_acc": _put((3, 3), (lambda m: m.i([T, F]),), lambda m: m.t(1.0), True),
    "put_mask_values_shape": _put((3, 3), (lambda m: m.i([T, F, T]),), lambda m: m.t([1.0, 2.0])),
    "put_mask_values_ok": _put(
        (3, 3), (lambda m: m.i([T, F, T]),), lambda m: m.t([[1.0, 2.0, 3.0]])
    ),
    "put_mask_values_ok_acc": _put(
        (3, 3), (lambda m: m.i([T, F, T]),), lambda m: m.t([[1.0, 2.0, 3.0]]), True
    ),
    "put_mask_values_rows": _put(
        (3, 3), (lambda m: m.i([T, F, T]),), lambda m: m.t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    ),
    "put_mask_values_count": _put(
        (3, 3), (lambda m: m.i([T, F, T]),), lambda m: m.t([[1.0, 2.0, 3.0]] * 3)
    ),
    "put_second_dim_mask_one_value": _put(
        (3, 4), (None, lambda m: m.i([T, F, T, T])), lambda m: m.t([[[7.0]]]), method=False
    ),
    "put_second_dim_mask_one_value_acc": _put(
        (3, 4), (None, lambda m: m.i([T, F, T, T])), lambda m: m.t([[[7.0]]]), True, method=False
    ),
    "put_too_many": _put((3, 3), (lambda m: m.i([0]),) * 3, lambda m: m.t(1.0)),
    "put_empty_dim": lambda m: torch.zeros(0, 3, device=m.device).index_put_((m.i([0]),), m.t(1.0)),
    "setitem_no_broadcast": _setitem((3, 3), lambda m: (m.i([0, 1]), m.i([0, 1, 2])), lambda m: 0),
    "setitem_list_no_broadcast": _setitem((3, 3), lambda m: ([0, 1], [0, 1, 2]), lambda m: 0),
    "setitem_mask_shape": _setitem((3, 3), lambda m: m.i([T]), lambda m: 0),
    "setitem_mask": _setitem((3, 3), lambda m: m.i([T, F, T]), lambda m: 5.0),
    "setitem_mask_2d": _setitem((3, 3), lambda m: m.i([[T, F, T]] * 3), lambda m: m.t([1.0] * 6)),
    "setitem_mask_values_shape": _setitem(
        (3, 3), lambda m: m.i([[T, F, T]] * 3), lambda m: m.t([1.0, 2.0])
    ),
    "setitem_values_shape": _setitem((3, 3), lambda m: m.i([0, 1]), lambda m: m.t([1.0, 2.0])),
    "setitem_values_dtype": _setitem((3, 3), lambda m: m.i([0, 1]), lambda m: m.t([1, 2, 3])),
}


def _iadd(m):
    x = m.x(3, 3)
    x[m.i([0, 2, 0])] += m.t([1.0, 2.0, 3.0])
    return x


def _iadd_bad(m):
    x = m.x(3, 3)
    x[m.i([0, 1])] += m.t([1.0, 2.0])
    return x


ADVANCED["setitem_iadd"] = _iadd
ADVANCED["setitem_iadd_shape"] = _iadd_bad

# The rest of the family (eager CUDA wants these index tensors on the device).
FAMILY = {
    "index_select_2d_index": lambda m: m.x(3, 4).index_select(0, m.i([[0]])),
    "index_select_float_index": lambda m: m.x(3, 4).index_select(0, m.i([0.0])),
    "index_select_dim": lambda m: m.x(3, 4).index_select(2, m.i([0])),
    "index_select_empty_dim": lambda m: torch.zeros(3, 0, device=m.device).index_select(
        1, m.i([0])
    ),
    "index_select_empty_1d": lambda m: torch.zeros(0, device=m.device).index_select(0, m.i([0])),
    "gather_shape": lambda m: m.x(3, 4).gather(1, m.i([[0]] * 4)),
    "gather_dims": lambda m: m.x(3, 4).gather(1, m.i([0])),
    "gather_int32": lambda m: m.x(3, 4).gather(1, m.i([[0]], torch.int32)),
    "scatter_shape": lambda m: m.x(3, 4).scatter(1, m.i([[0]] * 4), m.x(4, 1)),
    "scatter_src_small": lambda m: m.x(3, 4).scatter(1, m.i([[0, 1]]), m.x(1, 1)),
    "scatter_dtype": lambda m: m.x(3, 4).scatter(1, m.i([[0]]), m.x(1, 1, dtype=torch.float64)),
    "scatter_add_": lambda m: m.x(3, 4).scatter_add_(0, m.i([[0]] * 4), m.x(4, 1)),
    "scatter_reduce_name": lambda m: m.x(3, 4).scatter_reduce(0, m.i([[0]]), m.x(1, 1), "max2"),
    "index_add_count": lambda m: m.x(3, 4).index_add(0, m.i([0, 1]), m.x(3, 4)),
    "index_add__count": lambda m: m.x(3, 4).index_add_(0, m.i([0, 1]), m.x(3, 4)),
    "index_add_dtype": lambda m: m.x(3, 4).index_add(0, m.i([0]), m.x(1, 4, dtype=torch.float64)),
    "index_add_slice": lambda m: m.x(3, 4).index_add(0, m.i([0]), m.x(1, 3)),
    "index_copy_count": lambda m: m.x(3, 4).index_copy(0, m.i([0, 1]), m.x(3, 4)),
    "index_copy__slice": lambda m: m.x(3, 4).index_copy_(0, m.i([0]), m.x(1, 3)),
    "index_fill_2d": lambda m: m.x(3, 4).index_fill(0, m.i([[0]]), 1.0),
    "index_fill_int32": lambda m: m.x(3, 4).index_fill(0, m.i([0], torch.int32), 1.0),
    "index_fill__empty": lambda m: torch.zeros(0, 4, device=m.device).index_fill_(0, m.i([0]), 1.0),
    "index_reduce_count": lambda m: m.x(3, 4).index_reduce(0, m.i([0, 1]), m.x(3, 4), "prod"),
    "masked_fill_shape": lambda m: m.x(3, 4).masked_fill(m.i([T, F]), 1.0),
    "masked_fill__broadcast_self": lambda m: m.x(1, 4).masked_fill_(m.i([[T] * 4] * 3), 1.0),
    "masked_fill_float_mask": lambda m: m.x(3, 4).masked_fill(m.i([1.0, 0, 0, 0]), 1.0),
    "masked_scatter_shape": lambda m: m.x(3, 4).masked_scatter(m.i([T, F]), m.x(12)),
    "masked_select_shape": lambda m: m.x(3, 4).masked_select(m.i([T, F])),
    "take_float": lambda m: m.x(3, 4).take(m.i([0.0])),
    "take_empty": lambda m: torch.zeros(0, device=m.device).take(m.i([0])),
    "put__numel": lambda m: m.x(3, 4).put_(m.i([0, 1]), m.x(3)),
    "put__empty": lambda m: torch.zeros(0, device=m.device).put_(m.i([0]), m.x(1)),
    "embedding_float": lambda m: torch.nn.functional.embedding(m.i([0.0]), m.x(3, 4)),
    "take_along_dim_shape": lambda m: torch.take_along_dim(m.x(3, 4), m.i([[0]] * 4), 1),
    "gather_ok": lambda m: m.x(3, 4).gather(1, m.i([[0, 3], [1, 1], [2, 0]])),
    "index_add_ok": lambda m: m.x(3, 4).index_add(1, m.i([0, 0]), m.x(3, 2)),
}


def _outcome(fn, make: Make):
    """("ok", value) or ("error", type, message); for a lazy run, where it raised."""
    try:
        out = fn(make)
    except Exception as e:  # noqa: BLE001 (its traceback would keep a pending tensor alive)
        return ("error", type(e), str(e))
    return ("ok", out.cpu() if isinstance(out, torch.Tensor) else out)


def _check(fn, index_device: str) -> None:
    expected = _outcome(fn, Make("cpu", "cpu"))
    got = _outcome(fn, Make("lazy", index_device))
    if expected[0] == "error":
        assert got == expected  # raised when recorded, not at .cpu()
    else:
        assert got[0] == "ok", got
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=0)
    lazy_torch.mark_step(wait=True)  # nothing left behind fails a later barrier


@pytest.mark.parametrize("index_device", ["lazy", "cpu"])
@pytest.mark.parametrize("name", sorted(ADVANCED))
def test_advanced_indexing_matches_eager(name, index_device):
    _check(ADVANCED[name], index_device)


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_index_family_matches_eager(name):
    _check(FAMILY[name], "lazy")


def test_a_rejected_index_put_leaves_the_tensor_and_later_barriers_alone():
    a = torch.zeros(3, 3, device="lazy")
    b = a + 1
    with pytest.raises(IndexError, match="could not be broadcast together with shapes"):
        a[[0, 1], [0, 1, 2]] = 0
    lazy_torch.mark_step()
    lazy_torch.mark_step(wait=True)
    torch.testing.assert_close(a.cpu(), torch.zeros(3, 3))
    torch.testing.assert_close(b.cpu(), torch.ones(3, 3))


def test_eager_is_replayed_once_per_signature():
    from lazy_torch import indexing

    x = torch.ones(4, 3, device="lazy")
    calls = []
    replay = indexing._replay
    indexing._replay = lambda *a: calls.append(a) or replay(*a)
    try:
        for k in range(3):
            x[torch.tensor([k, k + 1], device="lazy")]
    finally:
        indexing._replay = replay
    assert len(calls) <= 1


def _empty(*shape):
    return lambda m: torch.zeros(*shape, device=m.device)


# Errors that name an index value, or eager's kernels skipping indices they never visit (an empty
# result, an empty dim beside the indexed one): the runtime checks decide, at the read.
BY_VALUE = {
    "index_select_dim1": lambda m, v: m.x(3, 4, 2).index_select(1, m.i([v])),
    "index_select_dim1_negative": lambda m, v: m.x(3, 4).index_select(1, m.i([-v])),
    "index_select_empty_self": lambda m, v: _empty(3, 0)(m).index_select(0, m.i([v])),
    "embedding_empty_rows": lambda m, v: torch.nn.functional.embedding(m.i([v]), _empty(3, 0)(m)),
    "index_add_empty_self": lambda m, v: _empty(0, 3)(m).index_add(0, m.i([v]), m.x(1, 3)),
    "index_add_beside_empty": lambda m, v: _empty(3, 0)(m).index_add(0, m.i([v]), m.x(1, 0)),
    "index_add_1d_empty": lambda m, v: _empty(0)(m).index_add(0, m.i([v]), m.x(1)),
    "index_copy_beside_empty": lambda m, v: _empty(3, 0)(m).index_copy(0, m.i([v]), m.x(1, 0)),
    "index_copy_empty_dim": lambda m, v: _empty(3, 0)(m).index_copy(1, m.i([v]), m.x(3, 1)),
    "index_fill_beside_empty": lambda m, v: _empty(3, 0)(m).index_fill(0, m.i([v]), 1.0),
    "index_beside_empty": lambda m, v: _empty(3, 0)(m)[m.i([v])],
    "index_put_beside_empty": lambda m, v: _empty(3, 0)(m).index_put((m.i([v]),), m.x(1, 0)),
    "index_put_acc_beside_empty": lambda m, v: _empty(3, 0)(m).index_put(
        (m.i([v]),), m.x(1, 0), accumulate=True
    ),
    "gather_empty_dim": lambda m, v: _empty(3, 0)(m).gather(1, m.i([[v]])),
    "scatter_empty_dim": lambda m, v: _empty(3, 0)(m).scatter(1, m.i([[v]]), 1.0),
    "index_reduce_beside_empty": lambda m, v: _empty(3, 0)(m).index_reduce(
        0, m.i([v]), m.x(1, 0), "amax"
    ),
}


def _same_outcome(run) -> None:
    """``run`` gives on lazy tensors (and indices) what it gives on eager ones: a value, or an
    error of the same type and message."""
    expected = _outcome(run, Make("cpu", "cpu"))
    got = _outcome(run, Make("lazy", "lazy"))
    if expected[0] == "error":
        assert got == expected
    else:
        assert got[0] == "ok", got
        torch.testing.assert_close(got[1], expected[1])
    lazy_torch.mark_step(wait=True)


@pytest.mark.parametrize("value", [0, 5])
@pytest.mark.parametrize("name", sorted(BY_VALUE))
def test_errors_that_depend_on_index_values_match_eager(name, value):
    def run(m):
        return BY_VALUE[name](m, value).cpu()

    _same_outcome(run)  # a value's error is raised where it is read


def _log_probs(m, *shape):
    return m.x(*shape).log_softmax(1)


# Class targets, one_hot's classes and embedding_bag's offsets: values eager reads and refuses.
F_ = torch.nn.functional
READ = {
    "nll_loss": lambda m: F_.nll_loss(_log_probs(m, 4, 3), m.i([0, 1, 2, 5])),
    "nll_loss_negative": lambda m: F_.nll_loss(_log_probs(m, 4, 3), m.i([0, 1, -2, 5])),
    "nll_loss_none": lambda m: F_.nll_loss(
        _log_probs(m, 4, 3), m.i([0, 3, 2, 1]), reduction="none"
    ),
    "nll_loss_ignored": lambda m: F_.nll_loss(
        _log_probs(m, 4, 3), m.i([0, 1, 2, 5]), ignore_index=5
    ),
    "nll_loss_ignored_default": lambda m: F_.nll_loss(_log_probs(m, 4, 3), m.i([0, -100, 2, 1])),
    "nll_loss_one_sample": lambda m: F_.nll_loss(m.x(3).log_softmax(0), m.i(7)),
    "nll_loss_2d": lambda m: F_.nll_loss(_log_probs(m, 2, 3, 2, 2), m.i([[[0, 1], [2, 3]]] * 2)),
    "cross_entropy": lambda m: F_.cross_entropy(m.x(4, 3), m.i([0, 1, 2, 3])),
    "cross_entropy_smoothing": lambda m: F_.cross_entropy(
        m.x(4, 3), m.i([0, 3, 2, 1]), label_smoothing=0.1
    ),
    "multi_margin": lambda m: F_.multi_margin_loss(m.x(4, 3), m.i([0, 1, 2, 3])),
    "multi_margin_0d": lambda m: F_.multi_margin_loss(m.t(2.0), m.i(1)),
    "multilabel_margin": lambda m: F_.multilabel_margin_loss(
        m.x(2, 3), m.i([[0, 3, -1], [1, -1, 0]])
    ),
    "multilabel_margin_ok": lambda m: F_.multilabel_margin_loss(
        m.x(2, 3), m.i([[0, 2, -1], [1, -1, 7]])
    ),
    "one_hot": lambda m: F_.one_hot(m.i([0, 5]), 3),
    "one_hot_negative": lambda m: F_.one_hot(m.i([-1, 5]), 3),
    "one_hot_inferred": lambda m: F_.one_hot(m.i([0, 5])),
    "one_hot_inferred_negative": lambda m: F_.one_hot(m.i([2, -1])),
    "one_hot_int32": lambda m: F_.one_hot(m.i([0, 1], torch.int32), 3),
    "one_hot_empty": lambda m: F_.one_hot(m.i([], torch.long), 3),
    "one_hot_empty_inferred": lambda m: F_.one_hot(m.i([], torch.long)),
    "embedding_bag_first_offset": lambda m: F_.embedding_bag(
        m.i([0, 1, 2, 3]), m.x(4, 3), m.i([1, 2])
    ),
    "embedding_bag_last_offset": lambda m: F_.embedding_bag(
        m.i([0, 1, 2, 3]), m.x(4, 3), m.i([0, 9])
    ),
    "embedding_bag_ok": lambda m: F_.embedding_bag(m.i([0, 1, 2, 3]), m.x(4, 3), m.i([0, 4])),
}


@pytest.mark.parametrize("name", sorted(READ))
def test_values_eager_refuses_raise_its_error_at_the_read(name):
    def run(m):
        return READ[name](m).cpu()

    _same_outcome(run)


@pytest.mark.parametrize(
    "name,fn,error",
    [
        (
            "gather_empty_dim",
            lambda x, i: x.gather(1, i.reshape(1, 1)),
            "index 2 is out of bounds for dimension 1 with size 0",
        ),
        (
            "scatter_empty_dim",
            lambda x, i: x.scatter(1, i.reshape(1, 1), 1.0),
            "index 2 is out of bounds for dimension 1 with size 0",
        ),
    ],
)
def test_an_index_into_an_empty_dim_names_its_value_at_the_barrier(name, fn, error):
    # Eager's message names the index value, which the device holds: the runtime check reports it.
    x, i = torch.zeros(3, 0), torch.tensor([2])
    with pytest.raises(RuntimeError, match=error):
        fn(x, i)
    with pytest.raises(RuntimeError, match=error):
        fn(x.to("lazy"), i.to("lazy")).cpu()
    lazy_torch.mark_step(wait=True)


def test_masked_scatter_with_too_small_a_source_raises_eagers_error():
    x, mask, source = torch.zeros(3, 4), torch.ones(3, 4, dtype=torch.bool), torch.arange(5.0)
    message = "Number of elements of source < number of ones in mask"
    with pytest.raises(RuntimeError, match=message):
        x.masked_scatter(mask, source)
    with pytest.raises(RuntimeError, match=message):
        x.to("lazy").masked_scatter(mask.to("lazy"), source.to("lazy")).cpu()
    enough = torch.arange(12.0)
    torch.testing.assert_close(
        x.to("lazy").masked_scatter(mask.to("lazy"), enough.to("lazy")).cpu(),
        x.masked_scatter(mask, enough),
    )
