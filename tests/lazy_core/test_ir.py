"""The IR's C types (lazy_core/csrc): Node, the graph walk, Storage and its registry, View, and a
barrier's per-storage bookkeeping."""

import gc
import random
import weakref

import pytest

from lazy_core import _native, ir
from lazy_core.ir import DATA, SCALAR, Node, Operand
from lazy_core.view import NotWritable, ViewStep


def test_node_attributes_and_structural_digests():
    a = Node(DATA, (), None, "float32", (4, 5), payload="buffer")
    s = Node(SCALAR, (), None, "float64", (), payload=0.5)
    add = Node("aten.add.Tensor", (a, s), ((Operand(0), Operand(1)), ()), "float32", (4, 5))
    multi = Node("aten.max.dim", (add,), ((Operand(0), 1), ()), ("float32", "int64"), ((4,), (4,)))
    assert (add.op, add.src, add.arg) == ("aten.add.Tensor", (a, s), ((Operand(0), Operand(1)), ()))
    assert (add.dtype, add.shape, add.payload, add.site) == ("float32", (4, 5), None, None)
    assert a.payload == "buffer" and s.payload == 0.5
    assert add.num_outputs == 1 and multi.num_outputs == 2
    assert repr(add) == f"Node(aten.add.Tensor, float32[4, 5], #{add.hash & 0xFFFFFFFF:08x})"
    low = add.digest & (2**64 - 1)
    assert add.hash == (low - 2**64 if low >> 63 else low)
    # Structural: payloads never enter, every other field does.
    twin_a = Node(DATA, (), None, "float32", (4, 5), payload="other buffer")
    twin_s = Node(SCALAR, (), None, "float64", (), payload=2.5)
    arg = ((Operand(0), Operand(1)), ())
    assert Node("aten.add.Tensor", (twin_a, twin_s), arg, "float32", (4, 5)).digest == add.digest
    changed = [
        Node("aten.sub.Tensor", (a, s), arg, "float32", (4, 5)),
        Node("aten.add.Tensor", (s, a), arg, "float32", (4, 5)),
        Node("aten.add.Tensor", (a, s), ((Operand(1), Operand(0)), ()), "float32", (4, 5)),
        Node("aten.add.Tensor", (a, s), arg, "float64", (4, 5)),
        Node("aten.add.Tensor", (a, s), arg, "float32", (5, 4)),
        Node("aten.add.Tensor", (a,), arg, "float32", (4, 5)),
    ]
    assert len({n.digest for n in changed} | {add.digest}) == len(changed) + 1
    # Deep sources, and every kind of value a template holds.
    deep = [add, Node("aten.add.Tensor", (twin_a, twin_s), arg, "float32", (4, 5))]
    for _ in range(50):
        deep = [
            Node("aten.neg.default", (d,), ((Operand(0),), ()), "float32", (4, 5)) for d in deep
        ]
        assert deep[0].digest == deep[1].digest
    values = (None, True, -1, -2, 2**70, -(2**64), 8.0, -0.0, float("nan"), 1j, "é", b"x", ())
    full = [Node("op", (a,), ((Operand(0), values), (("k", (1, (2.5,))),)), "float32", (4,))]
    full.append(Node("op", (a,), ((Operand(0), values), (("k", (1, (2.5,))),)), "float32", (4,)))
    assert full[0].digest == full[1].digest


def test_node_construction_errors_and_attributes():
    a = Node(DATA, (), None, "float32", (2,), payload=1)
    with pytest.raises(TypeError):
        Node("aten.neg.default", [a], None, "float32", (2,))  # src must be a tuple
    with pytest.raises(TypeError):
        Node("aten.neg.default", ("not a node",), None, "float32", (2,))
    with pytest.raises(TypeError):
        Node("aten.neg.default", (a,), [], "float32", (2,))  # not a key: a list
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        Node("op", (a,), ((Operand(0), _Attributes()),), "float32", (4,))
    with pytest.raises(TypeError):
        Node("aten.neg.default", (a,), None, "float32")
    a.site = "model.py:3"
    assert a.site == "model.py:3"
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None


def test_nodes_record_the_attributed_site():
    previous = ir.attribute_to("train.py:12")
    try:
        assert Node(DATA, (), None, "float32", (2,)).site == "train.py:12"
        assert ir.current_site() == "train.py:12"
    finally:
        ir.attribute_to(previous)
    assert Node(DATA, (), None, "float32", (2,)).site is None


def test_a_long_chain_frees_without_recursing():
    x = Node(DATA, (), None, "float32", (2,))
    first = weakref.ref(x)
    for _ in range(300_000):
        x = Node("aten.neg.default", (x,), None, "float32", (2,))
    del x
    assert first() is None


