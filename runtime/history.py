"""Why did this call site compile again? The first node where a new graph differs from the nearest
graph compiled earlier at the same user call site."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from lazy_core.dump import LEAF_KINDS, type_text
from lazy_core.graph import Graph, key_text
from lazy_core.ir import CONSTANT, DATA, SCALAR

_KEEP = 16  # graphs remembered per call site


@dataclass(frozen=True)
class Compiled:
    """What a compiled graph looked like: its plan, the user site of each node, roots, donation."""

    key: int
    plan: tuple[tuple, ...]
    sites: tuple[str | None, ...]
    outputs: tuple[int, ...]
    donate: tuple[int, ...]
    order: tuple[int, ...] | None  # the order the executable returns its roots in
    spares: int  # spare buffers donated after the parameters (donation.py)


_by_site: dict[str, collections.deque[Compiled]] = {}


def record(
    site: str,
    graph: Graph,
    plan: tuple,
    donate: tuple[int, ...],
    order: tuple[int, ...] | None = None,
    spares: int = 0,
) -> str | None:
    """Remember a graph compiled for ``site``; returns why it differs from the site's nearest
    earlier graph, or None for the site's first compile."""
    sites = tuple(n.site for n in graph.nodes)
    new = Compiled(graph.key, plan, sites, graph.outputs(), donate, order, spares)
    earlier = _by_site.setdefault(site, collections.deque(maxlen=_KEEP))
    reason = _explain(new, earlier) if earlier else None
    earlier.append(new)
    return reason


def reset() -> None:
    _by_site.clear()


def _common_prefix(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _explain(new: Compiled, earlier: collections.deque[Compiled]) -> str:
    # Nearest: the longest identical post-order prefix; the most recent on ties.
    best, same = None, -1
    for old in earlier:
        n = _common_prefix(new.plan, old.plan)
        if n >= same:
            best, same = old, n
    base = f"differs from graph {key_text(best.key)}"
    if same < min(len(new.plan), len(best.plan)):
        return f"{base} at {_node_change(new, best.plan[same], same)}"
    if len(new.plan) != len(best.plan):
        longer = "more" if len(new.plan) > len(best.plan) else "fewer"
        return (
            f"{base}: same first {same} nodes, then {longer} ({len(new.plan)} vs {len(best.plan)})"
        )
    if new.outputs != best.outputs:
        return f"{base}: same nodes, different outputs (roots {new.outputs} vs {best.outputs})"
    if new.donate != best.donate:
        return f"{base}: same nodes, different donated inputs ({new.donate} vs {best.donate})"
    if new.spares != best.spares:
        return f"{base}: same nodes, {new.spares} spare output buffers vs {best.spares}"
    return f"{base}: same nodes and donated inputs, each given to other outputs"


def _short(v: object, limit: int = 80) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _node_change(new: Compiled, old_entry: tuple, i: int) -> str:
    op, arg, dtype, shape, src = new.plan[i]
    o_op, o_arg, o_dtype, o_shape, o_src = old_entry
    name = LEAF_KINDS.get(op, op)
    changes = []
    if op != o_op:
        changes.append(f"was {LEAF_KINDS.get(o_op, o_op)}")
    if (dtype, shape) != (o_dtype, o_shape):
        changes.append(f"was {type_text(o_dtype, o_shape)}")
    if op == o_op and arg != o_arg:
        if op in (DATA, SCALAR):
            changes.append(f"parameter {arg} was {o_arg}")
        elif op == CONSTANT:
            changes.append(f"value {arg[1]!r} was {o_arg[1]!r}")
        else:
            changes.append(_arg_change(arg, o_arg))
    if op == o_op and src != o_src:
        changes.append(f"operands {_refs(src)} were {_refs(o_src)}")
    head = f"%{i} {name} {type_text(dtype, shape)} ({'; '.join(changes)})"
    if new.sites[i]:
        return f"{head}, created at {new.sites[i]}"
    # A leaf, or a node created where sites are not recorded: name its first user instead.
    users = (j for j in range(i + 1, len(new.plan)) if i in new.plan[j][4])
    j = next(users, None)
    if j is not None and new.sites[j]:
        return f"{head}, used by %{j} {new.plan[j][0]} at {new.sites[j]}"
    return head


def _refs(src: tuple) -> str:
    return "(" + ", ".join(f"%{s}" for s in src) + ")"


def _arg_change(arg: object, old: object) -> str:
    # Node templates are (args, kwargs); name the first argument that differs.
    if (
        isinstance(arg, tuple)
        and isinstance(old, tuple)
        and len(arg) == len(old) == 2
        and all(isinstance(p, tuple) for p in (*arg, *old))
    ):
        (args, kwargs), (o_args, o_kwargs) = arg, old
        for j, (a, b) in enumerate(zip(args, o_args)):
            if a != b:
                return f"argument {j}: {_short(a)} was {_short(b)}"
        if len(args) != len(o_args):
            return f"arguments {_short(args)} were {_short(o_args)}"
        return f"keywords {_short(dict(kwargs))} were {_short(dict(o_kwargs))}"
    return f"attribute {_short(arg)} was {_short(old)}"
