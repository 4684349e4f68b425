"""Type-exact digests (lazy_core/digest.py): values Python's hash() or == conflate never share a
digest, node or graph key, and a value's digest is the same in every process and version."""

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazy_core import cut_graph, data_leaf, digest, digest_with
from lazy_core.digest import register_atoms
from lazy_core.ir import Node, Operand

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
    assert (digest(a) == digest(b)) == _exactly_equal(a, b)
    assert 0 <= digest(a) < 2**128
    d = digest(b)
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
    assert digest((f32,)) != digest((f64,))
    assert digest(f32) != digest("test.f32")
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        digest(Dtype())
    with pytest.raises(TypeError, match="cannot be part of an IR key"):
        digest([1])
    register_atoms({f32: "test.f32"})  # the same name again is fine
    with pytest.raises(ValueError, match="registered as"):
        register_atoms({f32: "test.other"})  # a name never changes
    assert digest((f32,)) == digest((f32,))


# Digests of the stream the module docstring describes, as this code computed them when they were
# written: they must never change with the process (PYTHONHASHSEED), the platform or a release,
# or LAZY_DEBUG lines, dump names and persistent caches of two runs would stop matching.
KNOWN_DIGESTS = [
    (None, 0xA875FB7ACA5B6D1EE126496961B24742),
    (True, 0xCCF91F2C5E807FDE649AD452F2087797),
    (False, 0x09CA30888541E2B536CFEFA15F97E0B2),
    (0, 0x7CC9895AD8D9793DA812993FDF764A08),
    (-1, 0xC07E4435066F7D4AC9757707A7E98588),
    (-2, 0xB9D34DBDA44DE6D42E2106821204A68E),
    (8, 0xC6CF433ADEC6B3DB78A2BF444E944A27),
    (8.0, 0xACA286032447905294557CA4DEA36057),
    (-0.0, 0x37C74A46CDD5195FB387EC3CAC16CF37),
    (2**70, 0x827079DB4D6759FD3D6D265D977AD830),
    (-(2**64), 0x592DAE14834BDAB9D3418025D066E02C),
    (1 + 2j, 0x5401E4F72A09985D0C0B4085E9BCB08D),
    ("é", 0x3ED1326779FE5EA403ED94E957CDA54B),
    (b"x", 0x1FD665129C8A8E80D457E5D310FCDDD2),
    ((), 0xE7FCD9D5DB3C35C8101FDD2706182FE9),
    ((1, (2.5, "a")), 0x4B15DEFB3927AB43025E78B00F7C89E9),
    (Operand(3), 0xD39A46D0693E19B817F3E9C39BAADB3A),
]


@pytest.mark.parametrize("value, known", KNOWN_DIGESTS, ids=[repr(v) for v, _ in KNOWN_DIGESTS])
def test_digests_never_change(value, known):
    assert digest(value) == known
    assert digest_with(digest("k"), (1, 2)) == 0xE3A9A4351F8C45E332469E5D4D961212


def test_node_digests_and_graph_keys_never_change():
    x = Node("data", (), None, "float32", (2, 3), payload="buffer")
    add = Node("aten.add.Tensor", (x, x), ((Operand(0), Operand(1)), ()), "float32", (2, 3))
    assert add.digest == 0x60BF325C7AA5B35EA09E5AC3CF295FB1
    assert add.hash == -6872956184280080463  # the low 64 bits, signed
    assert cut_graph([add]).key == 0xB85923AC9AD0FD521F70EF33CCF985B5


@pytest.mark.parametrize("a, b", CONFLATED)
def test_nodes_and_graphs_differing_in_conflated_arguments_never_share_a_key(a, b):
    x = Node("data", (), None, "float32", (2, 2, 2), payload="buffer")
    na = Node("aten.sum.dim_IntList", (x,), ((Operand(0), (a,)), ()), "float32", (2, 2))
    nb = Node("aten.sum.dim_IntList", (x,), ((Operand(0), (b,)), ()), "float32", (2, 2))
    assert na.digest != nb.digest
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
