"""PyTorch's type promotion, for lowerings whose compute dtype differs from their output dtype."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from lowerings.registry import LoweringContext

_BOOL = np.dtype(bool)


def _category(dt: np.dtype) -> int:
    if dt == _BOOL:
        return 0
    if jnp.issubdtype(dt, jnp.integer):
        return 1
    if jnp.issubdtype(dt, jnp.complexfloating):
        return 3
    return 2


def _promote(a: np.dtype | None, b: np.dtype | None) -> np.dtype | None:
    if a is None:
        return b
    if b is None:
        return a
    return np.dtype(jnp.promote_types(a, b))


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    """Combine the result of a higher-priority class of operands with a lower one (PyTorch rule)."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    ch, cl = _category(higher), _category(lower)
    if ch == 3:
        return higher
    if cl == 3:
        return np.dtype(jnp.result_type(higher, jnp.complex64)) if ch == 2 else lower
    if ch == 2:
        return higher
    if ch == 0 or cl == 2:
        return _promote(higher, lower)
    return higher


def _scalar_dtype(x: Any) -> np.dtype:
    if isinstance(x, bool):
        return _BOOL
    if isinstance(x, int):
        return np.dtype(np.int64)
    if isinstance(x, float):
        return np.dtype(np.float32)
    if isinstance(x, complex):
        return np.dtype(np.complex64)
    dt = np.dtype(x.dtype)
    # A wrapped Python float counts as the default dtype, as in PyTorch.
    return {2: np.dtype(np.float32), 3: np.dtype(np.complex64)}.get(_category(dt), dt)


def result_type(ctx: LoweringContext, *operands: Any) -> np.dtype:
    """The dtype PyTorch computes ``op(*operands)`` in (``torch.result_type`` semantics).

    Dimensioned tensors outrank zero-dim tensors, which outrank Python numbers; a lower class only
    matters when it is of a higher category (bool < integer < floating < complex).
    """
    dims = zero = wrapped = None
    for x in operands:
        if x is None:
            continue
        if ctx.is_scalar(x):
            wrapped = _promote(wrapped, _scalar_dtype(x))
        elif jnp.ndim(x) == 0:
            zero = _promote(zero, np.dtype(x.dtype))
        else:
            dims = _promote(dims, np.dtype(x.dtype))
    out = _combine(dims, _combine(zero, wrapped))
    if out is None:
        raise ValueError("result_type needs at least one operand")
    return out


def cast(x: Any, dtype: Any) -> Any:
    """``x`` as a JAX value of ``dtype`` (Python numbers included)."""
    return jnp.asarray(x, dtype=dtype)
