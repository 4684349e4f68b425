"""Lowerings: reductions, scans and softmax (sum, mean, var, norms, arg-extrema, cumsum, ...)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lowerings.dtypes import cast
from lowerings.registry import LoweringContext, lowering

_REDUCED_FLOATS = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _acc(dtype: np.dtype) -> np.dtype:
    """The accumulation dtype PyTorch uses for ``dtype``: float32 for half and bfloat16."""
    return np.dtype(np.float32) if np.dtype(dtype) in _REDUCED_FLOATS else np.dtype(dtype)


def _axes(x: jax.Array, dim: Any, empty_is_all: bool = True) -> tuple[int, ...]:
    """Normalized reduction axes of ``dim`` (None, an int or a sequence; negatives allowed).

    An empty ``dim`` means every axis for most reductions; ``any.dims``/``all.dims`` treat it as
    no axis at all (``empty_is_all=False``).
    """
    ndim = jnp.ndim(x)
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if not dims:
        return tuple(range(ndim)) if empty_is_all else ()
    # A 0-d tensor accepts dim 0 and -1 and reduces nothing.
    return tuple(sorted({d % ndim for d in dims})) if ndim else ()


def _count(x: jax.Array, axes: tuple[int, ...]) -> int:
    return math.prod(x.shape[a] for a in axes)


def _out(ctx: LoweringContext, y: Any, index: int = 0) -> jax.Array:
    return jnp.asarray(y).astype(ctx.dtypes[index])


# --- sums and products -----------------------------------------------------------------------


def _accumulating(reduce):
    """A reduction of ``x`` cast to the output dtype, accumulated at that dtype's precision."""

    def lower(ctx, x, dim=None, keepdim=False, *, dtype=None):
        # A dtype argument is the output dtype, so ctx.dtype already carries it.
        x = cast(x, ctx.dtype).astype(_acc(ctx.dtype))
        return _out(ctx, reduce(x, _axes(x, dim), keepdim))

    return lower


def _mean(x, axes, keepdim):
    return jnp.sum(x, axis=axes, keepdims=keepdim) / _count(x, axes)


lowering("aten.sum.default", "aten.sum.dim_IntList")(
    _accumulating(lambda x, axes, keepdim: jnp.sum(x, axis=axes, keepdims=keepdim))
)
lowering("aten.prod.default", "aten.prod.dim_int")(
    _accumulating(lambda x, axes, keepdim: jnp.prod(x, axis=axes, keepdims=keepdim))
)
lowering("aten.mean.default", "aten.mean.dim")(_accumulating(_mean))


# --- extrema ---------------------------------------------------------------------------------

# jnp.max/min propagate NaN, as PyTorch's amax/amin/max/min do.
_EXTREMA = {"max": (jnp.max, jnp.argmax), "min": (jnp.min, jnp.argmin)}


def _extremum(reduce):
    def lower(ctx, x, dim=(), keepdim=False):
        return _out(ctx, reduce(x, axis=_axes(x, dim), keepdims=keepdim))

    return lower


def _extremum_with_index(reduce, arg_reduce):
    def lower(ctx, x, dim, keepdim=False):
        if jnp.ndim(x) == 0:
            return _out(ctx, x, 0), jnp.zeros((), ctx.dtypes[1])
        axis = dim % jnp.ndim(x)
        values = reduce(x, axis=axis, keepdims=keepdim)
        # jnp.argmax/argmin pick the first NaN, else the first extremum: PyTorch's choice too.
        return _out(ctx, values, 0), _out(ctx, arg_reduce(x, axis=axis, keepdims=keepdim), 1)

    return lower


def _arg_extremum(arg_reduce):
    def lower(ctx, x, dim=None, keepdim=False):
        if dim is None or jnp.ndim(x) == 0:
            # A flattened index; keepdim keeps every axis as size 1, which ctx.shape spells out.
            return _out(ctx, arg_reduce(jnp.ravel(x))).reshape(ctx.shape)
        return _out(ctx, arg_reduce(x, axis=dim % jnp.ndim(x), keepdims=keepdim))

    return lower


for _name, (_reduce, _arg_reduce) in _EXTREMA.items():
    lowering(f"aten.a{_name}.default", f"aten.{_name}.default")(_extremum(_reduce))
    lowering(f"aten.{_name}.dim")(_extremum_with_index(_reduce, _arg_reduce))
    lowering(f"aten.arg{_name}.default")(_arg_extremum(_arg_reduce))


