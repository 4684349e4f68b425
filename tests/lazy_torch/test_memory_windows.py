"""Views addressed by memory, against eager CPU: ``as_strided`` over inputs of any layout, and
writes through views whose chain has a step without an inverse (an expand that repeats elements,
overlapping unfold windows) into elements that share no memory with each other."""

import warnings

import pytest
import torch

from tests.lazy_torch.compare import assert_same_tensor


def _check(program):
    """``program(device)`` returns tensors, or raises; lazy must give eager CPU's."""
    results = []
    for device in ("cpu", "lazy"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(program(device))
        except RuntimeError as e:
            results.append(e)
    eager, lazy = results
    if isinstance(eager, Exception):
        assert isinstance(lazy, RuntimeError) and str(lazy) == str(eager)
        return
    assert not isinstance(lazy, Exception), lazy
    for e, g in zip(eager, lazy):
        assert_same_tensor(g, e)


def _permuted(device):
    # A tensor that is no view, laid out column-major: its storage's memory is its transpose's.
    return torch.arange(12.0).view(3, 4).to(device).t() * 1


AS_STRIDED = {
    "read_permuted": lambda d: (_permuted(d).as_strided((12,), (1,)),),
    "read_permuted_offset": lambda d: (_permuted(d).as_strided((2, 3), (1, 4), 1),),
    "read_slice_of_permuted": lambda d: (_permuted(d)[1:].as_strided((3, 2), (4, 1), 1),),
    "read_overlapping": lambda d: (_permuted(d).as_strided((3, 3), (1, 1), 2),),
    "read_outside_input": lambda d: (torch.arange(12.0, device=d)[4:].as_strided((3,), (2,), 0),),
    "read_of_expanded": lambda d: (
        torch.arange(4.0, device=d).expand(3, 4).as_strided((2, 2), (1, 1), 1),
    ),
}


def _write_permuted(device):
    x = _permuted(device)
    w = x.as_strided((2, 2), (1, 4), 1)
    w.mul_(10)
    return x, w


def _write_of_expanded(device):
    base = torch.arange(4.0, device=device)
    x = base.expand(3, 4)
    x.as_strided((2,), (1,), 1).zero_()
    return base, x


WRITES = {
    "as_strided_permuted": _write_permuted,
    "as_strided_of_expanded": _write_of_expanded,
}


def _diagonal_of_expanded(device):
    base = torch.arange(5.0, dtype=torch.float64, device=device)
    x = base.expand(2, 5).flatten(-1, -1).diagonal(0, 0, -1)
    x[0] = 1.5
    return base, x


def _expanded_dim_sliced_back(device):
    base = torch.ones(2, 1, device=device)
    base.expand(2, 2)[:, :1].add_(1)
    return (base,)


def _empty_expanded(device):
    base = torch.ones(0, 1, device=device)
    base.expand(0, 3).neg_()
    return (base,)


def _unfold_window_element(device):
    base = torch.arange(6.0, device=device)
    u = base.unfold(0, 3, 1)
    u[1, 1] = -1
    u[:, 0].mul_(2)  # elements 0, 1, 2 and 3 of base: no two share memory
    return base, u


def _transposed_expanded_column(device):
    base = torch.arange(3.0, device=device).view(3, 1)
    col = base.expand(3, 4).t()[2]
    col.copy_(torch.tensor([7.0, 8.0, 9.0], device=device))
    return base, col


def _index_put_into_expanded_row(device):
    base = torch.zeros(4, device=device)
    row = base.expand(2, 4)[1]
    row[torch.tensor([0, 3])] = torch.tensor([5.0, 6.0], device=device)
    return base, row


def _write_repeated_elements(device):
    torch.zeros(1, device=device).expand(3).add_(1)  # both raise eager's error
    return ()


THROUGH_EXPANDED = {
    "diagonal_of_expanded": _diagonal_of_expanded,
    "expanded_dim_sliced_back": _expanded_dim_sliced_back,
    "empty_expanded": _empty_expanded,
    "unfold_window_element": _unfold_window_element,
    "transposed_expanded_column": _transposed_expanded_column,
    "index_put_into_expanded_row": _index_put_into_expanded_row,
    "repeated_elements_raise": _write_repeated_elements,
}


@pytest.mark.parametrize("name", list(AS_STRIDED) + list(WRITES) + list(THROUGH_EXPANDED))
def test_matches_eager(name):
    _check({**AS_STRIDED, **WRITES, **THROUGH_EXPANDED}[name])


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_many_in_one_process(order):
    """Every program again, in both orders: view memos and executables are shared."""
    programs = list({**AS_STRIDED, **WRITES, **THROUGH_EXPANDED}.values())
    for program in programs if order == "forward" else programs[::-1]:
        _check(program)


def test_in_place_op_on_elements_sharing_memory_is_refused():
    """Eager writes these in memory order, reading elements other writes changed (its result
    depends on its loops); lazy refuses with eager's message for repeated elements instead."""
    x = torch.arange(12.0, device="lazy")
    with pytest.raises(RuntimeError, match="single memory location"):
        x.as_strided((3, 3), (1, 1), 2).add_(1)
    with pytest.raises(RuntimeError, match="single memory location"):
        x.unfold(0, 3, 1).mul_(2)
    assert x.cpu().tolist() == list(range(12))  # nothing written


def test_large_window_reads_by_iota_not_a_constant():
    """A big window of a permuted tensor: values right, and the gather positions are computed,
    not baked into the program (the layouts nest)."""
    from lazy_core import window

    source = ((512, 256), (1, 512), 0)
    win = ((256, 256), (512, 1), 256)
    found = window.positions(source, win)
    assert found is not None and window.arithmetic(source, win, found)
    _check(lambda d: (torch.arange(131072.0, device=d).view(256, 512).t().mul(1)
                      .as_strided((256, 256), (512, 1), 256),))  # fmt: skip


def test_interleaved_layout_positions_fall_back_to_a_table():
    from lazy_core import window

    source = ((2, 3), (3, 2), 0)  # addresses 0 2 4 3 5 7: distinct, but the strides interleave
    win = ((3,), (1,), 3)
    found = window.positions(source, win)
    assert found is not None and found.tolist() == [3, 2, 4]
    assert not window.arithmetic(source, win, found)
    assert window.positions(source, ((2,), (1,), 0)) is None  # address 1 is no element's
