"""Eager's checks of the numbers given to an op, made at every call of the ops that have one.

Shape inference is memoized per signature, which holds a Python number's type and not its value,
and the C dispatch records a call of a known signature without Python: an error eager raises for
a number's value (``int_tensor ** -1``, ``int_tensor // 0``, ``uint8_tensor.fill_(300)``,
``x.uniform_(2, 1)``) would come from a signature's first call at most. Each op that has such a
check has an entry in ``CHECKS``: the arguments it reads and ``suspect``, a cheap test of their
values that holds wherever eager may refuse them. Where it holds, eager runs the call on stand-ins
of the lazy tensors with the call's own numbers, and its error is raised at the user's line; values
eager accepts are remembered (with the call's layouts, exactly), so a loop pays one such run.

``dispatch.check_values(CHECKS.values())`` runs each check before its op's handler, and gives it
to the C dispatch, which calls it only when a number (or a CPU scalar) fills an argument it reads:
``add`` without ``alpha`` pays nothing, and ops without a check pay nothing at all. In-place and
out= forms reach the check through their functional op; foreach ops through their element op.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from lazy_core import digest
from lazy_torch import eager_checks
from lazy_torch.tensor import LazyTensor

aten = torch.ops.aten
_NUMBERS = (bool, int, float, complex)

# ----------------------------------------------------------------------------------------------
# Which numbers a dtype takes (c10's ``checked_convert``).

# dtype -> (floating, lowest, highest): of its components for a complex dtype.
_RANGES: dict[torch.dtype, tuple[bool, Any, Any]] = {}


def _range(dtype: torch.dtype) -> tuple[bool, Any, Any]:
    r = _RANGES.get(dtype)
    if r is None:
        if dtype == torch.bool:
            r = (False, 0, 1)
        elif dtype.is_floating_point or dtype.is_complex:
            info = torch.finfo(dtype)
            r = (True, float(info.min), float(info.max))
        else:
            info = torch.iinfo(dtype)
            r = (False, int(info.min), int(info.max))
        _RANGES[dtype] = r
    return r


def fits(v: Any, dtype: torch.dtype) -> bool:
    """Whether eager converts the number ``v`` to ``dtype`` without its ``value cannot be
    converted to type ... without overflow`` error: nothing overflows a bool and a bool
    overflows nothing; a floating type takes infinities and NaN, an integral type neither; an
    unsigned type takes negative integers down to minus its highest value (they wrap); a real
    type takes no number with an imaginary part.

    >>> fits(-1, torch.uint8), fits(-1.0, torch.uint8), fits(300, torch.int8)
    (True, False, False)
    """
    if dtype == torch.bool or type(v) is bool:
        return True
    if type(v) is complex:
        if v.imag and not dtype.is_complex:
            return False
        return fits(v.real, dtype) and fits(v.imag, dtype)
    floating, low, high = _range(dtype)
    if floating and type(v) is float and not math.isfinite(v):
        return True
    if not floating and type(v) is int and low == 0:
        return -high <= v <= high
    return low <= v <= high  # False for NaN


def _fits_every_dtype(v: Any) -> bool:
    """Whether ``v`` fits every dtype: the common numbers (int8 and uint8 have the least room)."""
    kind = type(v)
    return kind is bool or (kind is int and -128 <= v <= 127) or (kind is float and 0 <= v <= 127)


def _is_cpu_scalar(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and type(v) is not LazyTensor and v.dim() == 0


def _number(v: Any) -> Any:
    """``v`` as a number whose value is known while tracing (a CPU scalar's), else None."""
    if type(v) in _NUMBERS:
        return v
    return v.item() if _is_cpu_scalar(v) else None


# ----------------------------------------------------------------------------------------------
# Tests of the numbers of a call: true wherever eager may refuse them. Each gets the call's
# positional arguments and the values of the arguments its entry reads.


def _negative_power(args: tuple, exponent: Any) -> bool:
    """``pow``: eager refuses a negative integer exponent of an integral (or bool) tensor."""
    if type(exponent) is not int or exponent >= 0:
        return False
    dtype = args[0].dtype
    return not (dtype.is_floating_point or dtype.is_complex)


def _zero_divisor(args: tuple, other: Any, rounding_mode: Any = "floor") -> bool:
    """Integer ``//``, ``%``, fmod and rounding division: eager raises ``ZeroDivisionError`` for a
    divisor of 0 (a lazy tensor's zeros are found by the runtime's checks instead)."""
    return rounding_mode is not None and _number(other) == 0


def _overflows(args: tuple, *values: Any) -> bool:
    """Numbers eager converts to a tensor's dtype with a check (fill values, clamp bounds,
    ``alpha``, ``beta``): one that may not fit the dtype of a tensor argument, or the default
    dtype a result may promote to."""
    for v in values:
        kind = type(v)
        if kind is not int and kind is not float:  # the common numbers first, cheaply
            v = _number(v)
            if v is None or _fits_every_dtype(v):
                continue
        elif -128 <= v <= 127 and (kind is int or v >= 0):
            continue
        self = args[0]
        dtype = self._meta.dtype if type(self) is LazyTensor else self.dtype
        floating, low, high = _RANGES.get(dtype) or _range(dtype)
        if floating and type(v) in (int, float) and low <= v <= high:
            continue  # a floating self keeps a floating result dtype at least as wide
        dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor)]
        dtypes.append(torch.get_default_dtype())
        if type(v) is complex:
            dtypes.append(torch.complex128 if dtypes[-1] == torch.float64 else torch.complex64)
        if not all(fits(v, d) for d in dtypes):
            return True
    return False


