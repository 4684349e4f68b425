"""lazy_core/value.py: a Storage is the current value of one buffer (in-place updates replace its
node, the object stays), a view of itself with no steps, and a member of the registry of live
storages that barriers read (live_storages, pending_storages, pending_and_held, settle)."""

import gc
import weakref

import numpy as np

import runtime
from lazy_core import (
    Node,
    Operand,
    Storage,
    View,
    ViewStep,
    cut_graph,
    data_leaf,
    live_storages,
    pending_and_held,
    pending_storages,
)
from lazy_core.value import settle

_ONE = ((Operand(0),), ())
_FIRST = ViewStep(
    "aten.select.int", ((Operand(0), 0, 0), ()), "float32", (), "aten.select_scatter.default"
)


def _data(values):
    array = np.asarray(values, dtype=np.float32)
    return data_leaf(runtime.to_device(array, 0), "float32", array.shape)


def _neg(node):
    return Node("aten.neg.default", (node,), _ONE, node.dtype, node.shape)


def _among(found, mine):
    """The storages of ``found`` that are in ``mine`` (this test's), in ``found``'s order."""
    ids = {id(s) for s in mine}
    return [s for s in found if id(s) in ids]


def test_set_replaces_the_value_and_the_storage_remembers_its_last_buffer():
    leaf = _data([1.0, 2.0])
    s = Storage(leaf, 0)
    assert s.node is leaf and not s.pending and s.buffer_id == id(leaf.payload)
    s.set(_neg(leaf))
    assert s.pending and s.buffer_id == id(leaf.payload)  # what a donation would give back
    other = _data([5.0, 6.0])
    s.set(other)
    assert s.node is other and not s.pending and s.buffer_id == id(other.payload)
    assert repr(s) == f"Storage#{s.id}({other!r})"


def test_a_new_value_drops_the_access_nodes_of_the_old_one():
    s = Storage(_data([1.0, 2.0]), 0)
    first = View(s, (_FIRST,))
    old = first.node
    assert old.src == (s.node,) and first.node is old  # cached while the value stays
    s.set(_neg(s.node))
    assert first.node is not old and first.node.src == (s.node,)


def test_a_storage_is_the_view_of_itself_with_no_steps():
    leaf = _data([1.0, 2.0])
    s = Storage(leaf, 2)
    assert s.storage is s and s.steps == () and s.writable and s.device == 2
    view = s.then(_FIRST)
    assert view.storage is s and view.steps == (_FIRST,) and view.device == 2
    value = _data([3.0, 4.0])
    s.assign(value)  # the whole buffer: no write-back op
    assert s.node is value and s.buffer_id == id(value.payload)


def test_live_storages_are_in_creation_order_and_dead_ones_leave():
    leaf = _data([1.0])
    made = [Storage(leaf, 0) for _ in range(3)]
    assert _among(live_storages(), made) == made
    assert made[0].id < made[1].id < made[2].id
    gc.collect()
    before = len(live_storages())
    del made[1]
    gc.collect()
    assert len(live_storages()) == before - 1 and _among(live_storages(), made) == made


def test_a_dead_storage_is_never_an_output_of_a_barrier():
    s = Storage(_neg(_data([1.0])), 0)
    node = weakref.ref(s.node)
    assert any(p is s for p in pending_storages())
    del s
    gc.collect()
    assert node() is None  # nothing keeps its pending IR to be computed


def test_pending_storages_are_the_live_ones_with_pending_ir_on_a_device():
    leaf = _data([1.0, 2.0])
    done, on_0, on_1 = Storage(leaf, 0), Storage(_neg(leaf), 0), Storage(_neg(leaf), 1)
    mine = [done, on_0, on_1]
    try:
        assert _among(pending_storages(), mine) == [on_0, on_1]
        assert _among(pending_storages(0), mine) == [on_0]
        assert _among(pending_storages(1), mine) == [on_1]
    finally:
        on_1.set(leaf)  # no later barrier may try to compute it: this process has one device


def test_pending_and_held_splits_pending_values_from_the_buffers_others_hold():
    leaf, spare = _data([1.0, 2.0]), _data([3.0, 4.0])
    held_by_one = Storage(leaf, 0)
    pending_one = Storage(_neg(spare), 0)  # reads spare's buffer, which no storage holds
    pending, held = pending_and_held()
    assert pending_one in pending and held_by_one not in pending
    assert id(leaf.payload) in held and id(spare.payload) not in held


def test_settle_makes_each_storage_the_output_of_its_root():
    x = _data([1.0, -2.0])
    negated = _neg(x)
    doubled = Node("aten.add.Tensor", (x, x), ((Operand(0), Operand(1)), ()), "float32", (2,))
    a, b, c = Storage(negated, 0), Storage(doubled, 0), Storage(negated, 0)  # c: a's root
    graph = cut_graph([negated, doubled], salt=("device", 0))
    outputs = runtime.run_graph(graph, 0)
    settle([a, b, c], graph.roots, outputs)
    assert not (a.pending or b.pending or c.pending)
    assert a.node.payload is c.node.payload is outputs[0] and b.node.payload is outputs[1]
    assert a.buffer_id == id(outputs[0]) and (a.node.dtype, a.node.shape) == ("float32", (2,))
    np.testing.assert_array_equal(np.asarray(runtime.resolve(a.node.payload)), [-1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(runtime.resolve(b.node.payload)), [2.0, -4.0])
