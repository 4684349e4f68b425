"""A cut graph's plan -> a JAX function that applies the lowering table node by node."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lazy_core.ir import CONSTANT, DATA, GETITEM, SCALAR, fill
from lowerings import LOWERINGS, LoweringContext
from lowerings.bounds import has_checks, runtime_checks
from lowerings.random import initial_state, rng_key
from lowerings.registry import category, lowering_for
from runtime.device import in_x64

# Keyword arguments a front end adds to a node's template for the runtime, not for the lowering.
_PRECISION = "_precision"
_RNG = "_rng"
_RNG_INDEX = "_rng_index"


# A captured region (lazy_torch.compile): one node whose ``arg`` is the key of a graph registered
# with ``register_call``, inlined where it is used; its operands are that graph's parameters.
CALL = "lazy.call"
# Graph key -> (plan, output positions) of each registered region. The key is the graph's
# 128-bit structural digest (lazy_core.graph.cut_graph), so equal keys are equal computations.
_calls: dict[int, tuple[tuple, tuple[int, ...]]] = {}


# Control flow (lazy_torch/control_flow.py): one node each, its bodies registered regions (by
# key, as CALL's), lowered to lax.cond, lax.while_loop and lax.scan. ``arg`` gives each region
# with a map from its parameters to the node's operands:
#   COND   operands (pred, *values), arg (true key, true map, false key, false map)
#   WHILE  operands (*carries, *values), arg (cond key, cond map, body key, body map, carries)
#   SCAN   operands (*carries, *xs, *values), arg (body key, body map, carries, xs)
# A map indexes the operands after COND's predicate; WHILE's and SCAN's into the carries, the
# slices of xs (SCAN) and the loop-invariant values, in operand order.
COND = "lazy.cond"
WHILE = "lazy.while_loop"
SCAN = "lazy.scan"
CONTROL = (COND, WHILE, SCAN)


def regions(op: str, arg: Any) -> tuple[int, ...]:
    """The keys of the registered regions a CALL or control-flow node evaluates."""
    if op == CALL:
        return (arg,)
    if op == COND or op == WHILE:
        return (arg[0], arg[2])
    if op == SCAN:
        return (arg[0],)
    return ()


def register_call(key: int, plan: tuple, outputs: tuple[int, ...]) -> None:
    """Make ``CALL`` nodes whose ``arg`` is ``key`` compute ``outputs`` of ``plan`` (a graph's
    plan, lazy_core.graph.Graph.plan) from their operands, in parameter order."""
    _calls.setdefault(key, (plan, outputs))


def called(key: int) -> tuple[tuple, tuple[int, ...]]:
    """The plan and output positions of the region registered as ``key``."""
    return _calls[key]


def has_lowering(op: str) -> bool:
    """True when graphs containing ``op`` can be compiled."""
    return op in LOWERINGS or op == CALL or op in CONTROL


def op_category(op: str) -> str | None:
    """The category declared with ``op``'s lowering, its lowering module (e.g. ``"reduction"``),
    for coloring dumps; None for leaves and unlowered ops."""
    return category(op)


@in_x64  # a 64-bit seed
def rng_state(seed: int) -> np.ndarray:
    """The device RNG state after a manual seed of ``seed``: host bytes (lowerings/random.py)."""
    return initial_state(seed)


def _apply(
    op: str,
    arg: Any,
    dtype: Any,
    shape: Any,
    operands: list,
    scalar_ids: tuple,
    checks: list,
    platform: str,
    mesh: Any,
) -> Any:
    fn = lowering_for(op, platform)
    if fn is None:
        raise NotImplementedError(f"no lowering for {op}")
    args_t, kwargs_t = arg
    args = fill(args_t, operands)
    kwargs = {k: fill(v, operands) for k, v in kwargs_t}
    if has_checks(op):
        checks.extend(runtime_checks(op, args, kwargs))
    precision = kwargs.pop(_PRECISION, "highest")
    state = kwargs.pop(_RNG, None)
    key = rng_key(state, kwargs.pop(_RNG_INDEX, 0)) if state is not None else None
    multi = isinstance(dtype, tuple)
    ctx = LoweringContext(
        shapes=shape if multi else (shape,),
        dtypes=dtype if multi else (dtype,),
        precision=precision,
        rng_key=key,
        scalars=scalar_ids,
        platform=platform,
        mesh=mesh,
    )
    out = fn(ctx, *args, **kwargs)
    if multi:
        return tuple(_checked(op, o, s, d) for o, s, d in zip(out, ctx.shapes, ctx.dtypes))
    return _checked(op, out, ctx.shape, ctx.dtype)


def _checked(op: str, out: Any, shape: tuple, dtype: np.dtype) -> Any:
    if out is None:
        return None
    out = jnp.asarray(out)
    if out.shape != tuple(shape):
        raise AssertionError(f"lowering of {op} gave shape {out.shape}, expected {tuple(shape)}")
    return out if out.dtype == dtype else out.astype(dtype)


class ParamLayout:
    """How a graph's parameters reach its function: a device buffer is one argument; Python
    numbers are packed into one 1-d array per dtype, so an optimizer step's hundreds of scalars
    (learning rate, per-parameter bias corrections) cost one host-to-device copy per dtype.

    ``slots[i]`` is ``(argument, None)`` for buffer parameter ``i`` and ``(argument, element)``
    for a scalar; ``data`` lists the buffer parameters in argument order and ``groups`` the
    ``(dtype, parameter indices)`` of each packed argument after them.
    """

    __slots__ = ("data", "groups", "slots")

    def __init__(self, params: Sequence[tuple[str, Any]]):
        self.data = tuple(i for i, (op, _) in enumerate(params) if op != SCALAR)
        groups: dict[Any, list[int]] = {}
        for i, (op, dtype) in enumerate(params):
            if op == SCALAR:
                groups.setdefault(dtype, []).append(i)
        self.groups = tuple((dtype, tuple(members)) for dtype, members in groups.items())
        self.slots: dict[int, tuple[int, int | None]] = {
            i: (a, None) for a, i in enumerate(self.data)
        }
        for g, (_, members) in enumerate(self.groups):
            for k, i in enumerate(members):
                self.slots[i] = (len(self.data) + g, k)

    def arguments(self, donate: tuple[int, ...]) -> tuple[int, ...]:
        """The argument positions of donated buffer parameters."""
        return tuple(self.slots[i][0] for i in donate)


def build_function(
    plan: tuple[tuple, ...],
    outputs: tuple[int, ...],
    layout: ParamLayout,
    platform: str,
    mesh: Any = None,
    shardings: tuple = (),
) -> Callable[..., tuple]:
    """The JAX function computing ``outputs`` of ``plan`` from the arguments ``layout`` makes,
    for ``platform`` (``device.platform_of``: what a lowering with a platform's own kernel reads).
    A graph over a ``mesh`` (runtime/spmd.py) constrains output ``k`` to ``shardings[k]`` where
    that is not None.

    The function returns one more output, an int64 ``(checks, 2)`` array of ``[bad, index]``
    rows of its runtime checks (index bounds, integer division by zero; zero rows when it has
    none), and ``run.errors`` (filled when it is traced) says how to build each row's error. That
    output is never donated or handed out, so the runtime can wait on it to time the execution.
    """
    errors: list = []

    slots = layout.slots

    def run(*args: Any) -> tuple:
        # One traced value per scalar, reused everywhere: lowerings tell Python numbers by identity.
        numbers = {a: args[slots[a][0]][slots[a][1]] for op, a, *_ in plan if op == SCALAR}
        scalars = tuple(numbers.values())
        checks: list = []
        params = [numbers[i] if i in numbers else args[slots[i][0]] for i in range(len(slots))]
        env = _evaluate(plan, params, scalars, checks, platform, mesh)
        errors[:] = [error for _, error in checks]
        result = tuple(env[i] for i in outputs)
        if shardings:
            result = tuple(
                r if s is None else jax.lax.with_sharding_constraint(r, s)
                for r, s in zip(result, shardings)
            )
        rows = jnp.stack([c for c, _ in checks]) if checks else jnp.zeros((0, 2), jnp.int64)
        return (*result, rows)

    run.errors = errors
    return run


def _evaluate(
    plan: tuple, params: list, scalars: tuple, checks: list, platform: str, mesh: Any = None
) -> list:
    """The value of every entry of ``plan``, its parameter ``i`` being ``params[i]``; a CALL
    entry evaluates its registered plan on its operands (inlined: one program)."""
    env: list[Any] = []
    for op, arg, dtype, shape, src in plan:
        if op == DATA or op == SCALAR:
            value = params[arg]
        elif op == CONSTANT:
            wrapped, number = arg
            value = number if wrapped else jnp.asarray(number, dtype=dtype)
        elif op == GETITEM:
            value = env[src[0]][arg]
        elif op == CALL:
            inner, outs = _calls[arg]
            values = _evaluate(inner, [env[s] for s in src], scalars, checks, platform, mesh)
            value = tuple(values[i] for i in outs)
        elif op in CONTROL:
            region = _Region(scalars, platform, mesh)
            value = _CONTROL[op](region, arg, [env[s] for s in src])
            checks.extend(region.checks())
        else:
            operands = [env[s] for s in src]
            value = _apply(op, arg, dtype, shape, operands, scalars, checks, platform, mesh)
        env.append(value)
    return env


class _Region:
    """Evaluates registered regions inside a control-flow body. A region's runtime checks
    (index bounds) become one fixed-size ``[bad, index, which]`` row per evaluation, the first
    check that failed, so a branch or an iteration returns the same shapes whatever it checks;
    ``checks`` turns the rows the node returns into the usual ``[bad, index]`` rows."""

    def __init__(self, scalars: tuple, platform: str, mesh: Any) -> None:
        self.scalars, self.platform, self.mesh = scalars, platform, mesh
        self.errors: dict[int, list] = {}  # region key -> the errors of its checks
        self.found: list[tuple[Any, int]] = []  # (first-failure row, region key) after the node

    def __call__(self, key: int, params: list) -> tuple[list, Any]:
        plan, outs = _calls[key]
        checks: list = []
        env = _evaluate(plan, params, self.scalars, checks, self.platform, self.mesh)
        self.errors[key] = [error for _, error in checks]
        return [env[i] for i in outs], _first_failure([row for row, _ in checks])

    def checks(self) -> list:
        rows = []
        for first, key in self.found:
            for k, error in enumerate(self.errors.get(key, ())):
                bad = (first[0] != 0) & (first[2] == k)
                rows.append((jnp.stack([bad.astype(jnp.int64), first[1]]), error))
        return rows


def _first_failure(rows: list) -> Any:
    """``[bad, index, which]``: the first of ``rows`` (``[bad, index]`` each) that failed."""
    if not rows:
        return jnp.zeros((3,), jnp.int64)
    stacked = jnp.stack(rows).astype(jnp.int64)
    failed = stacked[:, 0] != 0
    which = jnp.argmax(failed)
    return jnp.stack([jnp.any(failed).astype(jnp.int64), stacked[which, 1], which])


def _earlier(a: Any, b: Any) -> Any:
    """The first failure of two in order: ``a`` if it failed, else ``b``."""
    return jnp.where(a[0] != 0, a, b)


def _cond(region: _Region, arg: tuple, operands: list) -> tuple:
    true_key, true_map, false_key, false_map = arg
    pred, values = operands[0], operands[1:]

    def branch(key: int, at: tuple) -> Any:
        def run() -> tuple:
            outs, first = region(key, [values[i] for i in at])
            return (*outs, first)

        return run

    taken = jnp.reshape(pred, ()).astype(bool)
    *outs, first = jax.lax.cond(taken, branch(true_key, true_map), branch(false_key, false_map))
    # Which branch failed: the predicate says; each branch's checks are numbered on their own.
    region.found.append((jnp.where(taken, first, jnp.zeros_like(first)), true_key))
    region.found.append((jnp.where(taken, jnp.zeros_like(first), first), false_key))
    return tuple(outs)


def _while(region: _Region, arg: tuple, operands: list) -> tuple:
    cond_key, cond_map, body_key, body_map, n = arg
    carries, invariant = tuple(operands[:n]), operands[n:]

    def read(state: tuple, at: tuple) -> list:
        every = [*state, *invariant]
        return [every[i] for i in at]

    def test(state: tuple) -> Any:
        (flag,), first = region(cond_key, read(state[0], cond_map))
        if region.errors[cond_key]:
            raise NotImplementedError("runtime checks (index bounds) in while_loop's cond_fn")
        return jnp.reshape(flag, ()).astype(bool)

    def step(state: tuple) -> tuple:
        outs, first = region(body_key, read(state[0], body_map))
        return tuple(outs), _earlier(state[1], first)

    final, first = jax.lax.while_loop(test, step, (carries, jnp.zeros((3,), jnp.int64)))
    region.found.append((first, body_key))
    return tuple(final)


def _scan(region: _Region, arg: tuple, operands: list) -> tuple:
    key, at, n, n_xs = arg
    carries, xs, invariant = operands[:n], operands[n : n + n_xs], operands[n + n_xs :]

    def step(state: tuple, x: tuple) -> tuple:
        every = [*state[0], *x, *invariant]
        outs, first = region(key, [every[i] for i in at])
        # The body's outputs: its next carries, then its ys.
        return (tuple(outs[:n]), _earlier(state[1], first)), tuple(outs[n:])

    (final, first), ys = jax.lax.scan(step, (tuple(carries), jnp.zeros((3,), jnp.int64)), tuple(xs))
    region.found.append((first, key))
    return (*final, *ys)


_CONTROL = {COND: _cond, WHILE: _while, SCAN: _scan}