def _new_value_overflows(args: tuple, value: Any, dtype: Any) -> bool:
    """``full``, ``full_like``, ``new_full``: the fill value converts to the new tensor's dtype
    (the one given, else self's, else the one the value's type gives)."""
    v = _number(value)
    if v is None or _fits_every_dtype(v):
        return False
    if dtype is None:
        dtype = args[0].dtype if isinstance(args[0], torch.Tensor) else _inferred_dtype(v)
    return not fits(v, dtype)


def _inferred_dtype(v: Any) -> torch.dtype:
    default = torch.get_default_dtype()
    if type(v) is complex:
        return torch.complex128 if default == torch.float64 else torch.complex64
    return {bool: torch.bool, int: torch.int64}.get(type(v), default)


def _spaced_values_overflow(args: tuple, start: Any, end: Any, steps: int, dtype: Any) -> bool:
    """``linspace``, ``logspace``: start and end convert to the result's dtype (from 2 steps on)."""
    dtype = dtype or torch.get_default_dtype()
    return steps >= 2 and any(
        _number(v) is not None and not fits(_number(v), dtype) for v in (start, end)
    )


def _random_range(dtype: torch.dtype) -> tuple[Any, Any]:
    """The integers ``random_`` may draw for ``dtype`` (a floating type's exact ones)."""
    if dtype == torch.bool:
        return 0, 1
    floating, low, high = _range(dtype)
    if floating:
        digits = 2 / torch.finfo(dtype).eps
        return -digits, digits
    return low, high


def _bad_random(args: tuple, low: Any, high: Any) -> bool:
    """``random_(from, to)``: eager wants from < to, both within the dtype's range."""
    bottom, top = _random_range(args[0].dtype)
    if high is None:
        return not bottom <= low <= top
    return not (low < high and bottom <= low and high - 1 <= top)


def _bad_random_to(args: tuple, high: Any) -> bool:
    return _bad_random(args, 0, high)


def _bad_uniform(args: tuple, low: Any, high: Any) -> bool:
    """``uniform_(from, to)``: eager wants from <= to within the dtype's range, and to - from
    within it too."""
    _, bottom, top = _range(args[0].dtype)
    return not (bottom <= low <= high <= top and high - low <= top)


def _bad_probability(args: tuple, p: Any) -> bool:
    return not 0 <= p <= 1


def _zero_alpha(args: tuple, alpha: Any) -> bool:
    return alpha == 0


def _bad_renorm(args: tuple, p: Any, maxnorm: Any) -> bool:
    return not (p > 0 and maxnorm >= 0)


def _finite(v: Any) -> bool:
    return type(v) is not float or math.isfinite(v)


def _bad_histc_range(args: tuple, low: Any, high: Any) -> bool:
    return not (_finite(low) and _finite(high) and low <= high)


def _negative_beta(args: tuple, beta: Any) -> bool:
    return not beta >= 0


def _bad_mvlgamma(args: tuple, p: Any) -> bool:
    return p < 1


# ----------------------------------------------------------------------------------------------
# The table.


