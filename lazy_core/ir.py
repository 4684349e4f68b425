"""IR nodes: immutable ``(op, src, arg, dtype, shape)`` records with structural digests."""

from __future__ import annotations

from typing import Any

from lazy_core.digest import T_NODE, Hasher, py_digest

# Leaf ops. Everything else names an operation of the lowering table (e.g. "aten.add.Tensor").
DATA = "data"  # a device buffer; digested by shape and dtype only, never by content or identity
SCALAR = "scalar"  # a Python number passed as a graph parameter; digested by dtype only
CONSTANT = "constant"  # 0 and 1, baked into the graph
GETITEM = "getitem"  # output ``arg`` of a multi-output node

LEAF_OPS = frozenset((DATA, SCALAR, CONSTANT))
PARAM_OPS = frozenset((DATA, SCALAR))


# The user call site that new nodes are attributed to; a front end sets it while it debugs.
_site: str | None = None


def attribute_to(site: str | None) -> str | None:
    """Attribute nodes created from now on to ``site``; returns the previous site."""
    global _site
    previous, _site = _site, site
    return previous


def current_site() -> str | None:
    return _site


class PyNode:
    """One IR operation. ``dtype``/``shape`` are tuples of per-output entries for multi-output ops.

    ``digest`` is the node's type-exact structural digest (lazy_core/digest.py): op, ``arg``,
    dtype, shape and the sources' digests; executables and memos are keyed on it. ``hash`` is its
    low 64 bits, for display. ``payload`` carries a leaf's value (device buffer or Python number)
    and never enters the digest. ``site`` is the user call site that created the node, when a
    front end records sites (``attribute_to``); None otherwise.
    """

    __slots__ = (
        "__weakref__", "arg", "digest", "dtype", "hash", "op", "payload", "shape", "site", "src",
    )  # fmt: skip

    def __init__(
        self,
        op: str,
        src: tuple[Node, ...],
        arg: Any,
        dtype: Any,
        shape: tuple,
        payload: Any = None,
    ):
        self.op = op
        self.src = src
        self.arg = arg
        self.dtype = dtype
        self.shape = shape
        self.payload = payload
        self.site = _site
        h = Hasher()
        h.add(T_NODE)
        h.absorb(op)
        h.add_digest(py_digest(arg))
        h.absorb(dtype)
        h.absorb(shape)
        h.add(len(src))
        for s in src:
            h.add_digest(s.digest)
        self.digest = h.done()
        low = self.digest & 0xFFFFFFFFFFFFFFFF
        self.hash = -2 if low == (1 << 64) - 1 else low - (1 << 64) if low >> 63 else low

    @property
    def num_outputs(self) -> int:
        return len(self.dtype) if isinstance(self.dtype, tuple) else 1

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.dtype}{list(self.shape)}, #{self.hash & 0xFFFFFFFF:08x})"


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


# The C extension (lazy_core/csrc), None when it is not built; the rest of the package
# takes it from here. Its Node type has the same attributes, digest, num_outputs and repr as
# PyNode at about a fifth of the construction cost; the site it records is the one given to its
# own attribute_to.
try:
    from lazy_core import _native
except ImportError:
    _native = None
if _native is not None:
    Node, attribute_to, current_site = _native.Node, _native.attribute_to, _native.current_site
else:
    Node = PyNode

OPERANDS = tuple(Operand(i) for i in range(4096))  # foreach ops over many tensors use thousands


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


def scalar_leaf(value: Any, dtype: str) -> Node:
    """A Python number that is a graph parameter (changing it never recompiles)."""
    return Node(SCALAR, (), None, dtype, (), payload=value)


def constant(value: Any, dtype: str, wrapped: bool = True) -> Node:
    """A number baked into the graph (only 0 and 1 are). ``wrapped``: a Python number, as opposed
    to a 0-dim tensor, which keeps its dtype in type promotion."""
    return Node(CONSTANT, (), (wrapped, value), dtype, ())


def getitem(node: Node, i: int) -> Node:
    """Output ``i`` of a multi-output node."""
    return Node(GETITEM, (node,), i, node.dtype[i], node.shape[i])
