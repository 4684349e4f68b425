"""Op-by-op execution of a graph: each node runs as an executable of its own, compiled once per
(op, attributes, operand types, device) and shared by every graph that has such a node.

For a call site whose graphs keep changing (a policy-gradient episode of a new length, a sequence
one token longer), compiling each whole graph costs seconds that running it op by op does not:
the ops recur even where the graphs do not. The executor picks this path (executor._interprets);
the values are the ones the whole graph computes, by the same lowerings.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lazy_core.digest import digest
from lazy_core.graph import Graph
from lazy_core.ir import CONSTANT, DATA, GETITEM, SCALAR
from runtime import config, metrics
from runtime.device import device
from runtime.launcher import resolve
from runtime.program import ParamLayout, build_function

# Operand kinds in a node's key: a device array, a Python-number parameter (packed by dtype and
# traced, as in whole graphs), or a constant baked into the executable.
_ARRAY, _NUMBER, _CONSTANT = "array", "number", "constant"


_NO_CHECKS = np.zeros((0, 2), np.int64)


class _OpExecutable:
    __slots__ = ("compiled", "errors")

    def __init__(self, compiled: Any, errors: list):
        self.compiled = compiled
        self.errors = errors


# Least recently used first; at most config.EXECUTABLES (they hold JIT code as graphs' do).
_cache: collections.OrderedDict[int, _OpExecutable] = collections.OrderedDict()


class Steps:
    """A graph's plan with, for each operation node, the executable it runs (its key, the op and
    attribute the executable computes, its operand kinds) and a window's offset argument."""

    __slots__ = ("missing", "plan", "steps")

    def __init__(self, graph: Graph, device_index: int):
        self.plan = plan = graph.plan()
        self.steps: list[tuple | None] = []
        keys = set()
        for op, arg, dtype, shape, src in plan:
            if op in (DATA, SCALAR, CONSTANT, GETITEM):
                self.steps.append(None)
                continue
            kinds = []
            for s in src:
                s_op, s_arg, s_dtype, s_shape, _ = plan[s]
                if s_op == CONSTANT:
                    kinds.append((_CONSTANT, s_arg, s_dtype))
                elif s_op == SCALAR:
                    kinds.append((_NUMBER, s_dtype))
                else:
                    kinds.append((_ARRAY, s_dtype, s_shape))
            kinds = tuple(kinds)
            window = _window(op, arg, kinds, shape)
            offset = None
            if window is not None:  # one executable for every offset
                dim, offset, size = window
                op, arg = _WINDOW, (dim, size)
            key = digest((op, arg, dtype, shape, kinds, device_index))
            keys.add(key)
            self.steps.append((key, op, arg, kinds, offset))
        # Executables this graph would compile: where most are new (a new input shape), one whole
        # compile costs less than compiling them one by one.
        self.missing = sum(key not in _cache for key in keys)


def interpret(
    graph: Graph, steps: Steps, device_index: int, platform: str
) -> tuple[tuple, Any, list]:
    """Run ``graph`` node by node: its root values in root order, the rows of its runtime checks
    (an array ``executor.check_errors`` reads; None without checks) and each row's error."""
    plan = steps.plan
    params = graph.params
    target = device(device_index)
    env: list[Any] = []
    rows: list[Any] = []
    errors: list = []
    for (op, arg, dtype, shape, src), step in zip(plan, steps.steps):
        if op == DATA:
            value = resolve(params[arg].payload)
        elif op == SCALAR:
            value = params[arg].payload
        elif op == CONSTANT:
            value = None  # baked into the executables that read it
        elif op == GETITEM:
            value = env[src[0]][arg]
        else:
            key, op, arg, kinds, offset = step
            exe = _executable(key, op, arg, dtype, shape, kinds, device_index, platform)
            value, checks = exe.compiled(*_arguments(env, src, kinds, offset))
            if exe.errors:
                rows.append(checks)
                errors.extend(exe.errors)
        env.append(value)
    outputs = tuple(_as_array(env[i], plan[i], target) for i in graph.outputs())
    checks = None
    if rows:  # read at once: a graph runs op by op where its sync waits for it anyway
        checks = jax.device_put(np.concatenate([np.asarray(r) for r in rows]))
    return outputs, checks, errors


def _arguments(env: list, src: tuple, kinds: tuple, offset: int | None) -> list:
    """A node's arguments as its one-node graph takes them (program.ParamLayout): the arrays in
    operand order, then one array per dtype of its number operands; a window's offset last."""
    arrays = [env[s] for s, k in zip(src, kinds) if k[0] == _ARRAY]
    numbers: dict[Any, list] = {}
    for s, k in zip(src, kinds):
        if k[0] == _NUMBER:
            numbers.setdefault(k[1], []).append(env[s])
    arrays += [np.array(v, dtype=jnp.dtype(d)) for d, v in numbers.items()]
    if offset is not None:
        arrays.append(np.int32(offset))
    return arrays


