"""The graph cut at a barrier: roots -> post-order, de-duplicated parameters and a graph key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lazy_core.ir import DATA, PARAM_OPS, Node


@dataclass(frozen=True)
class Graph:
    """A cut graph, ready to compile and run.

    ``nodes`` is the post-order of every node the roots need; ``params`` the parameter leaves in
    first-use order, one per distinct device buffer; ``key`` identifies the executable: equal keys
    mean the same computation on parameters of the same shapes, dtypes and aliasing.
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


def _param_identity(node: Node) -> int:
    # Two leaves wrapping one device buffer are one parameter.
    return id(node.payload) if node.op == DATA else id(node)


def _param_index(params: Sequence[Node]) -> dict[int, int]:
    return {_param_identity(p): i for i, p in enumerate(params)}


def cut_graph(roots: Sequence[Node], salt: Any = None) -> Graph:
    """Cut the graph that computes ``roots``: one iterative post-order walk, O(nodes).

    ``salt`` (device, donation mask, ...) enters the key. Roots are de-duplicated by identity.
    """
    unique_roots: list[Node] = []
    seen_roots: set[int] = set()
    for r in roots:
        if id(r) not in seen_roots:
            seen_roots.add(id(r))
            unique_roots.append(r)

    order: list[Node] = []
    params: list[Node] = []
    param_pos: dict[int, int] = {}
    uses: list[int] = []  # the parameter index of every leaf occurrence, in walk order
    visited: set[int] = set()
    for root in unique_roots:
        if id(root) in visited:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        visited.add(id(root))
        while stack:
            node, i = stack[-1]
            if i < len(node.src):
                stack[-1] = (node, i + 1)
                child = node.src[i]
                if id(child) not in visited:
                    visited.add(id(child))
                    stack.append((child, 0))
                continue
            stack.pop()
            order.append(node)
            if node.op in PARAM_OPS:
                ident = _param_identity(node)
                if ident not in param_pos:
                    param_pos[ident] = len(params)
                    params.append(node)
                uses.append(param_pos[ident])

    key = hash((tuple(r.hash for r in unique_roots), tuple(uses), len(order), salt))
    return Graph(tuple(unique_roots), tuple(order), tuple(params), key)
