"""The graph cut at a barrier: roots -> post-order, de-duplicated parameters and a graph key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lazy_core.digest import T_GRAPH, Hasher, digest
from lazy_core.ir import DATA, PARAM_OPS, SCALAR, Node, _native


@dataclass(frozen=True)
class Graph:
    """A cut graph, ready to compile and run.

    ``nodes`` is the post-order of every node the roots need; ``params`` the parameter leaves in
    first-use order, one per distinct device buffer; ``key`` identifies the executable: a
    type-exact 128-bit digest (lazy_core/digest.py), so equal keys mean the same computation on
    parameters of the same shapes, dtypes and aliasing, never merely an equal Python hash.
    """

    roots: tuple[Node, ...]
    nodes: tuple[Node, ...]
    params: tuple[Node, ...]
    key: int

    def plan(self) -> tuple[tuple, ...]:
        """A node-free description of the computation: one ``(op, arg, dtype, shape, src)`` entry
        per node, where ``src`` holds post-order positions and a parameter's ``arg`` is its index.
        Compiled programs close over this, never over nodes (which hold device buffers)."""
        position = {id(n): i for i, n in enumerate(self.nodes)}
        param_index = _param_index(self.params)
        entries = []
        for n in self.nodes:
            if n.op in PARAM_OPS:
                entries.append((n.op, param_index[_param_identity(n)], n.dtype, n.shape, ()))
            else:
                src = tuple(position[id(s)] for s in n.src)
                entries.append((n.op, n.arg, n.dtype, n.shape, src))
        return tuple(entries)

    def outputs(self) -> tuple[int, ...]:
        """Post-order positions of the roots."""
        position = {id(n): i for i, n in enumerate(self.nodes)}
        return tuple(position[id(r)] for r in self.roots)


def key_text(key: int) -> str:
    """A graph key as the 16 hex digits that dumps and messages show."""
    return f"{key & 0xFFFFFFFFFFFFFFFF:016x}"


def _param_identity(node: Node) -> int:
    # Two leaves wrapping one device buffer are one parameter.
    return id(node.payload) if node.op == DATA else id(node)


def _param_index(params: Sequence[Node]) -> dict[int, int]:
    return {_param_identity(p): i for i, p in enumerate(params)}


def _back_ref(position: int) -> int:
    # Negative: parameter indices are not.
    return -2 - position


def cut_graph(roots: Sequence[Node], salt: Any = None) -> Graph:
    """Cut the graph that computes ``roots``: one iterative post-order walk, O(nodes).

    ``salt`` (device, donation mask, ...; anything ``digest`` takes) enters the key. Roots are
    de-duplicated by identity.
    """
    unique_roots = tuple(dict.fromkeys(roots))  # nodes compare by identity
    walk = _walk if _native is None else _native.walk
    order, params, structure = walk(unique_roots, DATA, SCALAR)
    return Graph(unique_roots, order, params, digest((structure, salt)))


def _walk(roots: tuple[Node, ...], data: str, scalar: str) -> tuple[tuple, tuple, tuple]:
    """The post-order of every node ``roots`` need, the parameter leaves in first-use order, and
    the digest of the structure: the roots' digests and the wiring. The key must tell apart graphs
    whose nodes digest alike but are wired differently (leaves digest by shape and dtype only), so
    the wiring has the parameter index of every leaf and, for every edge into a node already
    walked, that node's post-order position. (In C when built: lazy_core/csrc/node.cpp.)"""
    order: list[Node] = []
    params: list[Node] = []
    param_pos: dict[int, int] = {}
    wiring: list[int] = []
    position: dict[int, int] = {}  # id(node) -> post-order position; -1 while on the stack
    for root in roots:
        if id(root) in position:
            wiring.append(_back_ref(position[id(root)]))
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        position[id(root)] = -1
        while stack:
            node, i = stack[-1]
            if i < len(node.src):
                stack[-1] = (node, i + 1)
                child = node.src[i]
                seen = position.get(id(child))
                if seen is None:
                    position[id(child)] = -1
                    stack.append((child, 0))
                else:
                    wiring.append(_back_ref(seen))
                continue
            stack.pop()
            position[id(node)] = len(order)
            order.append(node)
            if node.op == data or node.op == scalar:
                ident = _param_identity(node)
                if ident not in param_pos:
                    param_pos[ident] = len(params)
                    params.append(node)
                wiring.append(param_pos[ident])
    h = Hasher()
    h.add(T_GRAPH)
    h.add(len(roots))
    for root in roots:
        h.add_digest(root.digest)
    for w in (len(wiring), *wiring, len(order)):
        h.add(w)
    return tuple(order), tuple(params), h.done()