def _as_array(value: Any, entry: tuple, target: Any) -> Any:
    """A root's value as a device array (a root may be a parameter or a constant)."""
    if entry[0] == CONSTANT:
        (_, number), dtype = entry[1], entry[2]
        value = np.asarray(number, dtype=jnp.dtype(dtype))
    elif entry[0] == SCALAR:
        value = np.asarray(value, dtype=jnp.dtype(entry[2]))
    if isinstance(value, np.ndarray):
        return jax.device_put(value, target)
    return value


# ``select`` and ``slice`` with a unit step read a window at an offset: the offset is an argument
# of one executable per window shape, as an episode reads each of its steps (returns[i]).
_WINDOW = "lazy.window"


def _window(op: str, arg: Any, kinds: tuple, shape: tuple) -> tuple[int, int, int] | None:
    """``(dim, start, size)`` of the window a select or unit-step slice reads; None otherwise."""
    if op not in ("aten.select.int", "aten.slice.Tensor") or kinds[0][0] != _ARRAY:
        return None
    args, kwargs = arg
    if kwargs or not all(type(a) is int or a is None for a in args[1:]):
        return None
    in_shape = kinds[0][2]
    if op == "aten.select.int":
        dim, start = args[1], args[2]
        size = 1
    else:
        dim, start, _, step = (*args[1:], *(0, None, None, 1)[len(args) - 1 :])
        if step != 1:
            return None
        start = start or 0
    dim += len(in_shape) if dim < 0 else 0
    n = in_shape[dim]
    start += n if start < 0 else 0
    if op == "aten.slice.Tensor":
        size = shape[dim]
        start = min(max(start, 0), n)
    return dim, start, size


def _executable(
    key: int,
    op: str,
    arg: Any,
    dtype: Any,
    shape: Any,
    kinds: tuple,
    device_index: int,
    platform: str,
) -> _OpExecutable:
    exe = _cache.get(key)
    if exe is not None:
        _cache.move_to_end(key)
        return exe
    start = time.perf_counter()
    sharding = jax.sharding.SingleDeviceSharding(device(device_index))
    if op == _WINDOW:
        (dim, size) = arg

        def run(x: Any, offset: Any) -> tuple:
            return jax.lax.dynamic_slice_in_dim(x, offset, size, dim).reshape(shape), _NO_CHECKS

        errors: list = []
        specs = [
            jax.ShapeDtypeStruct(kinds[0][2], jnp.dtype(kinds[0][1]), sharding=sharding),
            jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding),
        ]
    else:  # a graph of one node on leaves of the operands' kinds, built as whole graphs are
        leaves, params = [], []  # params: the non-constant operands' kinds
        for kind in kinds:
            if kind[0] == _CONSTANT:
                leaves.append((CONSTANT, kind[1], kind[2], (), ()))
            else:
                leaf_op = SCALAR if kind[0] == _NUMBER else DATA
                shape_of = () if kind[0] == _NUMBER else kind[2]
                leaves.append((leaf_op, len(params), kind[1], shape_of, ()))
                params.append(kind)
        plan = (*leaves, (op, arg, dtype, shape, tuple(range(len(kinds)))))
        layout = ParamLayout([(leaf[0], leaf[2]) for leaf in leaves if leaf[0] != CONSTANT])
        run = build_function(plan, (len(kinds),), layout, platform)
        errors = run.errors
        specs = [
            jax.ShapeDtypeStruct(params[i][2], jnp.dtype(params[i][1]), sharding=sharding)
            for i in layout.data
        ]
        specs += [
            jax.ShapeDtypeStruct((len(members),), jnp.dtype(d), sharding=sharding)
            for d, members in layout.groups
        ]
    compiled = jax.jit(run).lower(*specs).compile()
    metrics.count("compiles")
    metrics.count("op_compiles")
    metrics.time("compile_time", time.perf_counter() - start)
    exe = _cache[key] = _OpExecutable(compiled, errors)
    while len(_cache) > config.EXECUTABLES:
        _cache.popitem(last=False)
    return exe


def shed(n: int) -> None:
    """Forget the ``n`` least recently used executables."""
    for _ in range(min(n, len(_cache))):
        _cache.popitem(last=False)


def drop_cache() -> None:
    _cache.clear()


def cache_size() -> int:
    return len(_cache)