class ValueCheck:
    """The check of one op's numbers: ``suspect(args, *values)`` over the arguments ``names``;
    called as ``check(args, kwargs)`` (by C too), it raises eager's error for the call."""

    __slots__ = ("names", "op", "positions", "single", "slots", "suspect")

    def __init__(self, op: Any, names: tuple[str, ...], suspect: Callable[..., bool]):
        self.op = op
        self.suspect = suspect
        arguments = {a.name: (i, a) for i, a in enumerate(op._schema.arguments)}
        self.slots = tuple((arguments[n][0], n, arguments[n][1].default_value) for n in names)
        # The arguments that may hold a number, by position and by keyword: C calls the check
        # when one of them holds a number or a CPU scalar.
        read = [(i, n) for i, n, _ in self.slots if _may_hold_number(arguments[n][1].type)]
        self.positions = tuple(i for i, _ in read)
        self.names = tuple(n for _, n in read)
        self.single = self.slots[0] if len(self.slots) == 1 else None

    def __call__(self, args: tuple, kwargs: dict) -> None:
        n = len(args)
        if self.single is not None:  # most checks read one argument: no list to build
            i, name, default = self.single
            suspect = self.suspect(args, args[i] if i < n else kwargs.get(name, default))
        else:
            values = [args[i] if i < n else kwargs.get(name, d) for i, name, d in self.slots]
            suspect = self.suspect(args, *values)
        if suspect:
            _confirm(self.op, args, kwargs)


def _may_hold_number(t: Any) -> bool:
    if isinstance(t, torch._C.OptionalType):
        t = t.getElementType()
    return isinstance(t, (torch._C.NumberType, torch._C.TensorType))


_ENTRIES: list[tuple[tuple[Any, ...], tuple[str, ...], Callable[..., bool]]] = [
    ((aten.pow.Tensor_Scalar,), ("exponent",), _negative_power),
    ((aten.div.Tensor_mode, aten.div.Scalar_mode), ("other", "rounding_mode"), _zero_divisor),
    (
        (
            aten.floor_divide.default,
            aten.floor_divide.Scalar,
            aten.remainder.Tensor,
            aten.remainder.Scalar,
            aten.fmod.Tensor,
            aten.fmod.Scalar,
        ),
        ("other",),
        _zero_divisor,
    ),
    (
        (
            aten.fill.Scalar,
            aten.masked_fill.Scalar,
            aten.masked_fill.Tensor,
            aten.index_fill.int_Scalar,
            aten.index_fill.int_Tensor,
            aten.scatter.value,
            aten.scatter.value_reduce,
            aten.constant_pad_nd.default,
        ),
        ("value",),
        _overflows,
    ),
    (
        (aten.full.default, aten.full_like.default, aten.new_full.default),
        ("fill_value", "dtype"),
        _new_value_overflows,
    ),
    ((aten.logspace.default,), ("start", "end", "steps", "dtype"), _spaced_values_overflow),
    ((aten.clamp.default,), ("min", "max"), _overflows),
    ((aten.clamp_min.default,), ("min",), _overflows),
    ((aten.clamp_max.default,), ("max",), _overflows),
    ((aten.hardtanh.default,), ("min_val", "max_val"), _overflows),
    ((aten.threshold.default,), ("threshold", "value"), _overflows),
    (
        (
            aten.add.Tensor,
            aten.add.Scalar,
            aten.sub.Tensor,
            aten.sub.Scalar,
            aten.rsub.Tensor,
            aten.rsub.Scalar,
        ),
        ("alpha",),
        _overflows,
    ),
    ((aten.addcmul.default, aten.addcdiv.default), ("value",), _overflows),
    (
        (
            aten.addmm.default,
            aten.addmv.default,
            aten.addbmm.default,
            aten.baddbmm.default,
            aten.addr.default,
        ),
        ("beta", "alpha"),
        _overflows,
    ),
    ((aten.uniform_.default, aten.uniform.default), ("from", "to"), _bad_uniform),
    ((getattr(aten.random_, "from"),), ("from", "to"), _bad_random),
    ((aten.random_.to,), ("to",), _bad_random_to),
    ((aten.bernoulli_.float, aten.bernoulli.p), ("p",), _bad_probability),
    ((aten.celu.default,), ("alpha",), _zero_alpha),
    ((aten.renorm.default,), ("p", "maxnorm"), _bad_renorm),
    ((aten.histc.default,), ("min", "max"), _bad_histc_range),
    ((aten.smooth_l1_loss.default,), ("beta",), _negative_beta),
    ((aten.mvlgamma.default,), ("p",), _bad_mvlgamma),
]

# id(op) -> its check (OpOverloads live for the whole process; their __hash__ is Python code).
CHECKS: dict[int, ValueCheck] = {
    id(op): ValueCheck(op, names, suspect) for ops, names, suspect in _ENTRIES for op in ops
}


def check_of(op: Any) -> ValueCheck | None:
    """The check of ``op``'s numbers, or None where eager makes none."""
    return CHECKS.get(id(op))


