"""PyTorch's type promotion, for lowerings whose compute dtype differs from their output dtype."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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
    if _is_bool_to_number(x, dtype):
        return _select_one_zero(x, dtype)
    return jnp.asarray(x, dtype=dtype)


def astype(x: Any, dtype: Any) -> Any:
    """``jnp.asarray(x).astype(dtype)``, with bool to floating or complex as in ``cast``."""
    x = jnp.asarray(x)
    if _is_bool_to_number(x, dtype):
        return _select_one_zero(x, dtype)
    return x.astype(dtype)


def _is_bool_to_number(x: Any, dtype: Any) -> bool:
    """True when ``x`` is a bool array (traced or not) and ``dtype`` is floating or complex."""
    if dtype is None or not isinstance(x, jax.Array) or x.dtype != _BOOL:
        return False
    return _category(np.dtype(dtype)) >= 2


def _select_one_zero(x: Any, dtype: Any) -> Any:
    """A bool array as 1 and 0 of a floating or complex ``dtype``, through a select.

    Never ``convert(x)``: XLA's algebraic simplifier rewrites ``multiply(convert(pred), y)`` into
    ``select(pred, y, 0)`` (after turning ``convert(pred) / scalar`` into such a product), which
    gives 0 where eager PyTorch's ``0 * inf`` and ``0 * nan`` give NaN. A select of constants
    matches no such pattern: the multiply stays, fused with the select into the same loop.
    """
    return lax.select(x, jnp.ones(x.shape, dtype), jnp.zeros(x.shape, dtype))


def bitcast(x: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """``x``'s bytes read as ``dtype`` in ``shape`` (PyTorch's ``view(dtype)``): between item
    sizes that differ, the last dimension scales by their ratio. Bool and complex have no bitcast
    in XLA: bool goes through uint8 (nonzero bytes are True), complex through (real, imag) pairs.
    """
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return jnp.reshape(x, shape)
    same_size = x.dtype.itemsize == dtype.itemsize
    if same_size and _category(x.dtype) in (1, 2) and _category(dtype) in (1, 2):
        return jnp.reshape(lax.bitcast_convert_type(x, dtype), shape)
    return _from_bytes(_to_bytes(x), dtype, shape)


def _to_bytes(x: Any) -> Any:
    """The bytes of ``x`` along a last dimension: (..., n) -> (..., n * itemsize) uint8."""
    lead = x.shape[:-1]
    if x.dtype == _BOOL:
        x = x.astype(jnp.uint8)
    elif _category(x.dtype) == 3:
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    if x.dtype.itemsize > 1:
        x = lax.bitcast_convert_type(x, jnp.uint8)
    return jnp.reshape(x, lead + (-1,))


def _from_bytes(b: Any, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    lead = b.shape[:-1]
    if dtype == _BOOL:
        return jnp.reshape(b != 0, shape)
    if _category(dtype) == 3:
        part = np.dtype(jnp.finfo(dtype).dtype)
        pairs = lax.bitcast_convert_type(jnp.reshape(b, lead + (-1, 2, part.itemsize)), part)
        return jnp.reshape(lax.complex(pairs[..., 0], pairs[..., 1]), shape)
    if dtype.itemsize > 1:
        b = jnp.reshape(b, lead + (-1, dtype.itemsize))
    return jnp.reshape(lax.bitcast_convert_type(b, dtype), shape)
