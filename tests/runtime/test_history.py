"""Recompile causes: the first node where a call site's new graph differs from its nearest
earlier graph."""

import pytest

from lazy_core import Node, constant, cut_graph, data_leaf
from lazy_core.ir import Operand
from runtime import history


@pytest.fixture(autouse=True)
def _fresh():
    history.reset()
    yield
    history.reset()


def _add(a, b, alpha=None):
    kwargs = (("alpha", alpha),) if alpha is not None else ()
    shape = a.shape
    return Node("aten.add.Tensor", (a, b), ((Operand(0), Operand(1)), kwargs), "float32", shape)


def _record(site, roots, donate=(), order=None, spares=0):
    graph = cut_graph(roots)
    return history.record(site, graph, graph.plan(), donate, order, spares)


def test_first_compile_of_a_site_has_no_reason_and_other_sites_are_separate():
    x = data_leaf(None, "float32", (3,))
    assert _record("a.py:1", [_add(x, x)]) is None
    assert _record("a.py:2", [_add(x, x, alpha=2)]) is None


def test_an_argument_change_names_the_node_the_argument_and_its_site():
    x = data_leaf(None, "float32", (3,))
    _record("a.py:1", [_add(x, x, alpha=2)])
    from lazy_core.ir import attribute_to

    attribute_to("model.py:7")
    try:
        node = _add(x, x, alpha=3)
    finally:
        attribute_to(None)
    reason = _record("a.py:1", [node])
    assert "at %1 aten.add.Tensor float32[3]" in reason
    assert "keywords {'alpha': 3} were {'alpha': 2}" in reason
    assert reason.endswith("created at model.py:7")


def test_a_shape_change_of_an_input_blames_its_first_user_when_it_has_no_site():
    _record("a.py:1", [_add(data_leaf(None, "float32", (3,)), constant(1, "float32"))])
    reason = _record("a.py:1", [_add(data_leaf(None, "float32", (4,)), constant(1, "float32"))])
    assert "at %0 input float32[4] (was float32[3])" in reason
    assert "used by" not in reason  # the user has no recorded site either


def test_constants_wiring_outputs_and_donation_are_told_apart():
    x, y = data_leaf(None, "float32", (3,)), data_leaf(None, "float32", (3,))
    _record("s", [_add(x, constant(0, "float32"))])
    assert "(value 1 was 0)" in _record("s", [_add(x, constant(1, "float32"))])
    history.reset()
    s = _add(x, y)
    _record("s", [_add(s, y)])
    assert "at %3 aten.add.Tensor float32[3] (operands (%2, %0) were (%2, %1))" in _record(
        "s", [_add(s, x)]
    )
    history.reset()
    a = _add(x, x)
    _record("s", [a])
    assert "same first 2 nodes, then more" in _record("s", [a, _add(a, a)])
    history.reset()
    _record("s", [a], donate=())
    assert "different donated inputs ((0,) vs ())" in _record("s", [a], donate=(0,))
    b = _add(x, x)
    _record("s", [a, b], donate=(0,))
    assert "donated inputs, each given to other outputs" in _record(
        "s", [a, b], donate=(0,), order=(1, 0)
    )
    history.reset()
    _record("s", [a, b])
    assert "same nodes, 2 spare output buffers vs 0" in _record("s", [a, b], spares=2)


def test_the_nearest_earlier_graph_is_the_longest_common_prefix():
    x = data_leaf(None, "float32", (3,))
    _record("s", [_add(x, x, alpha=2)])
    _record("s", [_add(_add(x, x), x)])  # differs from the first at %1
    reason = _record("s", [_add(_add(x, x), x, alpha=5)])  # differs from the second at %2
    assert "at %2 aten.add.Tensor" in reason
