"""The IR and the graph cut: structural hashes, parameter de-duplication, keys, liveness."""

import gc

from lazy_core import (
    Node,
    Storage,
    constant,
    cut_graph,
    data_leaf,
    ir_text,
    pending_storages,
    scalar_leaf,
)
from lazy_core.ir import Operand


def _add(a, b):
    return Node("aten.add.Tensor", (a, b), ((Operand(0), Operand(1)), ()), "float32", a.shape)


def test_hash_is_structural_and_ignores_leaf_content():
    a, b = data_leaf("buf-a", "float32", (2,)), data_leaf("buf-b", "float32", (2,))
    assert a.hash == b.hash
    assert _add(a, a).hash == _add(b, b).hash
    assert data_leaf("x", "float32", (3,)).hash != a.hash
    assert data_leaf("x", "int64", (2,)).hash != a.hash
    assert scalar_leaf(0.1, "float64").hash == scalar_leaf(0.2, "float64").hash
    assert constant(0, "int64").hash != constant(1, "int64").hash


def test_cut_deduplicates_buffers_and_keys_capture_aliasing():
    a, b = data_leaf("buf-a", "float32", (2,)), data_leaf("buf-b", "float32", (2,))
    a_again = data_leaf("buf-a", "float32", (2,))
    same = cut_graph([_add(a, a_again)])
    assert len(same.params) == 1
    different = cut_graph([_add(a, b)])
    assert len(different.params) == 2
    assert same.key != different.key
    assert cut_graph([_add(b, a)]).key == different.key  # the same computation on new buffers
    assert cut_graph([_add(a, b)], salt=("device", 1)).key != different.key


def _mul(a, b):
    return Node("aten.mul.Tensor", (a, b), ((Operand(0), Operand(1)), ()), "float32", a.shape)


def test_keys_capture_which_leaf_each_edge_reads():
    # mul(s, b) and mul(s, a) with s = add(a, b) hash alike (leaves hash by shape and dtype), and
    # their walks meet the same leaves in the same order; only the wiring tells them apart.
    a, b = data_leaf("buf-a", "float32", (2,)), data_leaf("buf-b", "float32", (2,))
    s = _add(a, b)
    assert _mul(s, b).hash == _mul(s, a).hash
    assert cut_graph([_mul(s, b)]).key != cut_graph([_mul(s, a)]).key
    t = _add(a, b)
    assert (
        cut_graph([_add(_mul(s, a), _mul(t, a))]).key
        != cut_graph([_add(_mul(s, a), _mul(s, a))]).key
    )
    assert cut_graph([_mul(s, b), s]).key != cut_graph([_mul(s, b), _add(a, b)]).key


def test_post_order_visits_shared_nodes_once_and_handles_deep_chains():
    x = data_leaf("buf", "float32", (2,))
    y = x
    for _ in range(5000):  # deeper than Python's recursion limit
        y = _add(y, x)
    graph = cut_graph([y, y])
    assert len(graph.roots) == 1 and len(graph.params) == 1
    assert len(graph.nodes) == 5001
    assert graph.nodes[0] is x and graph.nodes[-1] is y
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    assert all(position[id(s)] < position[id(n)] for n in graph.nodes for s in n.src)


def test_dead_storages_leave_the_registry():
    x = data_leaf("buf", "float32", (2,))
    live = Storage(_add(x, x), 0)
    dead = Storage(_add(x, x), 0)
    del dead
    gc.collect()
    pending = pending_storages()
    assert live in pending and len([s for s in pending if s.node.op == "aten.add.Tensor"]) == 1
    assert not Storage(x, 0).pending


def test_ir_text_one_node_a_line():
    x = data_leaf("buf", "float32", (2, 3))
    text = ir_text([_add(x, x)])
    assert text.splitlines() == [
        "IR {",
        "  %0 = float32[2,3] data()",
        "  %1 = float32[2,3] aten.add.Tensor(%0, %0)",
        "  ROOT 0: %1",
        "}",
    ]