# The largest magnitude every floating dtype holds (float8_e4m3fnuz's).
_FLOATING_ROOM = 240


def fit_every_floating_dtype(numbers: list) -> bool:
    """Whether ``numbers`` convert to any floating dtype without overflow. For a call whose
    results are floating (a foreach op recorded whole), the numbers ``CHECKS`` reads convert to
    the result's dtype, and nothing else of theirs can fail: then its check may be skipped."""
    for v in numbers:
        kind = type(v)
        if kind is bool:
            continue
        if kind is not int and kind is not float:
            return False
        if not -_FLOATING_ROOM <= v <= _FLOATING_ROOM and not (
            kind is float and not math.isfinite(v)
        ):
            return False
    return True


# ----------------------------------------------------------------------------------------------
# Eager's verdict on suspect numbers.

# Keys of calls eager accepted despite a suspect number; bounded, as it only saves runs.
_accepted: set[int] = set()
_ACCEPTED_MAX = 4096
# Lazy tensors of at most this many elements in all are replayed at their own shapes (as zeros),
# larger ones at one element per dimension (the checks here read numbers and dtypes).
_FULL_SIZE_MAX = 1 << 16


def _confirm(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise eager's error for this call, if eager refuses it."""
    key = _key(func, args, kwargs)
    if key is not None and key in _accepted:
        return
    error = _replay(func, args, kwargs)
    if error is not None:
        raise error.with_traceback(None) from None
    if key is not None:
        if len(_accepted) >= _ACCEPTED_MAX:
            _accepted.clear()
        _accepted.add(key)


def _key(func: Any, args: tuple, kwargs: dict) -> int | None:
    """A type-exact digest of the call's layouts and numbers (None where one has no key)."""

    def part(v: Any) -> Any:
        if type(v) is LazyTensor:
            return v._meta
        if isinstance(v, torch.Tensor):
            return ("cpu", v.dtype, tuple(v.shape), v.item() if v.dim() == 0 else None)
        if isinstance(v, (list, tuple)):
            return tuple(part(x) for x in v)
        if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            return str(v)
        return v

    try:
        return digest((str(func), part(args), tuple((k, part(v)) for k, v in kwargs.items())))
    except TypeError:
        return None


def _replay(func: Any, args: tuple, kwargs: dict) -> Exception | None:
    """Run the call in eager CPU PyTorch on zeros standing in for the lazy tensors (CPU scalars,
    numbers and attributes as they are; no generator, the CPU RNG state kept): the exception it
    raises, if any."""
    small = _numel(args) + _numel(tuple(kwargs.values())) <= _FULL_SIZE_MAX

    def cpu(v: Any) -> Any:
        if type(v) is LazyTensor:
            shape, _, _, dtype = v._meta
            if not small and 0 not in shape:
                shape = (1,) * len(shape)
            return torch.zeros(shape, dtype=dtype)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        if isinstance(v, torch.device) and v.type == "lazy":
            return torch.device("cpu")
        return None if isinstance(v, torch.Generator) else v

    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.random.fork_rng(devices=[]):
                func(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 (whatever eager raises is the answer)
        return e
    return None


def _numel(values: tuple) -> int:
    n = 0
    for v in values:
        if type(v) is LazyTensor:
            n += v.numel()
        elif isinstance(v, (list, tuple)):
            n += _numel(tuple(v))
    return n


# ----------------------------------------------------------------------------------------------
# Factories: their numbers are attributes, in the shape memo's key by value, so their checks run
# once per memo entry (eager_checks.MEMO_RULES).


def _linspace_values(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """``linspace``: its numbers checked as ``logspace``'s (its entry in ``CHECKS``)."""
    start, end, steps = margs[:3]
    if _spaced_values_overflow(margs, start, end, steps, result.dtype):
        e = _replay_factory(func, (start, end, 2, *margs[3:]), mkwargs)
        if e is not None:
            raise e.with_traceback(None) from None
    return result


def _replay_factory(func: Any, margs: tuple, mkwargs: dict) -> Exception | None:
    kwargs = {k: torch.device("cpu") if k == "device" else v for k, v in mkwargs.items()}
    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*margs, **kwargs)
    except Exception as e:  # noqa: BLE001 (whatever eager raises is the answer)
        return e
    return None


MEMO_RULES: dict[int, Callable[[Any, tuple, dict, Any], Any]] = {
    id(aten.linspace.default): _linspace_values,
}

eager_checks.MEMO_RULES.update(MEMO_RULES)
