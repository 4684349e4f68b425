"""Runtime checks: eager raises on an out-of-range index or class target, an integer division by
zero and some other values it reads (offsets, class counts); XLA would clamp, drop or return
garbage.

Each op that reads or writes through an index tensor declares a ``Bound`` with its lowering
(``@lowering(..., bounds=Bound(...))`` in indexing.py and scatter.py); each integer division has
one entry in ``DIVISIONS``, each loss with class targets one in ``TARGETS``; masked_scatter,
one_hot and embedding_bag's offsets have checks of their own. The runtime evaluates
``runtime_checks`` next to the op's lowering: every check yields ``[bad, index]`` on the device
(whether any index is out of range, and the first such index in row-major order), and the runtime
raises eager's error, built by the entry's ``error``, when a graph reports one. The data never
leaves the device otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from lowerings.registry import bounds_of

EACH = -1  # Bound.dim of index.Tensor / index_put: a list of index tensors, one per leading dim


@dataclasses.dataclass(frozen=True)
class Bound:
    """An op's index-bounds check: where its index is, and eager's error for one out of range."""

    index: int  # argument position of the index tensor (or the list of them)
    dim: int | None  # argument position of ``dim``; None: dim 0, or the whole tensor if ``flat``
    negative: bool  # eager accepts indices in [-size, 0) and wraps them
    kind: type[Exception]
    message: str  # fields: index, dim, size
    flat: bool = False  # indexes the flattened tensor (take, put)
    above_1d: Bound | None = None  # the entry eager's kernel uses for a self of 2+ dims

    def error(self, index: int, dim: int, size: int) -> Exception:
        return self.kind(self.message.format(index=index, dim=dim, size=size))


OUT_OF_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"
IN_SELF = "index out of range in self"


def _check(index: Any, size: int, negative: bool) -> Any:
    index = jnp.reshape(index, (-1,)).astype(jnp.int64)
    if index.size == 0:
        return jnp.zeros((2,), jnp.int64)
    bad = (index >= size) | (index < (-size if negative else 0))
    return jnp.stack([jnp.any(bad).astype(jnp.int64), index[jnp.argmax(bad)]])


@dataclasses.dataclass(frozen=True)
class _Message:
    """An error of ``kind`` whose message may name the bad value (``index``) and a ``size``."""

    kind: type[Exception]
    message: str

    def error(self, index: int, dim: int, size: int) -> Exception:
        return self.kind(self.message.format(index=index, size=size))


# Integer ``//``, ``%``, fmod and rounding division: eager raises on a zero divisor.
_ZERO_DIVISION = _Message(RuntimeError, "ZeroDivisionError")
# masked_scatter: eager raises when the mask selects more elements than the source has.
_SOURCE_TOO_SMALL = _Message(RuntimeError, "Number of elements of source < number of ones in mask")
# one_hot: eager checks the class values' range (in that order).
_ONE_HOT = (
    _Message(RuntimeError, "Class values must be non-negative."),
    _Message(RuntimeError, "Class values must be smaller than num_classes."),
)
_ONE_HOT_OP = "aten.one_hot.default"
# embedding_bag: eager reads the first and last offsets (and prints the first as a 0-dim tensor).
_FIRST_OFFSET = (
    "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from "
    "position 0. However, got {index}\n[ torch.%sTensor{{}} ]"
)
_LAST_OFFSET = _Message(
    RuntimeError,
    "offsets[-1] can not be greater than input's length {size} but got offsets[-1] of {index}",
)
_BAGS = frozenset(("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default"))
_MASKED_SCATTER = "aten.masked_scatter.default"


@dataclasses.dataclass(frozen=True)
class _Targets:
    """Class targets of a loss: eager raises on one outside [low, classes) (the classes along
    ``dim`` of the input), but for ``ignore``, the argument position of an ignored target."""

    kind: type[Exception]
    message: str  # field: index (the first bad target)
    dim: int  # the input's dim of classes, for an input of 2+ dims (else 0)
    low: int = 0
    ignore: int | None = None
    input: int = 0  # argument positions of the input and the targets
    target: int = 1

    def error(self, index: int, dim: int, size: int) -> Exception:
        return self.kind(self.message.format(index=index))


_NLL = _Targets(IndexError, "Target {index} is out of bounds.", dim=1, ignore=4)
# The backward ops (grad_output first) check as the forward does. Eager's CPU kernels skip the check
# for reduction='none' (nll_loss of a 2-d input, nll_loss2d) and write outside the target's row or
# past the buffer: no result to match, so we raise the error of every other case.
_NLL_BACKWARD = dataclasses.replace(_NLL, ignore=5, input=1, target=2)
TARGETS: dict[str, _Targets] = {
    "aten.nll_loss_forward.default": _NLL,
    "aten.nll_loss2d_forward.default": _NLL,
    "aten.nll_loss_backward.default": _NLL_BACKWARD,
    "aten.nll_loss2d_backward.default": _NLL_BACKWARD,
    "aten.multi_margin_loss.default": _Targets(RuntimeError, "target out of range", dim=-1),
    "aten.multilabel_margin_loss_forward.default": _Targets(
        RuntimeError, "argument #2 'target' is out of range", dim=-1, low=-1
    ),
}
DIVISIONS = frozenset(
    f"aten.{name}"
    for name in (
        "div.Tensor_mode",
        "div.Scalar_mode",
        "floor_divide.default",
        "floor_divide.Scalar",
        "remainder.Tensor",
        "remainder.Scalar",
        "remainder.Scalar_Tensor",
        "fmod.Tensor",
        "fmod.Scalar",
    )
)
_CHECKED = DIVISIONS | frozenset(TARGETS) | _BAGS | {_MASKED_SCATTER, _ONE_HOT_OP}


def has_checks(op: str) -> bool:
    """True when ``op`` has runtime checks (``runtime_checks`` gives its rows)."""
    return op in _CHECKED or bounds_of(op) is not None


def _integral(x: Any) -> bool:
    dtype = jnp.result_type(x)
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


def runtime_checks(op: str, args: tuple, kwargs: dict) -> list[tuple[Any, tuple[Any, int, int]]]:
    """``[bad, index]`` device values for each check of ``op``, with what its error needs (the
    entry that builds it, and for index checks the dim to report and the size)."""
    if op in DIVISIONS:
        x, divisor = args[0], args[1]
        if not (_integral(x) and _integral(divisor)):
            return []  # a float result: division by zero is inf or nan, as in eager
        if op.startswith("aten.div.") and kwargs.get("rounding_mode") is None:
            return []
        if 0 in jnp.broadcast_shapes(jnp.shape(x), jnp.shape(divisor)):
            return []  # eager divides element by element: an empty result divides nothing
        return [_any(jnp.asarray(divisor) == 0, _ZERO_DIVISION)]
    if op in TARGETS:
        return [_target_check(TARGETS[op], args)]
    if op == _ONE_HOT_OP:
        x, classes = args[0], args[1]
        return [_any(x < 0, _ONE_HOT[0]), _any(x >= classes, _ONE_HOT[1])]
    if op in _BAGS:
        indices, offsets = args[1], args[2]
        if offsets.size == 0 or indices.ndim != 1:
            return []
        name = "Int" if offsets.dtype == jnp.int32 else "Long"
        first_offset = _Message(RuntimeError, _FIRST_OFFSET % name)
        offsets = jnp.reshape(offsets, (-1,)).astype(jnp.int64)
        first, last = offsets[0], offsets[-1]
        n = indices.shape[0]
        return [
            (jnp.stack([(first != 0).astype(jnp.int64), first]), (first_offset, 0, n)),
            (jnp.stack([(last > n).astype(jnp.int64), last]), (_LAST_OFFSET, 0, n)),
        ]
    if op == _MASKED_SCATTER:
        x, mask, source = args
        shape = jnp.broadcast_shapes(jnp.shape(x), jnp.shape(mask))
        ones = jnp.sum(jnp.broadcast_to(mask, shape).astype(jnp.int64))
        return [_any(ones > source.size, _SOURCE_TOO_SMALL)]
    return _index_checks(op, args)


# index_select's CPU kernel checks a 2+-d self through another routine along dim 1 or when self is
# empty (embedding is an index_select along dim 0).
_DATA = Bound(
    2, 1, False, RuntimeError, "INDICES element is out of DATA bounds, id={index} axis_dim={size}"
)
_VISITING = frozenset(
    ("aten.index_copy.default", "aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
)


def _eager_bound(op: str, args: tuple) -> Bound | None:
    """The entry eager's CPU kernel checks these arguments by (torch 2.13), or None where it
    checks none: its kernels check an index as they visit what it addresses, so an index into an
    empty result, or one beside an empty dimension, is never looked at."""
    bound = bounds_of(op)
    shape = args[0].shape
    if bound.above_1d is not None and len(shape) > 1:
        bound = bound.above_1d
    if op in ("aten.index_select.default", "aten.embedding.default") and len(shape) > 1:
        dim = args[1] % len(shape) if op == "aten.index_select.default" else 0
        if dim == 1 or 0 in shape:
            return dataclasses.replace(_DATA, index=bound.index, dim=bound.dim)
    elif op == "aten.index_add.default" and len(shape) > 1 and 0 in shape:
        return None
    elif op in _VISITING:
        dim = args[1] % max(len(shape), 1)
        if any(n == 0 for d, n in enumerate(shape) if d != dim):
            return None
    elif bound.dim == EACH:
        indices = args[bound.index]
        rest = [n for d, n in enumerate(shape) if d >= len(indices) or indices[d] is None]
        indexed = jnp.broadcast_shapes(*(jnp.shape(i) for i in indices if i is not None))
        if 0 in rest or 0 in indexed:  # the indexing result is empty
            return None
    return bound


def _any(bad: Any, error: _Message) -> tuple[Any, tuple[_Message, int, int]]:
    bad = jnp.any(bad).astype(jnp.int64)
    return jnp.stack([bad, jnp.zeros((), jnp.int64)]), (error, 0, 0)


def _target_check(entry: _Targets, args: tuple) -> tuple[Any, tuple[_Targets, int, int]]:
    x, target = args[entry.input], jnp.reshape(args[entry.target], (-1,)).astype(jnp.int64)
    classes = x.shape[entry.dim] if x.ndim > 1 else x.shape[0] if x.ndim else 1
    if target.size == 0:
        return jnp.zeros((2,), jnp.int64), (entry, 0, classes)
    bad = (target < entry.low) | (target >= classes)
    if entry.ignore is not None:
        bad &= target != args[entry.ignore]
    row = jnp.stack([jnp.any(bad).astype(jnp.int64), target[jnp.argmax(bad)]])
    return row, (entry, 0, classes)


def _index_checks(op: str, args: tuple) -> list[tuple[Any, tuple[Bound, int, int]]]:
    bound = _eager_bound(op, args)
    if bound is None:
        return []
    shape = args[0].shape
    if bound.dim == EACH:
        checks = []
        reported = 0  # eager numbers the dims that carry an index tensor, skipping full slices
        for dim, index in enumerate(args[bound.index]):
            if index is None:
                continue
            if jnp.issubdtype(index.dtype, jnp.integer):
                checks.append((_check(index, shape[dim], True), (bound, reported, shape[dim])))
            reported += 1
        return checks
    if bound.flat:
        size = 1
        for n in shape:
            size *= n
        return [(_check(args[bound.index], size, bound.negative), (bound, 0, size))]
    dim = 0 if bound.dim is None else args[bound.dim] % max(len(shape), 1)
    size = shape[dim] if shape else 1
    return [(_check(args[bound.index], size, bound.negative), (bound, dim, size))]
