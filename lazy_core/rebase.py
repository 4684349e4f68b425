"""Partial syncs that settle: which other values a synced graph computes, and pending IR rebased
onto what it computed.

A partial sync (``.item()``, ``.cpu()``, a fallback) computes the graph of a few storages. Every
other live storage whose value that graph computes, and every node of it that other pending IR
reads, becomes an output too; afterwards the pending IR that read those nodes reads their device
buffers instead. So no value is computed twice, and a loop that observes a value every iteration
records the same graph each time instead of one that grows by an iteration per sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lazy_core.graph import Graph
from lazy_core.ir import MOVEMENT_OPS, PARAM_OPS, Node, data_leaf

_NEVER = 1 << 64  # above every Node.seq


def extra_outputs(
    graph: Graph, chosen: Iterable[object], pending: Iterable[object]
) -> tuple[list, list[Node], list]:
    """For ``graph``, cut for the storages ``chosen``: the other ``pending`` storages
    whose value is one of its nodes; the nodes that IR outside it reads (in a deterministic
    order, so the graph with them as roots keeps one key across iterations); and the storages
    whose value may read them (for ``rebase``; a superset).

    A multi-output node is read through ``getitem`` nodes; where one outside reads it, that
    ``getitem`` is the output. Parameter-free values, and views and copies of device data, are
    left out.

    The walks stop at nodes made before every node that could be an output (``Node.seq``): they
    cannot read one. So IR that grows by a node per sync (a generation loop's ``torch.cat`` of
    its tokens) costs each sync its new nodes, not all of them.
    """
    nodes = graph.nodes
    inside = set(map(id, nodes))
    fixed_at, candidates = _positions(graph)
    fixed = {id(nodes[i]) for i in fixed_at}  # never outputs: made again where read
    floor = min([nodes[i].seq for i in candidates], default=_NEVER)  # see Node.seq
    skip = {id(s) for s in chosen}
    contained, readers = [], []
    boundary: dict[int, Node] = {}
    seen: dict[int, bool] = {}  # node id -> whether the walk that saw it first found a read
    for s in pending:
        if id(s) in skip:
            continue
        node = s.node
        if id(node) in inside:
            if id(node) not in fixed:
                contained.append(s)
            continue
        if node.seq < floor:
            continue
        reads = False
        walked = []
        stack = [node]
        while stack:
            n = stack.pop()
            if id(n) in seen:
                reads = reads or seen[id(n)]
                continue
            seen[id(n)] = False
            walked.append(id(n))
            for src in n.src:
                if id(src) in inside:
                    if src.src and id(src) not in fixed:  # leaves are read where they are
                        read = n if src.num_outputs > 1 else src
                        boundary.setdefault(id(read), read)
                        reads = True
                elif src.src and src.seq >= floor:
                    stack.append(src)
        if reads:  # every node this walk saw counts as reading: a later walk may share them
            readers.append(s)
            seen.update(dict.fromkeys(walked, True))
    return contained, list(boundary.values()), readers


class Computed(dict):
    """Root identity -> a data leaf of the buffer it computed; ``floor``: the ``seq`` of the
    first-made root that is not a leaf (nodes made before it cannot read a root)."""

    __slots__ = ("floor",)


def _positions(graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The post-order positions of ``graph``'s nodes that stay pending, and of the other nodes
    that are not leaves (those that could be outputs); worked out once per graph key.

    Values that read no parameter are the same every time and cost nothing to recompute (they
    fuse into their readers): they stay pending, so their readers' graphs do not change. So do
    views and copies (MOVEMENT_OPS) of device data and of such values: an output would only
    copy them."""
    found = _plans.get(graph.key)
    if found is None:
        if len(_plans) >= 1024:
            _plans.clear()
        free: set[int] = set()  # parameter-free
        stay: set[int] = set()  # parameter-free, or views and copies of leaves and of such values
        fixed, candidates = [], []
        for i, n in enumerate(graph.nodes):  # post-order: sources first
            if n.op not in PARAM_OPS and all(id(s) in free for s in n.src):
                free.add(id(n))
            if id(n) in free or (
                n.op in MOVEMENT_OPS and all(not s.src or id(s) in stay for s in n.src)
            ):
                stay.add(id(n))
                fixed.append(i)
            elif n.src:
                candidates.append(i)
        found = _plans[graph.key] = (tuple(fixed), tuple(candidates))
    return found


_plans: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def computed_leaves(roots: Sequence[Node], outputs: Sequence[object]) -> Computed:
    computed = Computed((id(r), data_leaf(b, r.dtype, r.shape)) for r, b in zip(roots, outputs))
    computed.floor = min((r.seq for r in roots if r.src), default=_NEVER)
    return computed


def rebase(storages: Iterable[object], computed: Computed) -> None:
    """Give each storage whose pending value reads nodes in ``computed`` (identity -> data leaf)
    an equal value that reads the leaves instead. Nodes are immutable, so the nodes between are
    rebuilt (their digests then describe the new graph); IR that reads no computed node is kept,
    and the walk does not enter IR made before the first computed node.
    """
    if not computed:
        return
    memo: dict[int, Node] = dict(computed)  # id -> replacement (itself when unchanged)
    floor = computed.floor
    for s in storages:
        node = s.node
        new = _rebuilt(node, memo, floor=floor)
        if new is not node:
            s.set(new)


def substituted(roots: Sequence[Node], memo: dict[int, Node], replace: Any = None) -> list[Node]:
    """``roots`` with every node in ``memo`` (identity -> replacement) replaced, and every node
    for which ``replace(node)`` gives a node (the walk stops there); the nodes between are rebuilt.
    ``memo`` gains every node walked, so later calls share the rebuilt nodes."""
    return [_rebuilt(root, memo, replace) for root in roots]


def _rebuilt(root: Node, memo: dict[int, Node], replace: Any = None, floor: int = 0) -> Node:
    """``root`` with every node in ``memo`` replaced (iterative post-order: graphs run deep).
    Nodes made before ``floor`` (``Node.seq``) are known to read none of them."""
    stack = [(root, False)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in memo:
            continue
        if replace is not None and not expanded:
            new = replace(n)
            if new is not None:
                memo[id(n)] = new
                continue
        if not n.src or n.seq < floor:
            memo[id(n)] = n
            continue
        if not expanded:
            stack.append((n, True))
            stack.extend((s, False) for s in n.src if id(s) not in memo)
            continue
        src = tuple(memo[id(s)] for s in n.src)
        if all(a is b for a, b in zip(src, n.src)):
            memo[id(n)] = n
        else:
            memo[id(n)] = Node(n.op, src, n.arg, n.dtype, n.shape, n.payload)
    return memo[id(root)]
