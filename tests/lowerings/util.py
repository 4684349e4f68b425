"""Oracle for single lowerings: run an aten op in eager CPU PyTorch and through its lowering."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lowerings import LoweringContext
from lowerings.registry import lowering_for


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def to_jax(t: torch.Tensor) -> jax.Array:
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
    return jnp.asarray(t.detach().numpy())


def to_torch(a) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(a.copy())


def _scalar_slots(op) -> tuple[set[int], set[str]]:
    pos, names = set(), set()
    for i, a in enumerate(op._schema.arguments):
        if str(a.type).rstrip("?") in ("Scalar", "number"):  # torch 2.13 prints Scalar as number
            (names if a.kwarg_only else pos).add(i if not a.kwarg_only else a.name)
    return pos, names


def _convert(x):
    if isinstance(x, torch.Tensor):
        return to_jax(x)
    if isinstance(x, torch.dtype):
        return _dtype_name(x)
    if isinstance(x, (list, tuple)):
        return tuple(_convert(v) for v in x)
    if isinstance(x, (torch.device, torch.layout, torch.memory_format)):
        return str(x)
    return x


def _scalar_array(x):
    if isinstance(x, bool):
        return jnp.asarray(x, jnp.bool_)
    if isinstance(x, int):
        return jnp.asarray(x, jnp.int64)
    if isinstance(x, float):
        return jnp.asarray(x, jnp.float64)
    return x


def run_lowering(op, *args, **kwargs):
    """Eager result and lowered result (as torch tensors) of ``op(*args, **kwargs)``.

    Python numbers in ``Scalar`` slots are passed as 0-d parameters, as the runtime does.
    """
    expected = op(*args, **kwargs)
    outs = expected if isinstance(expected, (tuple, list)) else (expected,)
    pos, names = _scalar_slots(op)
    flat = [(("a", i), v) for i, v in enumerate(args)] + [(("k", k), v) for k, v in kwargs.items()]

    def fn(*scalars):
        it = iter(scalars)
        a, k = [], {}
        for (kind, key), v in flat:
            is_scalar = (key in pos if kind == "a" else key in names) and isinstance(
                v, (int, float, bool)
            )
            cv = next(it) if is_scalar and v not in (0, 1) else _convert(v)
            (a.append(cv) if kind == "a" else k.__setitem__(key, cv))
        ctx = LoweringContext(
            shapes=tuple(tuple(o.shape) for o in outs),
            dtypes=tuple(_dtype_name(o.dtype) for o in outs),
            scalars=scalars,
        )
        return lowering_for(str(op), ctx.platform)(ctx, *a, **k)

    scalar_vals = [
        _scalar_array(v)
        for (kind, key), v in flat
        if (key in pos if kind == "a" else key in names)
        and isinstance(v, (int, float, bool))
        and v not in (0, 1)
    ]
    got = jax.jit(fn)(*scalar_vals)
    got = got if isinstance(got, (tuple, list)) else (got,)
    return expected, tuple(to_torch(g) for g in got)


def check_lowering(op, *args, atol=1e-5, rtol=1e-5, **kwargs):
    """Assert the lowering of ``op`` matches eager CPU PyTorch in values, dtypes and shapes."""
    expected, got = run_lowering(op, *args, **kwargs)
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(exp) == len(got), (len(exp), len(got))
    for e, g in zip(exp, got):
        assert g.dtype == e.dtype, (g.dtype, e.dtype)
        assert g.shape == e.shape, (g.shape, e.shape)
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol, equal_nan=True)


def make(shape, dtype=torch.float32, low=-3.0, high=3.0, seed=0):
    """Deterministic test input of ``dtype`` with values in [low, high]."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(int(low), int(high) + 1, shape, generator=g).to(dtype)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)
