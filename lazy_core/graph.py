"""The graph cut at a barrier: roots -> post-order, de-duplicated parameters and a graph key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lazy_core import _native
from lazy_core.digest import digest
from lazy_core.ir import DATA, PARAM_OPS, SCALAR, Node


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


def cut_graph(roots: Sequence[Node], salt: Any = None) -> Graph:
    """Cut the graph that computes ``roots``: one iterative post-order walk, O(nodes).

    ``salt`` (device, donation mask, ...; anything ``digest`` takes) enters the key. Roots are
    de-duplicated by identity.
    """
    unique_roots = tuple(dict.fromkeys(roots))  # nodes compare by identity
    # The walk is in C (lazy_core/csrc/node.cpp): the post-order of every node the roots need, the
    # parameter leaves in first-use order, and the digest of the structure. The key must tell
    # apart graphs whose nodes digest alike but are wired differently (leaves digest by shape and
    # dtype only), so the structure has the roots' digests, the parameter index of every leaf
    # and, for every edge into a node already walked, that node's post-order position.
    order, params, structure = _native.walk(unique_roots, DATA, SCALAR)
    return Graph(unique_roots, order, params, digest((structure, salt)))
