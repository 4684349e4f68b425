"""lazy_core/view.py: a View is a chain of ViewSteps on a Storage. Reading it is an Access of the
storage's current value; writing through it is an Assign that gives the storage its new value, so
every other view of the storage sees the write; a step without an inverse refuses writes
(NotWritable). Values are checked against eager PyTorch's views of the same tensor."""

import numpy as np
import pytest
import torch

import runtime
from lazy_core import Node, NotWritable, Operand, Storage, View, ViewStep, cut_graph, data_leaf

_PARENT, _VALUE = Operand(0), Operand(1)


def _row_1(length):
    """Row 1 of a value with rows of ``length`` elements."""
    return ViewStep(
        "aten.select.int",
        ((_PARENT, 0, 1), ()),
        "float32",
        (length,),
        "aten.select_scatter.default",
        ((_PARENT, _VALUE, 0, 1), ()),
    )


# Views of a float32 (2, 3) value: row 1, then its columns 1:3; the transpose; a broadcast.
_ROW = _row_1(3)
_TAIL = ViewStep(
    "aten.slice.Tensor",
    ((_PARENT, 0, 1, 3, 1), ()),
    "float32",
    (2,),
    "aten.slice_scatter.default",
    ((_PARENT, _VALUE, 0, 1, 3, 1), ()),
)
_T = ViewStep(
    "aten.t.default", ((_PARENT,), ()), "float32", (3, 2), "aten.t.default", ((_VALUE,), ())
)
_EXPAND = ViewStep(
    "aten.expand.default",
    ((_PARENT, (2, 3)), ()),
    "float32",
    (2, 3),
    None,
    error="more than one element refers to a single memory location",
)


def _storage():
    """A storage holding eager's ``torch.arange(6.0).view(2, 3)`` on the device, and that tensor."""
    eager = torch.arange(6.0).view(2, 3)
    buffer = runtime.to_device(eager.numpy(), 0)
    return Storage(data_leaf(buffer, "float32", (2, 3)), 0), eager


def _value(node):
    """Compute ``node`` on the device."""
    (out,) = runtime.run_graph(cut_graph([node], salt=("device", 0)), 0)
    return torch.from_numpy(np.array(runtime.resolve(out)))


def _neg(node):
    return Node("aten.neg.default", (node,), ((_PARENT,), ()), node.dtype, node.shape)


def test_steps_record_their_access_and_their_write_back():
    parent = data_leaf(None, "float32", (2, 3))
    access = _ROW.access(parent)
    assert (access.op, access.src, access.arg) == ("aten.select.int", (parent,), _ROW.arg)
    assert (access.dtype, access.shape) == ("float32", (3,))
    written = _ROW.write(parent, access)
    assert (written.op, written.src) == ("aten.select_scatter.default", (parent, access))
    assert (written.arg, written.dtype, written.shape) == (_ROW.inverse_arg, "float32", (2, 3))


def test_reading_a_view_is_an_access_of_the_storages_current_value():
    s, eager = _storage()
    tail = View(s, (_ROW,)).then(_TAIL)
    assert tail.storage is s and tail.steps == (_ROW, _TAIL) and tail.device == 0
    assert tail.writable
    torch.testing.assert_close(_value(tail.node), eager[1][1:3])
    torch.testing.assert_close(_value(View(s, (_T,)).node), eager.t())
    # One Access node per storage value and steps, whichever view asks.
    assert tail.node is tail.node and View(s, (_ROW, _TAIL)).node is tail.node


def test_a_write_through_a_view_reaches_the_storage_and_every_other_view():
    s, eager = _storage()
    tail, column = View(s, (_ROW, _TAIL)), View(s, (_T,)).then(_row_1(2))
    tail.assign(_neg(tail.node))
    eager[1][1:3] = -eager[1][1:3]
    assert s.pending and s.node.op == "aten.select_scatter.default"
    torch.testing.assert_close(_value(s.node), eager)
    torch.testing.assert_close(_value(column.node), eager.t()[1])
    torch.testing.assert_close(_value(View(s, (_ROW,)).node), eager[1])


def test_reading_a_view_back_gives_the_value_written():
    s, _ = _storage()
    tail = View(s, (_ROW, _TAIL))
    value = _neg(tail.node)
    tail.assign(value)
    assert tail.node is value


def test_a_write_through_a_step_without_inverse_raises_and_changes_nothing():
    s, eager = _storage()
    first = View(s, (_ROW,))
    before, read = s.node, first.node
    stuck = View(s, (_ROW, _EXPAND))
    assert not stuck.writable and first.writable
    with pytest.raises(NotWritable, match="refers to a single memory location"):
        stuck.assign(_neg(stuck.node))
    assert s.node is before and first.node is read
    torch.testing.assert_close(_value(s.node), eager)
    unnamed = ViewStep("aten.expand.default", ((_PARENT, (2, 3)), ()), "float32", (2, 3), None)
    with pytest.raises(NotWritable, match="cannot write through a view made by aten.expand"):
        View(s, (_ROW, unnamed)).assign(_neg(stuck.node))
    assert issubclass(NotWritable, RuntimeError)


def test_a_view_with_no_steps_reads_and_writes_the_whole_value():
    s, eager = _storage()
    whole = View(s)
    assert whole.steps == () and whole.node is s.node
    whole.assign(_neg(s.node))
    torch.testing.assert_close(_value(s.node), -eager)
    assert whole.node is s.node