# Recorded whole (not as PyTorch's amin/amax decomposition) so that shape inference sees aminmax
# itself: its checks are eager's, with eager's messages.
@lowering("aten.aminmax.default")
def _aminmax(ctx, x, *, dim=None, keepdim=False):
    axes = _axes(x, dim)
    low = jnp.min(x, axis=axes, keepdims=keepdim).reshape(ctx.shapes[0])
    high = jnp.max(x, axis=axes, keepdims=keepdim).reshape(ctx.shapes[1])
    return _out(ctx, low, 0), _out(ctx, high, 1)


# --- any / all -------------------------------------------------------------------------------


def _boolean(reduce):
    def lower(ctx, x, dim=None, keepdim=False):
        # any.dim passes one int; any.dims a list, where an empty list reduces nothing.
        axes = _axes(x, dim, empty_is_all=isinstance(dim, int))
        return _out(ctx, reduce(jnp.asarray(x) != 0, axis=axes, keepdims=keepdim))

    return lower


lowering("aten.any.default", "aten.any.dim", "aten.any.dims")(_boolean(jnp.any))
lowering("aten.all.default", "aten.all.dim", "aten.all.dims")(_boolean(jnp.all))
# torch._is_all_true/_is_any_true (distributions' argument checks): a bool 0-d result over every
# element of a bool tensor; eager's own check rejects other dtypes when the node is recorded.
lowering("aten._is_all_true.default")(_boolean(jnp.all))
lowering("aten._is_any_true.default")(_boolean(jnp.any))


# --- moments ---------------------------------------------------------------------------------


def _moments(x, dim, correction, keepdim):
    """(variance, mean) with PyTorch's ``max(N - correction, 0)`` divisor."""
    x = x.astype(_acc(x.dtype))
    axes = _axes(x, dim)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    dev = x - mean
    square = jnp.real(dev * jnp.conj(dev)) if jnp.iscomplexobj(dev) else dev * dev
    correction = 1 if correction is None else correction
    divisor = jnp.maximum(_count(x, axes) - cast(correction, np.float64), 0)
    var = jnp.sum(square, axis=axes, keepdims=keepdim) / divisor.astype(square.dtype)
    return var, mean if keepdim else jnp.squeeze(mean, axes)


@lowering("aten.var.correction")
def _var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _out(ctx, _moments(x, dim, correction, keepdim)[0])


@lowering("aten.std.correction")
def _std(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _out(ctx, jnp.sqrt(_moments(x, dim, correction, keepdim)[0]))


@lowering("aten.var_mean.correction")
def _var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _moments(x, dim, correction, keepdim)
    return _out(ctx, var, 0), _out(ctx, mean, 1)


@lowering("aten.std_mean.correction")
def _std_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    var, mean = _moments(x, dim, correction, keepdim)
    return _out(ctx, jnp.sqrt(var), 0), _out(ctx, mean, 1)


# --- logsumexp and norms ---------------------------------------------------------------------


@lowering("aten.logsumexp.default")
def _logsumexp(ctx, x, dim, keepdim=False):
    x = cast(x, ctx.dtype).astype(_acc(ctx.dtype))
    axes = _axes(x, dim)
    # -inf as the identity keeps an empty reduction defined: log(0) = -inf, as in PyTorch.
    shift = jnp.max(x, axis=axes, keepdims=True, initial=-jnp.inf)
    # An infinite maximum would turn x - shift into NaN; PyTorch shifts by 0 then.
    shift = jnp.where(jnp.isinf(shift), 0, shift)
    out = jnp.log(jnp.sum(jnp.exp(x - shift), axis=axes, keepdims=True)) + shift
    return _out(ctx, out if keepdim else jnp.squeeze(out, axes))


def _p_norm(a, p, axes, keepdim):
    """The p-norm of ``a = |x|``; ``p`` is a Python number or a traced 0-d parameter."""
    # Identities 0 and inf (not -inf/inf) keep max/min of an empty input defined, like the sum.
    cases = {
        math.inf: lambda: jnp.max(a, axis=axes, keepdims=keepdim, initial=0),
        -math.inf: lambda: jnp.min(a, axis=axes, keepdims=keepdim, initial=jnp.inf),
        0: lambda: jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim),
    }
    if isinstance(p, (int, float)):
        if p in cases:
            return cases[p]()
        if p == 1:
            return jnp.sum(a, axis=axes, keepdims=keepdim)
        if p == 2:
            return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
        return jnp.sum(a**p, axis=axes, keepdims=keepdim) ** (1 / p)
    # A traced order: every case is computed and the matching one selected on the device.
    p = cast(p, a.dtype)
    out = jnp.sum(a**p, axis=axes, keepdims=keepdim) ** (1 / p)
    for value, case in cases.items():
        out = jnp.where(p == value, case(), out)
    return out


