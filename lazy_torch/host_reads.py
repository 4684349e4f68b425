"""Small reads computed on the host by eager PyTorch instead of a compiled graph.

A partial sync (``.item()``, ``bool(t)``, ``.cpu()``) whose graph is small costs a first XLA
compile of 30 to 100 ms on this CPU for microseconds of work: transformers' ``generate()`` makes
five such input checks before its first token (``isin(...).any()``, ``(ids < 0).any()``), and
reads the generated sequence, a chain of one ``cat`` per token whose graph is new for every
length. Such a graph runs here node by node through the aten ops it recorded, on host copies of
its inputs: eager CPU PyTorch, the oracle itself. Its results become device data, as a compiled
graph's do, and nothing is compiled.

A graph is small when it has at most ``_NODES`` nodes, its device inputs have at most
``_INPUTS`` elements together (they are copied to the host) and all its values at most
``_ELEMENTS``. A graph that keeps coming back compiles once its reads here have cost what a
compile would (``_COMPILE_SECONDS``). ``empty`` gives zeros here, as in a compiled graph.
Evaluated elsewhere (the graph compiles as any other): ops of our own (``lazy.*``, calls,
control flow; but a 0-dim CPU tensor operand's ``lazy.zero_dim`` is one here), random ops
(their keys come from the device's RNG state), decompositions unique only up to signs
(``_NOT_UNIQUE``) and a graph on a mesh. An error while evaluating,
or a result whose shape or dtype is not the recorded one, sends the graph to the compiler, which
raises eager's error where there is one.

``LAZY_HOST_READS=0`` turns this off (runtime/config.py); the test suite runs with it off, so its
reads test the lowerings, and tests/lazy_torch/test_host_reads.py tests this path.
"""

from __future__ import annotations

import time
from typing import Any

import torch

import runtime
from lazy_core.graph import Graph
from lazy_core.ir import CONSTANT, DATA, GETITEM, SCALAR, ZERO_DIM, Operand, fill
from lazy_core.window import numel
from lazy_torch._dtypes import from_numpy, to_numpy, torch_dtype

_NODES = 4096
_INPUTS = 1 << 16
_ELEMENTS = 1 << 22
_EMPTY = "empty"  # an empty tensor's values are unspecified: zeros, as the compiled graph's
# Decompositions whose results are unique only up to signs or phases: LAPACK here and XLA's
# kernel may choose differently, and a later graph that computes the same op again (for an output
# this read did not keep) must agree with this read's outputs.
_NOT_UNIQUE = ("eig", "svd", "qr", "geqrf")
# A graph read this often is one a compile pays for: once its reads here have taken this long in
# all (a first compile of such a graph took 30 to 110 ms on this CPU), it compiles from then on,
# so a loop that reads a graph every step runs it compiled, however slow it is here.
_COMPILE_SECONDS = 0.05

# Per graph key: the graph's steps, or None where it is not evaluated here; the seconds its reads
# here took (both bounded).
_plans: dict[int, tuple | None] = {}
_spent: dict[int, float] = {}


def evaluate(graph: Graph, device_index: int, cause: str, site: str) -> tuple | None:
    """The root values of ``graph`` as device arrays, computed by eager PyTorch on the host; None
    where the graph is not one to compute so (it then compiles). ``cause`` and ``site``: the
    sync's, for LAZY_DEBUG's line."""
    if not runtime.config.HOST_READS or len(graph.nodes) > _NODES:
        return None
    plan = _plans.get(graph.key, False)
    start = time.perf_counter()
    try:
        if plan is False:
            plan = _plan(graph.plan())
        values = None if plan is None else _run(plan, graph.params)
    except Exception:
        values = None  # the compiled graph raises eager's error, if there is one
    if values is None:
        plan = None
    if len(_plans) >= 4096:
        _plans.clear()
        _spent.clear()
    _plans[graph.key] = plan
    if plan is None:
        return None
    outputs = tuple(
        runtime.stage(to_numpy(_tensor(values[i], plan[i])), device_index, dtype=plan[i][2])
        for i in graph.outputs()
    )
    seconds = time.perf_counter() - start
    _spent[graph.key] = spent = _spent.get(graph.key, 0.0) + seconds
    if spent > _COMPILE_SECONDS:
        _plans[graph.key] = None
    runtime.metrics.count("host_reads")
    runtime.metrics.time("host_read_time", seconds)
    if runtime.metrics.listening():
        n = len(graph.nodes)
        runtime.metrics.event(
            runtime.metrics.GraphEvent("execute", cause, site, graph.key, n, seconds, "host")
        )
    return outputs


