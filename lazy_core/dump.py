"""Text dumps of IR graphs, one node a line (the LazyTensor paper's Figure 1 style)."""

from __future__ import annotations

from collections.abc import Sequence

from lazy_core.graph import cut_graph
from lazy_core.ir import CONSTANT, DATA, SCALAR, Node, Operand


def _type(node: Node) -> str:
    if isinstance(node.dtype, tuple):
        return "(" + ", ".join(_type1(d, s) for d, s in zip(node.dtype, node.shape)) + ")"
    return _type1(node.dtype, node.shape)


def _type1(dtype: str, shape: tuple) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


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
    graph = cut_graph(roots)
    ids = {id(n): i for i, n in enumerate(graph.nodes)}
    lines = ["IR {"]
    for i, n in enumerate(graph.nodes):
        names = [f"%{ids[id(s)]}" for s in n.src]
        if n.op == DATA:
            call = ""
        elif n.op == SCALAR:
            call = repr(n.payload)
        elif n.op == CONSTANT:
            call = repr(n.arg[1])
        else:
            call = _fmt_call(n, names)
        site = f"  # {n.site}" if n.site else ""
        lines.append(f"  %{i} = {_type(n)} {n.op}({call}){site}")
    for j, r in enumerate(graph.roots):
        lines.append(f"  ROOT {j}: %{ids[id(r)]}")
    lines.append("}")
    return "\n".join(lines)