def _vector_norm(ctx, x, p, dim, keepdim):
    a = jnp.abs(x).astype(_acc(ctx.dtype))
    return _out(ctx, _p_norm(a, 2 if p is None else p, _axes(x, dim), keepdim))


@lowering("aten.linalg_vector_norm.default")
def _linalg_vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(ctx, x, ord, dim, keepdim)


@lowering(
    "aten.norm.Scalar",
    "aten.norm.ScalarOpt_dim",
    "aten.norm.ScalarOpt_dtype",
    "aten.norm.ScalarOpt_dim_dtype",
)
def _norm(ctx, x, p=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(ctx, x, p, dim, keepdim)


# --- scans -----------------------------------------------------------------------------------


def _scan(accumulate):
    def lower(ctx, x, dim, *, dtype=None):
        x = cast(x, ctx.dtype).astype(_acc(ctx.dtype))
        if x.ndim == 0:
            return _out(ctx, x)
        return _out(ctx, accumulate(x, axis=dim % x.ndim))

    return lower


lowering("aten.cumsum.default")(_scan(jnp.cumsum))
lowering("aten.cumprod.default")(_scan(jnp.cumprod))


# --- softmax ---------------------------------------------------------------------------------


def _softmax_axes(x, dim):
    return (dim % x.ndim,) if x.ndim else ()


def _shifted(ctx, x, dim):
    """``x - max(x)`` along ``dim`` in the compute dtype, and the axes reduced."""
    x = x.astype(_acc(ctx.dtype))
    axes = _softmax_axes(x, dim)
    if x.size == 0:  # no maximum to shift by, and nothing to compute
        return x, axes
    return x - jnp.max(x, axis=axes, keepdims=True), axes


@lowering("aten._softmax.default")
def _softmax(ctx, x, dim, half_to_float):
    shifted, axes = _shifted(ctx, x, dim)
    e = jnp.exp(shifted)
    return _out(ctx, e / jnp.sum(e, axis=axes, keepdims=True))


@lowering("aten._log_softmax.default")
def _log_softmax(ctx, x, dim, half_to_float):
    shifted, axes = _shifted(ctx, x, dim)
    return _out(ctx, shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axes, keepdims=True)))


def _backward_operands(grad, output, dim):
    dtype = _acc(jnp.promote_types(grad.dtype, output.dtype))
    return grad.astype(dtype), output.astype(dtype), _softmax_axes(grad, dim)


@lowering("aten._softmax_backward_data.default")
def _softmax_backward_data(ctx, grad, output, dim, input_dtype):
    grad, output, axes = _backward_operands(grad, output, dim)
    dot = jnp.sum(grad * output, axis=axes, keepdims=True)
    return _out(ctx, (grad - dot) * output)


@lowering("aten._log_softmax_backward_data.default")
def _log_softmax_backward_data(ctx, grad, output, dim, input_dtype):
    grad, output, axes = _backward_operands(grad, output, dim)
    return _out(ctx, grad - jnp.exp(output) * jnp.sum(grad, axis=axes, keepdims=True))


@lowering("aten.hash_tensor.default")
def _hash_tensor(ctx, x, dim=(), *, keepdim=False, mode=0):
    # mode 0: XOR of the 64-bit patterns (floats as float64 bits, integers sign-extended).
    wide = jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int64
    bits = jax.lax.bitcast_convert_type(x.astype(wide), jnp.uint64)
    out = jax.lax.reduce(bits, np.uint64(0), jax.lax.bitwise_xor, _axes(x, dim))
    return out.reshape(ctx.shape)
