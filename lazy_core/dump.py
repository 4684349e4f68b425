"""Dumps of IR graphs: text, one node a line (the LazyTensor paper's Figure 1 style), and dot."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lazy_core.graph import cut_graph
from lazy_core.ir import CONSTANT, DATA, GETITEM, LEAF_OPS, SCALAR, Node, Operand


def _numbered(roots: Sequence[Node]) -> tuple[tuple[Node, ...], dict[int, int], tuple[Node, ...]]:
    """Post-order nodes, ``id(node) -> %i`` and the de-duplicated roots of the graph of ``roots``."""
    graph = cut_graph(roots)
    return graph.nodes, {id(n): i for i, n in enumerate(graph.nodes)}, graph.roots


def type_text(dtype: object, shape: tuple) -> str:
    """``float32[2,3]``; a multi-output node's per-output tuples as ``(float32[2], int64[])``,
    with ``none`` for an output the node does not produce."""
    if isinstance(dtype, tuple):
        return "(" + ", ".join(type_text(d, s) for d, s in zip(dtype, shape)) + ")"
    if dtype is None:
        return "none"
    return f"{dtype}[{','.join(map(str, shape))}]"


def _type(node: Node) -> str:
    return type_text(node.dtype, node.shape)


def _leaf_value(node: Node) -> str:
    """What a leaf holds, as the dumps show it: nothing for device data, else the number."""
    if node.op == SCALAR:
        return repr(node.payload)
    if node.op == CONSTANT:
        return repr(node.arg[1])
    return ""


def _fmt_arg(arg: object, names: list[str]) -> str:
    if isinstance(arg, Operand):
        return names[arg.i]
    if isinstance(arg, tuple):
        inner = ", ".join(_fmt_arg(a, names) for a in arg)
        return f"({inner})" if len(arg) != 1 else f"({inner},)"
    return repr(arg)


def _fmt_call(node: Node, names: list[str]) -> str:
    if (
        isinstance(node.arg, tuple)
        and len(node.arg) == 2
        and isinstance(node.arg[0], tuple)
        and isinstance(node.arg[1], tuple)
    ):
        args, kwargs = node.arg
        parts = [_fmt_arg(a, names) for a in args]
        parts += [f"{k}={_fmt_arg(v, names)}" for k, v in kwargs]
        return ", ".join(parts)
    srcs = ", ".join(names)
    return srcs if node.arg is None else f"{srcs}, {node.arg!r}" if srcs else repr(node.arg)


def ir_text(roots: Sequence[Node]) -> str:
    """The graph computing ``roots``, one node a line: ``%3 = f32[2,3] aten.add.Tensor(%1, %2)``.

    >>> from lazy_core.ir import data_leaf
    >>> print(ir_text([data_leaf(None, "float32", (2,))]))
    IR {
      %0 = float32[2] data()
      ROOT 0: %0
    }
    """
    nodes, ids, graph_roots = _numbered(roots)
    lines = ["IR {"]
    for i, n in enumerate(nodes):
        names = [f"%{ids[id(s)]}" for s in n.src]
        call = _leaf_value(n) if n.op in LEAF_OPS else _fmt_call(n, names)
        site = f"  # {n.site}" if n.site else ""
        lines.append(f"  %{i} = {_type(n)} {n.op}({call}){site}")
    for j, r in enumerate(graph_roots):
        lines.append(f"  ROOT {j}: %{ids[id(r)]}")
    lines.append("}")
    return "\n".join(lines)


# What each kind of leaf is called in dumps and messages; in dot dumps leaves are categories of
# their own, whatever the caller's ``category`` says.
LEAF_KINDS = {DATA: "input", SCALAR: "scalar", CONSTANT: "constant"}
_SHAPE = {"input": "ellipse", "scalar": "diamond", "constant": "octagon"}  # default: "box"

# Fill colour per category: the lowering modules, then the leaves. Anything else is _OTHER.
_PALETTE = {
    "elementwise": "#cfe2f3",
    "reduction": "#f4cccc",
    "linalg": "#d9d2e9",
    "linalg_solvers": "#b4a7d6",
    "decompositions": "#fff2cc",
    "convolution": "#f9cb9c",
    "resampling": "#fce5cd",
    "normalization": "#d9ead3",
    "losses": "#ea9999",
    "indexing": "#a2c4c9",
    "scatter": "#76a5af",
    "selection": "#b6d7a8",
    "sorting": "#ffe599",
    "movement": "#e6e6e6",
    "creation": "#c9daf8",
    "random": "#ead1dc",
    "fft": "#a4c2f4",
    "special": "#d5a6bd",
    "input": "#93c47d",
    "scalar": "#ffd966",
    "constant": "#f3f3f3",
}
_OTHER = "other"
_OTHER_COLOR = "#bdbdbd"


def _quote(text: object) -> str:
    """A dot string literal: quotes and backslashes escaped, line breaks as dot's ``\\n``."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
    return '"' + s.replace("\n", "\\n") + '"'