def _plan(entries: tuple) -> tuple | None:
    """``graph.plan()``'s entries with each op's aten function and revived template in place of
    its name and arg; None if some node is not one to run here."""
    elements = inputs = 0
    steps = []
    for op, arg, dtype, shape, src in entries:
        shapes = shape if isinstance(dtype, tuple) else (shape,)
        elements += sum(numel(s) for s in shapes if s is not None)
        inputs += numel(shape) if op == DATA else 0
        if elements > _ELEMENTS or inputs > _INPUTS:
            return None
        if op == CONSTANT:
            wrapped, number = arg
            arg = number if wrapped else torch.tensor(number, dtype=torch_dtype(dtype))
        elif op.startswith("aten.") and "empty" in op.split(".")[1]:
            op = _EMPTY
        elif op not in (DATA, SCALAR, GETITEM, ZERO_DIM):
            func = _function(op)
            if func is None:
                return None
            op, arg = func, _template(func, arg)
        steps.append((op, arg, dtype, shape, src))
    return tuple(steps)


def _run(plan: tuple, params: tuple) -> list | None:
    """Each node's eager value, or None where one is not what the node recorded."""
    env: list[Any] = []
    for op, arg, dtype, shape, src in plan:
        if op == DATA:
            value = from_numpy(runtime.to_host(params[arg].payload), torch_dtype(dtype))
        elif op == SCALAR:  # a Python number (a 0-dim CPU tensor's is under a ZERO_DIM node)
            value = params[arg].payload
        elif op == CONSTANT:
            value = arg
        elif op == GETITEM:
            value = env[src[0]][arg]
        elif op == _EMPTY:
            value = torch.zeros(shape, dtype=torch_dtype(dtype))
        elif op == ZERO_DIM:
            value = torch.tensor(env[src[0]], dtype=torch_dtype(dtype))
        else:
            args, kwargs, precision = arg
            if precision is not None and precision != torch.get_float32_matmul_precision():
                return None  # eager would compute it at another precision than recorded
            operands = [env[s] for s in src]
            value = op(*fill(args, operands), **dict(fill(kwargs, operands)))
            if not _as_recorded(value, dtype, shape):
                return None
        env.append(value)
    return env


def _tensor(value: Any, entry: tuple) -> torch.Tensor:
    """A root's value as a tensor (a root may be a parameter or a constant, a Python number)."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.tensor(value, dtype=torch_dtype(entry[2]))


def _as_recorded(value: Any, dtype: Any, shape: Any) -> bool:
    """Whether eager's result has the shapes and dtypes the node recorded."""
    if isinstance(dtype, tuple):
        return (
            isinstance(value, (tuple, list))
            and len(value) == len(dtype)
            and all(_as_recorded(v, d, s) for v, d, s in zip(value, dtype, shape) if d is not None)
        )
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch_dtype(dtype)
        and tuple(value.shape) == shape
    )


_functions: dict[str, Any] = {}


def _function(op: str) -> Any:
    """The aten overload named ``op`` if eager computes on the host what its lowering does."""
    if op in _functions:
        return _functions[op]
    func = None
    parts = op.split(".")
    if len(parts) == 3 and parts[0] == "aten" and not any(d in parts[1] for d in _NOT_UNIQUE):
        packet = getattr(torch.ops.aten, parts[1], None)
        found = getattr(packet, parts[2], None) if packet is not None else None
        if found is not None and torch.Tag.nondeterministic_seeded not in found.tags:
            func = found
    _functions[op] = func
    return func


def _template(func: Any, arg: tuple) -> tuple:
    """A node's ``(args, kwargs)`` template with the strings that stand for dtypes, devices,
    layouts and memory formats made those objects again (the device: the host's), and the
    float32 matmul precision a matmul recorded (None for other ops), apart."""
    args, kwargs = arg
    schema = func._schema.arguments
    args = tuple(_revive(a, str(s.real_type)) for a, s in zip(args, schema))
    types = {s.name: str(s.real_type) for s in schema}
    precision = dict(kwargs).get("_precision")
    kwargs = tuple((k, _revive(v, types.get(k, ""))) for k, v in kwargs if k != "_precision")
    return args, kwargs, precision


def _revive(value: Any, type_name: str) -> Any:
    if type(value) is Operand or type(value) is not str and type(value) is not tuple:
        return value
    if type(value) is tuple:
        return tuple(_revive(v, type_name) for v in value)
    if "ScalarType" in type_name:
        return torch_dtype(value)
    if "Device" in type_name:
        return torch.device("cpu")
    if "Layout" in type_name or "MemoryFormat" in type_name:
        return getattr(torch, value.removeprefix("torch."))
    return value
