"""IR nodes: immutable ``(op, src, arg, dtype, shape)`` records with structural digests."""

from __future__ import annotations

from typing import Any

from lazy_core import _native

# Leaf ops. Everything else names an operation of the lowering table (e.g. "aten.add.Tensor").
DATA = "data"  # a device buffer; digested by shape and dtype only, never by content or identity
SCALAR = "scalar"  # a Python number passed as a graph parameter; digested by dtype only
CONSTANT = "constant"  # 0 and 1, baked into the graph
GETITEM = "getitem"  # output ``arg`` of a multi-output node
ZERO_DIM = "lazy.zero_dim"  # a 0-dim tensor of its operand, a graph parameter (scalar_leaf)

LEAF_OPS = frozenset((DATA, SCALAR, CONSTANT))
PARAM_OPS = frozenset((DATA, SCALAR))
# Ops that only reshape, index or copy their operand and compute nothing: what they make of device
# data costs nothing to make again inside the graph that reads it (lazy_core/rebase.py). A copy
# counts: transformers clones the inputs it slices, and whether an earlier .item() happened to
# compute the clone must not change the graph that reads it.
MOVEMENT_OPS = frozenset(
    f"aten.{name}"
    for name in (
        "view.default", "_reshape_alias.default", "_unsafe_view.default", "squeeze.default",
        "squeeze.dim", "squeeze.dims", "unsqueeze.default", "transpose.int", "t.default",
        "permute.default", "expand.default", "slice.Tensor", "select.int", "diagonal.default",
        "clone.default", "lift_fresh.default", "alias.default",
    )
)  # fmt: skip


class Operand(tuple):
    """Marks, inside a node's ``arg`` template, where operand ``src[i]`` goes in the op's call.

    A tuple underneath so templates digest in C (this is on the per-op tracing path).
    """

    __slots__ = ()

    def __new__(cls, i: int) -> Operand:
        return tuple.__new__(cls, ("%", i))

    @property
    def i(self) -> int:
        return self[1]

    def __repr__(self) -> str:
        return f"%{self[1]}"


# Node is a C type (lazy_core/csrc/node.cpp): one IR operation with the attributes op, src, arg,
# dtype, shape (tuples of per-output entries for multi-output ops), payload (a leaf's device
# buffer or Python number; never digested), site (the user call site given to attribute_to while
# a front end records sites, else None), digest (the type-exact structural digest of op, arg,
# dtype, shape and the sources' digests: lazy_core/digest.py), hash (its low 64 bits, for
# display) and num_outputs.
Node, attribute_to, current_site = _native.Node, _native.attribute_to, _native.current_site

OPERANDS = tuple(Operand(i) for i in range(4096))  # foreach ops over many tensors use thousands
_ZERO_DIM_ARG = (OPERANDS[:1], ())


def operand(i: int) -> Operand:
    return OPERANDS[i] if i < len(OPERANDS) else Operand(i)


def operands(n: int) -> tuple[Operand, ...]:
    """The markers of operands 0 to n - 1."""
    return OPERANDS[:n] if n <= len(OPERANDS) else (*OPERANDS, *map(Operand, range(4096, n)))


class Elements(tuple):
    """A foreach node's per-element templates. Each element's markers count from its own first
    operand, so equal elements have equal templates (and one memoized shape, shared with the
    single op); ``fill`` leaves them alone, for the lowering to fill each element from its slice
    of the operands."""

    __slots__ = ()


def fill(template: Any, values: Any) -> Any:
    """``template`` with each operand marker replaced by its value in ``values``."""
    if type(template) is Operand:
        return values[template.i]
    if type(template) is tuple:
        return tuple([fill(t, values) for t in template])
    return template


def data_leaf(buffer: Any, dtype: str, shape: tuple[int, ...]) -> Node:
    """A leaf holding a device buffer."""
    return Node(DATA, (), None, dtype, shape, payload=buffer)


def scalar_leaf(value: Any, dtype: str, wrapped: bool = True) -> Node:
    """A Python number that is a graph parameter (changing it never recompiles). ``wrapped``: a
    Python number's; else a 0-dim tensor's value, the parameter made a 0-dim tensor by a
    ``ZERO_DIM`` node (type promotion ranks a 0-dim tensor above a Python number: an int64 tensor
    compared with a 0-dim float64 tensor compares in float64, with 1.5 in float32)."""
    leaf = Node(SCALAR, (), None, dtype, (), payload=value)
    return leaf if wrapped else Node(ZERO_DIM, (leaf,), _ZERO_DIM_ARG, dtype, ())


def constant(value: Any, dtype: str, wrapped: bool = True) -> Node:
    """A number baked into the graph (only 0 and 1 are). ``wrapped``: a Python number, as opposed
    to a 0-dim tensor, which keeps its dtype in type promotion."""
    return Node(CONSTANT, (), (wrapped, value), dtype, ())


def getitem(node: Node, i: int) -> Node:
    """Output ``i`` of a multi-output node."""
    return Node(GETITEM, (node,), i, node.dtype[i], node.shape[i])
