"""The dumps of lazy_core/dump.py: ir_dot's nodes, edges, roots, colours, legend and escaping."""

import re
import shutil
import subprocess

import pytest

from lazy_core import Node, constant, cut_graph, data_leaf, getitem, ir_dot, ir_text, scalar_leaf
from lazy_core.dump import _OTHER_COLOR, _PALETTE
from lazy_core.ir import Operand

_NODE = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|n\d+) \[(.*)\];$')
_EDGE = re.compile(r"^\s*n(\d+) -> n(\d+)(?: \[(.*)\])?;$")
_ATTR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

CATEGORIES = {"aten.add.Tensor": "elementwise", "aten.max.dim": "reduction", "aten.odd.x": "nn"}


def _call(op, *src, dtype="float32", shape=(2,)):
    args = tuple(Operand(i) for i in range(len(src)))
    return Node(op, src, (args, ()), dtype, shape)


def _unescape(value):
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], value)


def _parse(dot):
    """{node id: attrs}, [(src, dst, attrs)], {legend label: attrs} of an ir_dot output."""
    nodes, edges, legend = {}, [], {}
    for line in dot.splitlines():
        if m := _EDGE.match(line):
            edges.append((int(m[1]), int(m[2]), dict(_ATTR.findall(m[3] or ""))))
        elif m := _NODE.match(line):
            attrs = {k: _unescape(v) for k, v in _ATTR.findall(m[2])}
            if m[1].startswith('"legend:'):
                legend[attrs["label"]] = attrs
            else:
                nodes[int(m[1][1:])] = attrs
    return nodes, edges, legend


def _graph():
    x, lr, one = data_leaf("x", "float32", (2,)), scalar_leaf(0.1, "float32"), constant(1, "int64")
    y = _call("aten.add.Tensor", x, lr)
    m = Node("aten.max.dim", (y,), ((Operand(0), 0), ()), ("float32", "int64"), ((), ()))
    z = _call("aten.odd.x", getitem(m, 0), one, shape=())
    return [z, y, getitem(m, 1)]


def test_nodes_edges_and_roots_follow_ir_text():
    roots = _graph()
    nodes, edges, _ = _parse(ir_dot(roots))
    graph = cut_graph(roots)
    assert sorted(nodes) == list(range(len(graph.nodes)))
    ids = {id(n): i for i, n in enumerate(graph.nodes)}
    expected = [(ids[id(s)], i) for i, n in enumerate(graph.nodes) for s in n.src]
    assert sorted((s, d) for s, d, _ in edges) == sorted(expected)
    # ir_text numbers the nodes the same way.
    for line in ir_text(roots).splitlines()[1:-1]:
        if m := re.match(r"\s*%(\d+) = (\S+) (\S+)\(", line):
            i, type_, op = int(m[1]), m[2], m[3]
            label = nodes[i]["label"].splitlines()
            assert label[0].startswith(f"%{i} {op.removeprefix('aten.')}")
            assert label[1] == type_
    roots_seen = {}
    for i, attrs in nodes.items():
        if m := re.search(r"ROOT (\d+)", attrs["label"]):
            assert attrs["peripheries"] == "2"
            roots_seen[int(m[1])] = i
        else:
            assert "peripheries" not in attrs
    assert roots_seen == {j: ids[id(r)] for j, r in enumerate(roots)}


def test_operand_labels_only_on_nodes_with_several_sources():
    nodes, edges, _ = _parse(ir_dot(_graph()))
    for _, dst, attrs in edges:
        many = sum(d == dst for _, d, _ in edges) > 1
        assert ("label" in attrs) == many
    add = next(i for i, a in nodes.items() if " add.Tensor" in a["label"])
    assert sorted(a["label"] for _, d, a in edges if d == add) == ["0", "1"]


def test_multi_output_and_getitem_render():
    nodes, _, _ = _parse(ir_dot(_graph(), CATEGORIES.get))
    labels = [a["label"] for a in nodes.values()]
    assert any(lb.endswith("max.dim\n(float32[], int64[])") for lb in labels)
    items = [a for a in nodes.values() if " getitem " in a["label"]]
    assert sorted(a["label"].split("\n")[1] for a in items) == ["float32[]", "int64[]"]
    assert {a["fillcolor"] for a in items} == {_PALETTE["reduction"]}  # their source's colour


def test_colours_and_legend_follow_category():
    nodes, _, legend = _parse(ir_dot(_graph(), CATEGORIES.get))
    by_op = {a["label"].split("\n")[0].split(" ", 1)[1]: a for a in nodes.values()}
    assert by_op["add.Tensor"]["fillcolor"] == _PALETTE["elementwise"]
    assert by_op["odd.x"]["fillcolor"] == _OTHER_COLOR  # a category the palette does not know
    assert by_op["data"]["fillcolor"] == _PALETTE["input"]
    assert by_op["scalar 0.1"]["fillcolor"] == _PALETTE["scalar"]
    assert by_op["constant 1"]["fillcolor"] == _PALETTE["constant"]
    assert len({by_op[k]["shape"] for k in ("data", "scalar 0.1", "constant 1", "add.Tensor")}) == 4
    expected = {"input", "scalar", "constant", "elementwise", "reduction", "nn"}
    assert set(legend) == expected
    assert legend["elementwise"]["fillcolor"] == _PALETTE["elementwise"]
    assert legend["nn"]["fillcolor"] == _OTHER_COLOR


def test_without_category_ops_are_other():
    nodes, _, legend = _parse(ir_dot(_graph()))
    assert set(legend) == {"input", "scalar", "constant", "other"}
    assert nodes[2]["fillcolor"] == _OTHER_COLOR


def test_quotes_backslashes_and_newlines_are_escaped():
    x = data_leaf(None, "float32", (2,))
    y = _call('weird"op\\', x)
    y.site = 'C:\\models\\net.py:3 in "forward"\nnext line'
    dot = ir_dot([y], lambda op: 'cat"\\')
    assert 'label="%1 weird\\"op\\\\\\nfloat32[2]\\nROOT 0"' in dot
    nodes, _, legend = _parse(dot)
    assert nodes[1]["label"] == '%1 weird"op\\\nfloat32[2]\nROOT 0'
    assert nodes[1]["tooltip"] == y.site
    assert set(legend) == {"input", 'cat"\\'}
    assert "tooltip" not in nodes[0]


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dot_parses_the_output():
    y = _call('weird"op\\', data_leaf(None, "float32", (2,)))
    y.site = 'a\\b "c"'
    for dot in (ir_dot(_graph(), CATEGORIES.get), ir_dot([y])):
        cmd = ["dot", "-Tsvg"]
        done = subprocess.run(cmd, input=dot, capture_output=True, text=True, check=False)
        assert done.returncode == 0 and not done.stderr, done.stderr
