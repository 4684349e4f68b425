"""Which donated buffers an executable keeps, and the order it returns its roots in, so that
JAX's donation pairing (each output takes the first unused donated argument of its shape and
dtype) gives each buffer to its partner root."""

from lazy_core import Node, Operand, cut_graph, data_leaf
from runtime.donation import pairing as _pairing


def _add(a, b):
    return Node("aten.add.Tensor", (a, b), ((Operand(0), Operand(1)), ()), "float32", (3,))


def _jax_pairs(graph, donate, order):
    """Parameter -> root, as JAX pairs donated arguments with the outputs in ``order``."""
    outputs = order or range(len(graph.roots))
    free = list(donate)  # one shape and dtype here: first unused donated argument
    return {free.pop(0): k for k in outputs if free}


def test_each_donated_buffer_goes_to_its_partner_root():
    x, y, w = (data_leaf(object(), "float32", (3,)) for _ in range(3))
    graph = cut_graph([_add(_add(x, y), w), _add(w, w)])  # parameters x, y, w
    donate, order = _pairing(graph, (0, 1, 2), {0: 1, 2: 0})
    assert _jax_pairs(graph, donate, order) == {0: 1, 2: 0}
    # y has no partner and no root is left for it: donating it would take w's partner.
    assert donate == (0, 2)


def test_a_root_claimed_by_two_parameters_goes_to_the_first():
    x, y, w = (data_leaf(object(), "float32", (3,)) for _ in range(3))
    graph = cut_graph([_add(_add(x, y), w), _add(w, w)])
    donate, order = _pairing(graph, (0, 1, 2), {0: 0, 1: 0, 2: 1})
    assert _jax_pairs(graph, donate, order) == {0: 0, 2: 1}
    assert order is None or sorted(order) == [0, 1]


def test_spares_follow_the_parameters_and_go_to_their_partner_roots():
    x, y = (data_leaf(object(), "float32", (3,)) for _ in range(2))
    graph = cut_graph([_add(x, y), _add(y, y), _add(x, x)])  # parameters x, y; three roots
    slot = ((3,), "float32")
    # x donated with partner root 2; spares 2 and 3 (after the two parameters) were roots 0 and 1.
    donate, order = _pairing(graph, (0, 2, 3), {0: 2, 2: 0, 3: 1}, (slot, slot))
    assert donate == (0, 2, 3)
    assert _jax_pairs(graph, donate, order) == {0: 2, 2: 0, 3: 1}
    # A spare of a shape no root has is left out.
    donate, order = _pairing(graph, (2,), {}, (((4,), "float32"),))
    assert donate == () and order is None
