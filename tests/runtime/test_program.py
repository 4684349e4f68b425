"""runtime/program.py: a cut graph's plan -> a JAX function applying the lowering table node by
node: parameter layout (buffers, then scalars packed per dtype), outputs checked against the node's
shape and cast to its dtype, runtime-check rows, inlined CALL regions, and the table's queries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import runtime
from lazy_core import Node, Operand, cut_graph, data_leaf, digest, getitem, scalar_leaf
from lazy_core.ir import DATA, SCALAR
from lowerings import LOWERINGS
from runtime.device import x64
from runtime.program import CALL, ParamLayout, build_function, register_call

_PAIR = ((Operand(0), Operand(1)), ())
_ONE = ((Operand(0),), ())


def _leaf(values, dtype="float32"):
    return data_leaf(np.asarray(values, dtype=dtype), dtype, (len(values),))


def _run(graph, platform="cpu"):
    """The function of ``graph``'s plan, called (jitted) on the parameters' payloads as the
    executor passes them: its outputs, its check rows and the function itself."""
    layout = ParamLayout([(p.op, p.dtype) for p in graph.params])
    fn = build_function(graph.plan(), graph.outputs(), layout, platform)
    params = graph.params
    args = [params[i].payload for i in layout.data]
    args += [np.array([params[i].payload for i in m], dtype=d) for d, m in layout.groups]
    with x64():
        *outputs, rows = jax.jit(fn)(*args)
    return [np.asarray(o) for o in outputs], np.asarray(rows), fn


def test_the_lowering_table_answers_which_ops_compile_and_their_category():
    assert runtime.has_lowering("aten.add.Tensor") and runtime.has_lowering(CALL)
    assert not runtime.has_lowering("aten.no_such_op.default")
    assert runtime.op_category("aten.sum.dim_IntList") == "reduction"
    assert runtime.op_category("aten.mm.default") == "linalg"
    assert runtime.op_category(DATA) is None and runtime.op_category("aten.no_such_op") is None


def test_parameters_are_buffers_then_one_packed_array_per_scalar_dtype():
    layout = ParamLayout(
        [(DATA, "float32"), (SCALAR, "float64"), (DATA, "int64"), (SCALAR, "int64")]
        + [(SCALAR, "float64")]
    )
    assert layout.data == (0, 2)
    assert layout.groups == (("float64", (1, 4)), ("int64", (3,)))
    assert layout.slots == {0: (0, None), 2: (1, None), 1: (2, 0), 4: (2, 1), 3: (3, 0)}
    assert layout.arguments((2, 0)) == (1, 0)  # donated parameters -> argument positions


def test_the_function_computes_eagers_values_from_buffers_and_scalars():
    x = _leaf([1.5, -2.0, 4.0])
    scale, shift = scalar_leaf(2.5, "float64"), scalar_leaf(3, "int64")
    product = Node("aten.mul.Tensor", (x, scale), _PAIR, "float32", (3,))
    diff = Node("aten.sub.Tensor", (product, shift), _PAIR, "float32", (3,))
    graph = cut_graph([diff, product])
    (got_diff, got_product), rows, fn = _run(graph)
    cpu = torch.tensor([1.5, -2.0, 4.0])
    for got, want in ((got_diff, cpu * 2.5 - 3), (got_product, cpu * 2.5)):
        assert got.dtype == np.float32
        torch.testing.assert_close(torch.tensor(got), want)
    assert rows.shape == (0, 2) and rows.dtype == np.int64 and fn.errors == []


def test_outputs_are_cast_to_the_nodes_dtype_and_a_wrong_shape_is_refused(monkeypatch):
    monkeypatch.setitem(LOWERINGS, "test.widen", lambda ctx, a: a.astype(jnp.float64) / 3)
    monkeypatch.setitem(LOWERINGS, "test.shrink", lambda ctx, a: a[:2])
    x = _leaf([1.0, 2.0, 3.0])
    (got,), _, _ = _run(cut_graph([Node("test.widen", (x,), _ONE, "float32", (3,))]))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.float32([1, 2, 3]) / 3)
    with pytest.raises(AssertionError, match=r"lowering of test.shrink gave shape \(2,\), "):
        _run(cut_graph([Node("test.shrink", (x,), _ONE, "float32", (3,))]))


def test_an_op_without_a_lowering_is_not_implemented():
    node = Node("aten.no_such_op.default", (_leaf([1.0]),), _ONE, "float32", (1,))
    with pytest.raises(NotImplementedError, match="no lowering for aten.no_such_op.default"):
        _run(cut_graph([node]))


def test_runtime_keywords_reach_the_context_not_the_lowering(monkeypatch):
    seen = []

    def spy(ctx, a, **kwargs):
        seen.append((ctx.precision, kwargs, ctx.platform))
        return a

    monkeypatch.setitem(LOWERINGS, "test.spy", spy)
    template = ((Operand(0),), (("_precision", "high"), ("flag", 7)))
    node = Node("test.spy", (_leaf([1.0]),), template, "float32", (1,))
    _run(cut_graph([node]), platform="cuda")
    assert seen == [(jax.lax.Precision.HIGH, {"flag": 7}, "cuda")]


def test_runtime_checks_are_rows_of_the_output_with_eagers_errors():
    x, index = _leaf([1.0, 2.0, 3.0]), _leaf([0, 5, 1], "int64")
    template = ((Operand(0), 0, Operand(1)), ())
    node = Node("aten.index_select.default", (x, index), template, "float32", (3,))
    _, rows, fn = _run(cut_graph([node]))
    assert rows.tolist() == [[1, 5]]  # [bad, first bad index]
    ((bound, dim, size),) = fn.errors
    with pytest.raises(IndexError) as eager:
        torch.index_select(torch.tensor([1.0, 2.0, 3.0]), 0, torch.tensor([0, 5, 1]))
    error = bound.error(5, dim, size)
    assert (type(error), str(error)) == (type(eager.value), str(eager.value))


def test_a_call_node_inlines_its_registered_plan():
    a, b = _leaf([0.0, 0.0]), _leaf([0.0, 0.0])
    inner = cut_graph(
        [
            Node("aten.neg.default", (a,), _ONE, "float32", (2,)),
            Node("aten.mul.Tensor", (a, b), _PAIR, "float32", (2,)),
        ]
    )
    key = digest(("tests/runtime/test_program.py", inner.key))
    register_call(key, inner.plan(), inner.outputs())
    x, y = _leaf([1.5, -2.0]), _leaf([4.0, 0.5])
    call = Node(CALL, (x, y), key, ("float32", "float32"), ((2,), (2,)))
    (neg, product), _, _ = _run(cut_graph([getitem(call, 0), getitem(call, 1)]))
    np.testing.assert_array_equal(neg, np.float32([-1.5, 2.0]))
    np.testing.assert_array_equal(product, np.float32([6.0, -1.0]))


def test_the_rng_state_is_a_function_of_the_seed_modulo_2_to_the_64():
    state = runtime.rng_state(5)
    assert isinstance(state, np.ndarray) and state.size > 0
    np.testing.assert_array_equal(runtime.rng_state(5), state)
    np.testing.assert_array_equal(runtime.rng_state(5 + 2**64), state)
    np.testing.assert_array_equal(runtime.rng_state(-1), runtime.rng_state(2**64 - 1))
    assert not np.array_equal(runtime.rng_state(6), state)
