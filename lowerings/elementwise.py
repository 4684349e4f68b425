"""Lowerings: elementwise ops (arithmetic, math functions, comparisons, activations, backwards)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from lowerings.dtypes import astype, cast, result_type
from lowerings.registry import LoweringContext, lowering

_REDUCED_FLOATS = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def _opmath(dtype: np.dtype) -> np.dtype:
    """The dtype PyTorch computes in for ``dtype`` results: float32 for half and bfloat16."""
    return np.dtype(np.float32) if dtype in _REDUCED_FLOATS else dtype


def _operands(ctx: LoweringContext, *xs: Any) -> list[Any]:
    """``xs`` cast to the op's compute dtype; ``None`` (an absent optional operand) stays."""
    dtype = _opmath(ctx.dtype)
    # Complex operands of real-valued ops (abs, angle) keep their imaginary part.
    keep_complex = not jnp.issubdtype(dtype, jnp.complexfloating)
    return [
        None if x is None else x if keep_complex and jnp.iscomplexobj(x) else cast(x, dtype)
        for x in xs
    ]


def _result(ctx: LoweringContext, y: Any) -> jax.Array:
    return jnp.broadcast_to(astype(y, ctx.dtype), ctx.shape)


def _is_integral(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == np.dtype(bool)


def shift_left(a: Any, b: Any) -> Any:
    return lax.shift_left(*jnp.broadcast_arrays(a, b))


def shift_right(a: Any, b: Any) -> Any:
    """Arithmetic for signed integers (the sign fills in), logical for unsigned ones."""
    a, b = jnp.broadcast_arrays(a, b)
    if jnp.issubdtype(a.dtype, jnp.unsignedinteger):
        return lax.shift_right_logical(a, b)
    return lax.shift_right_arithmetic(a, b)


def _is_number(x: Any, value: float) -> bool:
    """True when ``x`` is the compile-time constant ``value`` (never for a traced parameter)."""
    return isinstance(x, (bool, int, float)) and x == value


def _names(op: str, overloads: tuple[str, ...]) -> list[str]:
    return [f"aten.{op}.{overload}" for overload in overloads]


def _register_pointwise(names: list[str], fn: Callable[..., Any]) -> None:
    """Lower ``fn`` over operands cast to the compute dtype; the result is cast to ``ctx.dtype``."""

    def lower(ctx: LoweringContext, *args: Any) -> jax.Array:
        return _result(ctx, fn(*_operands(ctx, *args)))

    lowering(*names)(lower)


# --- arithmetic with alpha -------------------------------------------------------------------


def _scaled(ctx: LoweringContext, y: Any, alpha: Any) -> Any:
    # alpha=1 is the common case: no multiply, so the graph stays as small as the op itself.
    return y if _is_number(alpha, 1) else y * cast(alpha, _opmath(ctx.dtype))


@lowering("aten.add.Tensor", "aten.add.Scalar")
def _add(ctx, x, y, alpha=1):
    x, y = _operands(ctx, x, y)
    return _result(ctx, x + _scaled(ctx, y, alpha))


@lowering("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(ctx, x, y, alpha=1):
    x, y = _operands(ctx, x, y)
    return _result(ctx, x - _scaled(ctx, y, alpha))


@lowering("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(ctx, x, y, alpha=1):
    x, y = _operands(ctx, x, y)
    return _result(ctx, y - _scaled(ctx, x, alpha))


# --- division family -------------------------------------------------------------------------


def _floor_divide(a, b):
    if _is_integral(a):
        return jnp.floor_divide(a, b)
    # c10::div_floor_floating: Python's float floordiv, exact where floor(a / b) would round.
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _trunc_divide(a, b):
    return lax.div(*jnp.broadcast_arrays(a, b)) if _is_integral(a) else jnp.trunc(a / b)


_ROUNDED_DIVISION = {None: jnp.true_divide, "trunc": _trunc_divide, "floor": _floor_divide}


@lowering("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx, x, y, *, rounding_mode=None):
    return _result(ctx, _ROUNDED_DIVISION[rounding_mode](*_operands(ctx, x, y)))


def _remainder(a, b):
    # The result takes the divisor's sign (Python's %), unlike fmod.
    mod = jnp.fmod(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def _int_pow(base, exponent):
    base, exponent = jnp.broadcast_arrays(base, exponent)
    acc, e, b = jnp.ones_like(base), exponent, base
    # Square-and-multiply over every exponent bit, so overflow wraps exactly like PyTorch's powi.
    for _ in range(jnp.iinfo(e.dtype).bits):
        acc = jnp.where((e & 1) != 0, acc * b, acc)
        b = b * b
        e = lax.shift_right_logical(e, jnp.ones_like(e))
    if not jnp.issubdtype(exponent.dtype, jnp.signedinteger):
        return acc
    odd = (exponent & 1) != 0
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0))
    return jnp.where(exponent < 0, negative.astype(acc.dtype), acc)


def _pow(base, exponent):
    if base.dtype == np.dtype(bool):  # a bool power of a bool: 0 ** 0 is 1, else the base
        return base | ~exponent
    if _is_integral(base):
        return _int_pow(base, exponent)
    return jnp.power(base, exponent)


# The exponents eager CPU's pow(Tensor, Scalar) computes without a power, as it computes them
# (x * x * x for 3.0, sqrt for 0.5); any other exponent takes the power.
_POWERS_WITHOUT_POW: tuple[tuple[float, Callable[[Any], Any]], ...] = (
    (2.0, lambda b: b * b),
    (3.0, lambda b: b * b * b),
    (-2.0, lambda b: 1 / (b * b)),
    (0.5, jnp.sqrt),
    (-0.5, lax.rsqrt),
    (-1.0, lambda b: 1 / b),
)


@lowering("aten.pow.Tensor_Scalar")
def _pow_scalar(ctx, base, exponent):
    return _result(ctx, _pow(*_operands(ctx, base, exponent)))


@lowering("aten.pow.Tensor_Scalar", platform="cpu")
def _pow_scalar_cpu(ctx, base, exponent):
    """A Python-number exponent is a graph parameter, whose value the program reads at run time.
    XLA CPU's power of a runtime exponent is a scalar libm call per element, many times slower
    than eager's multiplications, so on the CPU the program picks eager's computation for the
    exponent by its value, with a conditional on the scalar (it splits the fusion around it, which
    costs far less than the power). Elsewhere the power stays: GPUs compute it at memory speed, and
    there a conditional would wait for its predicate on the host (figures: benchmarks/RESULTS.md,
    "pow with a scalar exponent"). A constant exponent (0, 1: XLA simplifies them) or a
    non-floating base is left to the generic rule."""
    constant = isinstance(exponent, (bool, int, float, complex))
    if constant or not jnp.issubdtype(ctx.dtype, jnp.floating):  # the compute dtype's kind
        return NotImplemented
    b, e = _operands(ctx, base, exponent)
    # Compared before the cast, as eager compares the double.
    branch = jnp.int32(0)
    for i, (value, _) in enumerate(_POWERS_WITHOUT_POW):
        branch = jnp.where(exponent == value, i + 1, branch)
    branches = [jnp.power] + [lambda b, e, fn=fn: fn(b) for _, fn in _POWERS_WITHOUT_POW]
    return _result(ctx, lax.switch(branch, branches, b, e))


# --- unary math ------------------------------------------------------------------------------


def _keep_integral(fn):
    """Rounding functions are the identity on integers, as in PyTorch."""
    return lambda x: x if _is_integral(x) else fn(x)


def _sign(x):
    if x.dtype == np.dtype(bool):
        return x
    # (0 < x) - (x < 0): NaN maps to 0, as in PyTorch (jnp.sign would keep the NaN).
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _sgn(x):
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.where(x == 0, jnp.zeros_like(x), x / jnp.abs(x))
    return _sign(x)


def _digamma(x):
    # PyTorch's digamma has poles of opposite sign at +0 and -0; XLA's gives NaN there.
    return jnp.where(x == 0, jnp.copysign(jnp.full_like(x, jnp.inf), -x), lax.digamma(x))


_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": jnp.negative,
    "abs": jnp.abs,
    "sign": _sign,
    "sgn": _sgn,
    "exp": jnp.exp,
    "exp2": jnp.exp2,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "reciprocal": jnp.reciprocal,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "tanh": jnp.tanh,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "erf": lax.erf,
    "erfc": lax.erfc,
    "erfinv": lax.erf_inv,
    "lgamma": lax.lgamma,
    "digamma": _digamma,
    "deg2rad": jnp.deg2rad,
    "rad2deg": jnp.rad2deg,
    "floor": _keep_integral(jnp.floor),
    "ceil": _keep_integral(jnp.ceil),
    "round": _keep_integral(jnp.round),
    "trunc": _keep_integral(jnp.trunc),
    "frac": lambda x: x - jnp.trunc(x),
    "sigmoid": jax.nn.sigmoid,
    "bitwise_not": jnp.invert,
    "relu": lambda x: jnp.maximum(x, jnp.zeros_like(x)),
    "silu": lambda x: x / (1 + jnp.exp(-x)),
    "mish": lambda x: x * jnp.tanh(jnp.log1p(jnp.exp(x))),
    "hardsigmoid": lambda x: jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
    "hardswish": lambda x: x * jnp.minimum(jnp.maximum(x + 3, 0), 6) / 6,
}


@lowering("aten.round.decimals")
def _round_decimals(ctx, x, *, decimals=0):
    (x,) = _operands(ctx, x)
    # Same operation order as PyTorch, so ties round the same way after scaling.
    scale = cast(10.0 ** abs(decimals), x.dtype)
    if decimals < 0:
        return _result(ctx, jnp.round(x / scale) * scale)
    return _result(ctx, jnp.round(x * scale) / scale)


# --- binary math -----------------------------------------------------------------------------


def _xlogy(x, y):
    return jnp.where(jnp.isnan(y), jnp.nan, jnp.where(x == 0, 0, x * jnp.log(y)))


def _heaviside(x, values):
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


def _logaddexp(log1p_exp):
    def fn(a, b):
        m = jnp.maximum(a, b)
        both_inf = jnp.isinf(a) & (a == b)
        return jnp.where(both_inf, a, m + log1p_exp(-jnp.abs(a - b)))

    return fn


_BINARY: dict[str, tuple[tuple[str, ...], Callable[[Any, Any], Any]]] = {
    "mul": (("Tensor", "Scalar"), jnp.multiply),
    "fmod": (("Tensor", "Scalar"), jnp.fmod),
    "remainder": (("Tensor", "Scalar", "Scalar_Tensor"), _remainder),
    "floor_divide": (("default", "Scalar"), _floor_divide),
    "pow": (("Tensor_Tensor", "Scalar"), _pow),
    "atan2": (("default",), jnp.arctan2),
    "hypot": (("default",), jnp.hypot),
    "copysign": (("Tensor", "Scalar"), jnp.copysign),
    "xlogy": (("Tensor", "Scalar_Self", "Scalar_Other"), _xlogy),
    "heaviside": (("default",), _heaviside),
    "logaddexp": (("default",), _logaddexp(lambda t: jnp.log1p(jnp.exp(t)))),
    "logaddexp2": (("default",), _logaddexp(lambda t: jnp.log1p(jnp.exp2(t)) / math.log(2))),
    "maximum": (("default",), jnp.maximum),
    "minimum": (("default",), jnp.minimum),
    "fmax": (("default",), jnp.fmax),
    "fmin": (("default",), jnp.fmin),
    "bitwise_and": (("Tensor", "Scalar", "Scalar_Tensor"), jnp.bitwise_and),
    "bitwise_or": (("Tensor", "Scalar", "Scalar_Tensor"), jnp.bitwise_or),
    "bitwise_xor": (("Tensor", "Scalar", "Scalar_Tensor"), jnp.bitwise_xor),
    # XLA's shifts by a negative amount or by the bit width or more give what eager's CPU kernels
    # give: 0, or the sign bit for an arithmetic right shift.
    "bitwise_left_shift": (("Tensor", "Tensor_Scalar", "Scalar_Tensor"), shift_left),
    "bitwise_right_shift": (("Tensor", "Tensor_Scalar", "Scalar_Tensor"), shift_right),
    "__lshift__": (("Tensor", "Scalar"), shift_left),
    "__rshift__": (("Tensor", "Scalar"), shift_right),
}


# --- activation backwards whose operands are all tensors -------------------------------------


def _silu_backward(grad, x):
    s = 1 / (1 + jnp.exp(-x))
    return grad * s * (1 + x * (1 - s))


def _mish_backward(grad, x):
    s = 1 / (1 + jnp.exp(-x))
    t = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return grad * (t + x * s * (1 - t * t))


def _hardswish_backward(grad, x):
    # As PyTorch's vectorized kernel: both kinks (x = -3 and x = 3) take the outer branches and
    # a NaN input gives NaN (its scalar tail loop would give grad instead).
    inner = jnp.where(x >= 3, grad, grad * (x / 3 + 0.5))
    return jnp.where(x <= -3, 0, inner)


_BACKWARD: dict[str, Callable[..., Any]] = {
    "sigmoid_backward": lambda grad, y: grad * (1 - y) * y,
    "tanh_backward": lambda grad, y: grad * (1 - y * y),
    "silu_backward": _silu_backward,
    "mish_backward": _mish_backward,
    "hardsigmoid_backward": lambda grad, x: jnp.where((x > -3) & (x < 3), grad / 6, 0),
    "hardswish_backward": _hardswish_backward,
}

for _op, _fn in _UNARY.items():
    _register_pointwise(_names(_op, ("default",)), _fn)
for _op, (_overloads, _fn) in _BINARY.items():
    _register_pointwise(_names(_op, _overloads), _fn)
for _op, _fn in _BACKWARD.items():
    _register_pointwise(_names(_op, ("default",)), _fn)


# --- comparisons, logical ops, predicates ----------------------------------------------------

_COMPARISONS = {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}

_LOGICAL = {
    "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor,
}


def _signbit(x):
    if x.dtype == np.dtype(bool):
        return jnp.zeros_like(x)
    return jnp.signbit(x) if jnp.issubdtype(x.dtype, jnp.floating) else x < 0


# Predicates look at the input in its own dtype; the output is bool.
_PREDICATES = {
    "isnan": jnp.isnan,
    "isinf": jnp.isinf,
    "isfinite": jnp.isfinite,
    "isposinf": jnp.isposinf,
    "isneginf": jnp.isneginf,
    "signbit": _signbit,
    "logical_not": lambda x: x == 0,
}


def _comparison(fn):
    def lower(ctx, x, y):
        dtype = result_type(ctx, x, y)
        return _result(ctx, fn(cast(x, dtype), cast(y, dtype)))

    return lower


def _logical(fn):
    def lower(ctx, x, y):
        return _result(ctx, fn(jnp.asarray(x) != 0, jnp.asarray(y) != 0))

    return lower


def _predicate(fn):
    return lambda ctx, x: _result(ctx, fn(x))


for _op, _fn in _COMPARISONS.items():
    lowering(*_names(_op, ("Tensor", "Scalar")))(_comparison(_fn))
for _op, _fn in _LOGICAL.items():
    lowering(*_names(_op, ("default",)))(_logical(_fn))
for _op, _fn in _PREDICATES.items():
    lowering(*_names(_op, ("default",)))(_predicate(_fn))


# --- selection and clamping ------------------------------------------------------------------


def _clamped(x, lo, hi):
    # jnp.maximum/minimum propagate NaN from any operand, as PyTorch's clamp does.
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowering("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(ctx, x, min=None, max=None):
    return _result(ctx, _clamped(*_operands(ctx, x, min, max)))


@lowering("aten.clamp_min.default", "aten.clamp_min.Tensor")
def _clamp_min(ctx, x, min):
    x, lo = _operands(ctx, x, min)
    return _result(ctx, _clamped(x, lo, None))


@lowering("aten.clamp_max.default", "aten.clamp_max.Tensor")
def _clamp_max(ctx, x, max):
    x, hi = _operands(ctx, x, max)
    return _result(ctx, _clamped(x, None, hi))


@lowering("aten.hardtanh.default")
def _hardtanh(ctx, x, min_val=-1, max_val=1):
    return _result(ctx, _clamped(*_operands(ctx, x, min_val, max_val)))


@lowering("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx, condition, x, y):
    x, y = cast(x, ctx.dtype), cast(y, ctx.dtype)
    return _result(ctx, jnp.where(jnp.asarray(condition).astype(bool), x, y))


@lowering("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx, x, mask, value):
    return _result(ctx, jnp.where(mask, cast(value, ctx.dtype), cast(x, ctx.dtype)))


@lowering("aten.nan_to_num.default")
def _nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    x = cast(x, ctx.dtype)
    if not jnp.issubdtype(ctx.dtype, jnp.floating):
        return _result(ctx, x)
    info = jnp.finfo(ctx.dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    out = jnp.where(x == jnp.inf, cast(posinf, ctx.dtype), x)
    out = jnp.where(x == -jnp.inf, cast(neginf, ctx.dtype), out)
    return _result(ctx, jnp.where(jnp.isnan(x), cast(nan, ctx.dtype), out))


# --- fused pointwise -------------------------------------------------------------------------


@lowering("aten.lerp.Scalar", "aten.lerp.Tensor")
def _lerp(ctx, start, end, weight):
    start, end, weight = _operands(ctx, start, end, weight)
    # PyTorch switches formula at |weight| = 0.5 so that weight 0 and 1 are both exact.
    small = start + weight * (end - start)
    large = end - (end - start) * (1 - weight)
    return _result(ctx, jnp.where(jnp.abs(weight) < 0.5, small, large))


@lowering("aten.addcmul.default")
def _addcmul(ctx, x, tensor1, tensor2, *, value=1):
    x, tensor1, tensor2 = _operands(ctx, x, tensor1, tensor2)
    return _result(ctx, x + _scaled(ctx, tensor1, value) * tensor2)


@lowering("aten.addcdiv.default")
def _addcdiv(ctx, x, tensor1, tensor2, *, value=1):
    x, tensor1, tensor2 = _operands(ctx, x, tensor1, tensor2)
    return _result(ctx, x + _scaled(ctx, tensor1, value) / tensor2)


# --- activations with parameters, and their backwards ----------------------------------------

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_KAPPA = 0.044715


@lowering("aten.leaky_relu.default")
def _leaky_relu(ctx, x, negative_slope=0.01):
    x, slope = _operands(ctx, x, negative_slope)
    return _result(ctx, jnp.where(x > 0, x, x * slope))


@lowering("aten.leaky_relu_backward.default")
def _leaky_relu_backward(ctx, grad, x, negative_slope, self_is_result):
    grad, x, slope = _operands(ctx, grad, x, negative_slope)
    return _result(ctx, jnp.where(x > 0, grad, grad * slope))


@lowering("aten.gelu.default")
def _gelu(ctx, x, *, approximate="none"):
    (x,) = _operands(ctx, x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (x + _GELU_KAPPA * x * x * x)
        return _result(ctx, 0.5 * x * (1 + jnp.tanh(inner)))
    return _result(ctx, x * 0.5 * (1 + lax.erf(x * math.sqrt(0.5))))


@lowering("aten.gelu_backward.default")
def _gelu_backward(ctx, grad, x, *, approximate="none"):
    grad, x = _operands(ctx, grad, x)
    if approximate == "tanh":
        t = jnp.tanh(_SQRT_2_OVER_PI * (x + _GELU_KAPPA * x * x * x))
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * _GELU_KAPPA * x * x)
        return _result(ctx, grad * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner))
    cdf = 0.5 * (1 + lax.erf(x * math.sqrt(0.5)))
    pdf = jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return _result(ctx, grad * (cdf + x * pdf))


@lowering("aten.elu.default")
def _elu(ctx, x, alpha=1, scale=1, input_scale=1):
    x, alpha, scale, input_scale = _operands(ctx, x, alpha, scale, input_scale)
    negative = jnp.expm1(x * input_scale) * (alpha * scale)
    return _result(ctx, jnp.where(x <= 0, negative, x * scale))


@lowering("aten.elu_backward.default")
def _elu_backward(ctx, grad, alpha, scale, input_scale, is_result, self_or_result):
    grad, alpha, scale, input_scale, y = _operands(
        ctx, grad, alpha, scale, input_scale, self_or_result
    )
    if is_result:
        negative = grad * input_scale * (y + alpha * scale)
    else:
        negative = grad * input_scale * (alpha * scale) * jnp.exp(y * input_scale)
    return _result(ctx, jnp.where(y <= 0, negative, grad * scale))


@lowering("aten.hardtanh_backward.default")
def _hardtanh_backward(ctx, grad, x, min_val, max_val):
    grad, x, lo, hi = _operands(ctx, grad, x, min_val, max_val)
    return _result(ctx, jnp.where((x <= lo) | (x >= hi), 0, grad))


@lowering("aten.softplus.default")
def _softplus(ctx, x, beta=1, threshold=20):
    x, beta, threshold = _operands(ctx, x, beta, threshold)
    return _result(ctx, jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta))


@lowering("aten.softplus_backward.default")
def _softplus_backward(ctx, grad, x, beta, threshold):
    grad, x, beta, threshold = _operands(ctx, grad, x, beta, threshold)
    z = jnp.exp(x * beta)
    return _result(ctx, jnp.where(x * beta > threshold, grad, grad * z / (z + 1)))


@lowering("aten.threshold.default")
def _threshold(ctx, x, threshold, value):
    x, threshold, value = _operands(ctx, x, threshold, value)
    return _result(ctx, jnp.where(x <= threshold, value, x))


@lowering("aten.threshold_backward.default")
def _threshold_backward(ctx, grad, x, threshold):
    grad, x, threshold = _operands(ctx, grad, x, threshold)
    return _result(ctx, jnp.where(x <= threshold, 0, grad))


def _shrunk(x: Any, lambd: Any) -> Any:
    """True inside the closed band [-lambd, lambd], where both shrinks give 0 and no gradient."""
    return (x >= -lambd) & (x <= lambd)


@lowering("aten.hardshrink.default")
def _hardshrink(ctx, x, lambd=0.5):
    x, lambd = _operands(ctx, x, lambd)
    return _result(ctx, jnp.where(_shrunk(x, lambd), 0, x))


@lowering("aten.softshrink.default")
def _softshrink(ctx, x, lambd=0.5):
    x, lambd = _operands(ctx, x, lambd)
    # 0 * x in the band keeps a nan input nan, as aten does.
    return _result(ctx, jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0)))


@lowering("aten.hardshrink_backward.default", "aten.softshrink_backward.default")
def _shrink_backward(ctx, grad, x, lambd):
    grad, x, lambd = _operands(ctx, grad, x, lambd)
    return _result(ctx, jnp.where(_shrunk(x, lambd), 0, grad))


@lowering("aten.logit.default")
def _logit(ctx, x, eps=None):
    (x,) = _operands(ctx, x)
    if eps is not None and eps >= 0:
        x = jnp.clip(x, eps, 1 - eps)
    return _result(ctx, jnp.where(x == 1, jnp.inf, jnp.log(x / (1 - x))))


@lowering("aten.logit_backward.default")
def _logit_backward(ctx, grad, x, eps=None):
    grad, x = _operands(ctx, grad, x)
    inside = jnp.where((x == 0) | (x == 1), grad * jnp.inf, grad / (x * (1 - x)))
    if eps is None or eps < 0:
        return _result(ctx, jnp.where((x < 0) | (x > 1), jnp.nan, inside))
    return _result(ctx, jnp.where((x < eps) | (x > 1 - eps), 0, inside))