def test_a_wide_graph_frees_every_node():
    leaves = [Node(DATA, (), None, "float32", (2,)) for _ in range(3)]
    refs = [weakref.ref(n) for n in leaves]
    x = leaves[0]
    for i in range(10_000):
        x = Node("aten.add.Tensor", (x, leaves[i % 3]), None, "float32", (2,))
        refs.append(weakref.ref(x))
    del x, leaves
    assert all(r() is None for r in refs)


def test_nodes_stay_out_of_the_cycle_collector():
    # A DAG has no cycles: nodes, and tuples of sources and templates, are left untracked, so
    # the nodes a step records never reach the collector's oldest generation.
    a = Node(DATA, (), None, "float32", (4,))
    b = Node(
        "aten.add.Tensor",
        (a, a),
        ((Operand(0), (Operand(1), 2.0)), (("alpha", 1),)),
        "float32",
        (4,),
    )
    assert not gc.is_tracked(a) and not gc.is_tracked(b)
    assert not gc.is_tracked(b.src)
    assert not gc.is_tracked(b.arg) and not gc.is_tracked(b.arg[0][1])


class _Attributes:
    pass


def _random_graph(rng: random.Random, n: int) -> list:
    buffers = [f"buffer{i}" for i in range(4)]
    nodes = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.2 or len(nodes) < 2:
            nodes.append(Node(DATA, (), None, "float32", (2,), payload=rng.choice(buffers)))
        elif kind < 0.3:
            nodes.append(Node(SCALAR, (), None, "float64", (), payload=rng.random()))
        else:
            src = tuple(rng.choice(nodes) for _ in range(rng.randint(1, 3)))
            nodes.append(Node(f"op{i % 3}", src, None, "float32", (2,)))
    return nodes


def _post_order(roots: tuple) -> tuple[list, list]:
    """The walk's order and parameters, by the definition: a depth-first post-order from each
    root in turn, each node once; parameters (leaves of a buffer or a scalar) in first-use order,
    leaves of one buffer being one parameter."""
    order, seen, params, buffers = [], set(), [], set()

    def visit(node):
        if id(node) in seen:
            return
        seen.add(id(node))
        for child in node.src:
            visit(child)
        order.append(node)
        ident = id(node.payload) if node.op == DATA else id(node)
        if node.op in (DATA, SCALAR) and ident not in buffers:
            buffers.add(ident)
            params.append(node)

    for root in roots:
        visit(root)
    return order, params


def test_walk_is_a_post_order_with_parameters_in_first_use_order():
    rng = random.Random(0)
    for _ in range(30):
        nodes = _random_graph(rng, rng.randint(3, 60))
        roots = tuple(rng.choice(nodes) for _ in range(rng.randint(1, 6)))
        order, params, structure = _native.walk(roots, DATA, SCALAR)
        expected_order, expected_params = _post_order(roots)
        assert list(order) == expected_order and list(params) == expected_params
        assert type(structure) is int and 0 <= structure < 2**128
        assert _native.walk(roots, DATA, SCALAR)[2] == structure


def test_walk_rejects_non_nodes():
    with pytest.raises(TypeError, match="not a Node"):
        _native.walk((object(),), DATA, SCALAR)
    leaf = _Attributes()  # a source that is no Node
    with pytest.raises(TypeError, match="not a Node"):
        _native.walk(
            (Node("aten.neg.default", (Node(DATA, (), None, "f", ()),), None, "f", ()), leaf),
            DATA,
            SCALAR,
        )


# ----------------------------------------------------------------------------------------------
# Storage and its registry (storage.cpp).


def test_storage_values_and_registry():
    storage, live, pending_and_held = (
        _native.Storage,
        _native.live_storages,
        _native.pending_and_held,
    )
    buf, new_buf = object(), object()
    x = Node(DATA, (), None, "float32", (2,), payload=buf)
    add = Node("aten.add.Tensor", (x, x), ((Operand(0), Operand(1)), ()), "float32", (2,))
    before = {id(s) for s in live()}
    a, b, c = storage(x, 0), storage(add, 1), storage(add, 0)
    assert [s for s in live() if id(s) not in before] == [a, b, c]  # creation order
    assert a.buffer_id == id(buf) and b.buffer_id is None
    assert not a.pending and b.pending and b.device == 1 and a.id < b.id < c.id
    assert a.storage is a and a.steps == () and a.writable
    assert repr(b) == f"Storage#{b.id}({add!r})"
    pending, held = pending_and_held()
    assert b in pending and c in pending and a not in pending and id(buf) in held
    b.views = {("step",): x}
    b.set(Node(DATA, (), None, "float32", (2,), payload=new_buf))
    assert b.views is None and not b.pending and b.buffer_id == id(new_buf)
    b.assign(add)  # a pending value keeps the buffer the storage last held
    assert b.pending and b.buffer_id == id(new_buf)
    view = a.then(("step",))
    assert view.storage is a and view.steps == (("step",),)
    del c, pending
    gc.collect()
    assert [s for s in live() if id(s) not in before] == [a, b]