def _attrs(**attrs: object) -> str:
    return "[" + ", ".join(f"{k}={_quote(v)}" for k, v in attrs.items()) + "]"


def _style(cat: str) -> dict[str, str]:
    return {"shape": _SHAPE.get(cat, "box"), "fillcolor": _PALETTE.get(cat, _OTHER_COLOR)}


def _short_op(node: Node) -> str:
    if node.op == GETITEM:
        return f"getitem {node.arg}"
    if node.op in LEAF_OPS:
        return f"{node.op} {_leaf_value(node)}".rstrip()
    return node.op.removeprefix("aten.")


def ir_dot(roots: Sequence[Node], category: Callable[[str], str | None] | None = None) -> str:
    """The graph computing ``roots`` as a Graphviz ``digraph``, numbered like :func:`ir_text`.

    Nodes are coloured by ``category(op)`` (e.g. ``runtime.op_category``, the lowering module),
    leaves by kind, a ``getitem`` like its source; roots get a double border. A legend lists
    the categories present. ``site`` becomes the node's tooltip.

    >>> from lazy_core.ir import data_leaf
    >>> dot = ir_dot([data_leaf(None, "float32", (2,))])
    >>> dot.startswith("digraph IR {"), "ROOT 0" in dot, '"legend:input"' in dot
    (True, True, True)
    """
    nodes, ids, graph_roots = _numbered(roots)
    root_of = {id(r): j for j, r in enumerate(graph_roots)}
    lines = [
        "digraph IR {",
        '  node [style="rounded,filled", fontname="monospace", fontsize="10"];',
        '  edge [fontsize="8", color="#666666"];',
    ]
    cats: list[str] = []  # per post-order position
    for i, n in enumerate(nodes):
        if n.op in LEAF_OPS:
            cat = LEAF_KINDS[n.op]
        elif n.op == GETITEM:
            cat = cats[ids[id(n.src[0])]]
        else:
            cat = (category(n.op) if category else None) or _OTHER
        cats.append(cat)
        label = f"%{i} {_short_op(n)}\n{_type(n)}"
        attrs = _style(cat)
        if id(n) in root_of:
            label += f"\nROOT {root_of[id(n)]}"
            attrs.update(peripheries="2", penwidth="2")
        if n.site:
            attrs["tooltip"] = n.site
        lines.append(f"  n{i} {_attrs(label=label, **attrs)};")
        for k, s in enumerate(n.src):
            edge = f" {_attrs(label=k)}" if len(n.src) > 1 else ""
            lines.append(f"  n{ids[id(s)]} -> n{i}{edge};")
    lines += ["  subgraph cluster_legend {", '    label="categories"; style="dashed";']
    for cat in dict.fromkeys(cats):
        lines.append(f"    {_quote('legend:' + cat)} {_attrs(label=cat, **_style(cat))};")
    lines += ["  }", "}"]
    return "\n".join(lines)
