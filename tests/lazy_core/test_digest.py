"""Type-exact digests (lazy_core/digest.py): values Python's hash() or == conflate never share a
digest, node or graph key; the C extension computes the twin's digests."""

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazy_core import cut_graph, data_leaf, digest, digest_with
from lazy_core.digest import py_digest, py_digest_with, register_atoms
from lazy_core.ir import Node, Operand, PyNode

# Values that hash() and == conflate in CPython.
CONFLATED = [
    (-1, -2),
    (8, 8.0),
    (True, 1),
    (False, 0),
    (0.0, -0.0),
    (1, 1.0),
    (1 + 0j, 1),
    (0j, -0j),
]

_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([-2, -1, 0, 1, 2, 8, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 8.0]),
    st.complex_numbers(allow_nan=False),
    st.text(max_size=12),
    st.binary(max_size=12),
)
_values = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(tuple),
        st.integers(0, 9).map(Operand),
    ),
    max_leaves=12,
)


def _exactly_equal(a, b) -> bool:
    """Equal values of equal types, floats by their bits (so -0.0 is not 0.0 and NaN is NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(map(_exactly_equal, a, b))
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) is complex:
        return _exactly_equal(a.real, b.real) and _exactly_equal(a.imag, b.imag)
    return a == b


@settings(max_examples=300, deadline=None)
@given(_values, _values)
def test_digests_are_equal_exactly_for_exactly_equal_values(a, b):
    assert digest(a) == py_digest(a)
    assert (digest(a) == digest(b)) == _exactly_equal(a, b)
    assert 0 <= digest(a) < 2**128
    d = digest(b)
    assert digest_with(d, a) == py_digest_with(d, a)
    assert (digest_with(d, a) == digest_with(d, b)) == _exactly_equal(a, b)
    assert digest_with(d, a) != digest((d, a))


@pytest.mark.parametrize("a, b", CONFLATED)
def test_conflated_values_get_different_digests(a, b):
    assert hash(a) == hash(b) or a == b  # what Python's own keys would merge
    assert digest(a) != digest(b)
    assert digest((a,)) != digest((b,))
    assert digest(((a, 2), "x")) != digest(((b, 2), "x"))


def test_nan_digests_by_bits():
    nan = float("nan")
    assert digest(nan) == digest(float("nan"))  # a NaN hits the memo again
    assert digest(nan) != digest(-nan)
    assert digest(math.inf) != digest(-math.inf)


def test_structure_and_types_of_containers_are_exact():
    assert digest(((1, 2), 3)) != digest((1, (2, 3)))
    assert digest(()) != digest(((),))
    assert digest("ab") != digest(b"ab")
    assert digest(("a", "b")) != digest(("ab",))
    assert digest(Operand(1)) != digest(("%", 1))
    assert digest(2**64) != digest(0) and digest(-(2**64)) != digest(2**64)


def test_atoms_digest_as_their_names_and_other_objects_are_refused():
    class Dtype:
        pass

    f32, f64 = Dtype(), Dtype()
    register_atoms({f32: "test.f32", f64: "test.f64"})
    assert digest((f32,)) == py_digest((f32,)) != digest((f64,))
    assert digest(f32) != digest("test.f32")
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        digest(Dtype())
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        py_digest([1])
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        digest([1])
    register_atoms({f32: "test.f32"})  # the same name again is fine
    with pytest.raises(ValueError, match="registered as"):
        register_atoms({f32: "test.other"})  # a name never changes
    assert digest((f32,)) == py_digest((f32,))


@pytest.mark.parametrize("make", [Node, PyNode], ids=["native", "python"])
@pytest.mark.parametrize("a, b", CONFLATED)
def test_nodes_and_graphs_differing_in_conflated_arguments_never_share_a_key(make, a, b):
    x = make("data", (), None, "float32", (2, 2, 2), payload="buffer")
    na = make("aten.sum.dim_IntList", (x,), ((Operand(0), (a,)), ()), "float32", (2, 2))
    nb = make("aten.sum.dim_IntList", (x,), ((Operand(0), (b,)), ()), "float32", (2, 2))
    assert na.digest != nb.digest
    if make is Node:  # cut_graph walks C nodes when the extension is built
        assert cut_graph([na]).key != cut_graph([nb]).key
        assert cut_graph([na], salt=("device", 0)).key != cut_graph([na], salt=("device", 1)).key


def test_graph_keys_see_wiring_and_salt():
    a = data_leaf("a", "float32", (2,))
    b = data_leaf("b", "float32", (2,))
    add_ab = Node("aten.add.Tensor", (a, b), ((Operand(0), Operand(1)), ()), "float32", (2,))
    add_aa = Node("aten.add.Tensor", (a, a), ((Operand(0), Operand(1)), ()), "float32", (2,))
    assert add_ab.digest == add_aa.digest  # leaves digest by shape and dtype only
    assert cut_graph([add_ab]).key != cut_graph([add_aa]).key
    assert cut_graph([add_ab], salt=-1).key != cut_graph([add_ab], salt=-2).key