def test_c_storages_and_views_stay_out_of_the_cycle_collector():
    s = _native.Storage(Node(DATA, (), None, "float32", (2,), payload=1), 0)
    assert not gc.is_tracked(s) and not gc.is_tracked(_native.View(s))
    with pytest.raises(TypeError):
        _native.View(s, [])  # View(storage, steps=()): steps are a tuple
    with pytest.raises(TypeError):
        _native.Storage(s.node)  # Storage(node, device)
    with pytest.raises(TypeError):
        s.views = []
    with pytest.raises(AttributeError):
        s.node = s.node  # written through set only


def test_view_values_and_writes():
    storage_type, view_type = _native.Storage, _native.View
    base = Node(DATA, (), None, "float32", (4,), payload=object())
    half = ViewStep("aten.slice.Tensor", (0, 0, 2), "float32", (2,), "aten.slice_scatter.default")
    row = ViewStep("aten.select.int", (0, 1), "float32", (), "aten.select_scatter.default")
    frozen = ViewStep("aten.expand.default", (2, 4), "float32", (2, 4), None, error="no inverse")
    s = storage_type(base, 3)
    whole = view_type(s)
    v = whole.then(half).then(row)
    assert type(v) is view_type and v.storage is s and v.steps == (half, row)
    assert whole.node is base and v.device == 3 and v.writable
    access = v.node
    assert access.op == "aten.select.int" and access.src[0].op == "aten.slice.Tensor"
    assert v.node is access  # cached on the storage per value: views share one Access node
    assert view_type(s, (half, row)).node is access
    new = Node("aten.neg.default", (access,), None, "float32", ())
    v.assign(new)
    assert s.node.op == "aten.slice_scatter.default" and s.node.src[0] is base
    assert s.node.src[1].op == "aten.select_scatter.default"
    assert v.node is new  # reading the view back gives what was written
    stuck = view_type(s, (frozen,))
    assert not stuck.writable
    with pytest.raises(NotWritable, match="no inverse"):
        stuck.assign(Node("aten.neg.default", (stuck.node,), None, "float32", (2, 4)))
    whole.assign(base)
    assert s.node is base and s.views is None


# ----------------------------------------------------------------------------------------------
# A barrier's bookkeeping (storage.cpp: settle, buffer_partners, unheld).


def test_barrier_bookkeeping():
    storage, settle, buffer_partners, unheld = (
        _native.Storage,
        _native.settle,
        _native.buffer_partners,
        _native.unheld,
    )
    bufs = [object() for _ in range(4)]
    leaves = [Node(DATA, (), None, "float32", (2,), payload=b) for b in bufs]
    wide = Node(DATA, (), None, "float32", (3,), payload=object())
    neg = [Node("aten.neg.default", (x,), ((Operand(0),), ()), "float32", (2,)) for x in leaves]
    # Storages 0 and 1 last held bufs[0] and bufs[1]; 2 shares storage 1's root; 3 held nothing.
    s = [storage(leaves[0], 0), storage(leaves[1], 0), storage(leaves[2], 0)]
    s[0].set(neg[1])
    s[1].set(neg[0])
    s[2].set(neg[0])
    s.append(storage(neg[3], 0))
    roots = (neg[1], neg[0], neg[3])
    params = (leaves[0], leaves[1], wide, leaves[3], leaves[2])
    # bufs[0] and bufs[2] are donated; bufs[2] was storage 2's, whose last value wins over none.
    assert buffer_partners(s, params, (0, 4), roots) == {0: 0, 4: 1}
    assert buffer_partners(s, params, (), roots) == {}
    # Slot 0 (float32 (2,)) takes two outputs, slot 1 one; bufs[1] is still held.
    held = {id(bufs[1])}
    candidates = ((0, 0), (1, 0), (2, 1), (3, 0), (4, 0))
    assert unheld(params, candidates, (2, 1), held) == (0, 2, 3)
    assert unheld(params, candidates, (0, 1), held) == (2,)
    outputs = ("out0", "out1", "out3")
    settle(s, roots, outputs)
    assert [x.node.payload for x in s] == ["out0", "out1", "out1", "out3"]
    assert all(x.node.op == DATA and not x.pending and x.node.shape == (2,) for x in s)
    assert [x.buffer_id for x in s] == [id(o) for o in ("out0", "out1", "out1", "out3")]
    with pytest.raises(KeyError):
        settle([storage(neg[2], 0)], roots, outputs)  # a value that is not a root


def test_barrier_bookkeeping_rejects_bad_arguments():
    leaf = Node(DATA, (), None, "float32", (2,), payload=1)
    with pytest.raises(TypeError):
        _native.settle([object()], (leaf,), (1,))
    with pytest.raises(TypeError):
        _native.settle([], (leaf,), ())  # one output per root
    with pytest.raises(IndexError):
        _native.buffer_partners([], (leaf,), (3,), (leaf,))
    with pytest.raises(IndexError):
        _native.unheld((leaf,), ((0, 5),), (1,), set())
