"""Eager CPU's checks that meta kernels skip, replayed on stand-ins at the user's line.

Shape inference (shapes.py's ``memo_entry``) runs each op on meta tensors. For a few ops the meta
kernel accepts a call eager CPU PyTorch refuses (a max over an empty dimension), which would be
recorded and then fail to compile at the next barrier, or gives another dtype (a bool tensor to a
bool power). For those ops eager is replayed on stand-ins of the arguments' shapes and dtypes that
cost no memory of their size, once per shape-memo signature (``MEMO_RULES``).

Overlap of an in-place op's input with the tensor it writes depends on which tensors share a
storage, which no signature holds: ``check_inplace_overlap`` looks for a shared storage on each
call (a few attribute reads) and replays eager only when it finds one, once per layout.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from lazy_torch.tensor import LazyTensor

aten = torch.ops.aten

# ----------------------------------------------------------------------------------------------
# Replays on stand-ins of meta arguments.


def replay(func: Any, margs: Any, mkwargs: dict, standin: Callable) -> Any:
    """``func`` run by eager CPU PyTorch on ``standin(t)`` for each meta tensor ``t``: its result,
    or the exception it raised."""

    def cpu(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.device.type == "meta":
            return standin(v)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        return torch.device("cpu") if isinstance(v, torch.device) else v

    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return func(*cpu(margs), **{k: cpu(v) for k, v in mkwargs.items()})
    except Exception as e:  # noqa: BLE001 (whatever eager raises is the answer)
        return e


def _is_empty_meta(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.numel() == 0


_INDEX_DTYPES = (torch.int64, torch.int32)


def standin(t: torch.Tensor, fill: int = 0) -> torch.Tensor:
    """A CPU tensor of ``t``'s shape and dtype that takes no memory of its size (read only): an
    empty one as itself, with the strides some of eager's messages name; integer tensors
    (indices) hold ``fill``, others zeros."""
    if t.numel() == 0:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    return torch.full((), fill if t.dtype in _INDEX_DTYPES else 0, dtype=t.dtype).expand(t.shape)


def _empty_reduction(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """Reductions with no identity: eager refuses an empty reduced dimension (``max(): Expected
    reduction dim 0 to have non-zero size``), their meta kernels do not."""
    if any(_is_empty_meta(a) for a in margs):
        error = replay(func, margs, mkwargs, standin)
        if isinstance(error, Exception):
            raise error.with_traceback(None) from None
    return result


def _tiny_standin(t: torch.Tensor) -> torch.Tensor:
    """A one-element tensor of ``t``'s dtype and number of dimensions (which type promotion
    looks at: a 0-dim tensor promotes as a number would)."""
    return torch.zeros((1,) * t.dim(), dtype=t.dtype)


def _is_bool(v: Any) -> bool:
    return type(v) is bool or (isinstance(v, torch.Tensor) and v.dtype == torch.bool)


def _bool_pow(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """pow of bools: eager's result for a bool exponent is a bool tensor (exponents 0 and 1 need
    no kernel: a fill or a copy), the meta kernel's is int64. Every value of a bool argument
    behaves alike, so the replay stands for every call of this signature. (Eager has no kernel
    for a bool tensor exponent: dtype_checks.py raises its error.)"""
    if not all(_is_bool(a) for a in margs):
        return result
    eager = replay(func, margs, mkwargs, _tiny_standin)
    if isinstance(eager, Exception) or eager.dtype == result.dtype:
        return result
    return torch.empty_strided(result.shape, result.stride(), dtype=eager.dtype, device="meta")


# id(op) -> rule(func, meta args, meta kwargs, meta result) -> the result eager's checks leave
# (or raise eager's error).
MEMO_RULES: dict[int, Callable[[Any, tuple, dict, Any], Any]] = {
    id(op): _empty_reduction
    for op in (
        aten.max.default,
        aten.min.default,
        aten.max.dim,
        aten.min.dim,
        aten.amax.default,
        aten.amin.default,
        aten.argmax.default,
        aten.argmin.default,
        aten.aminmax.default,
        aten.kthvalue.default,
        aten.median.default,
        aten.median.dim,
        aten.nanmedian.default,
        aten.nanmedian.dim,
        aten.mode.default,
    )
}
MEMO_RULES.update(
    {id(op): _bool_pow for op in (aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)}
)


def eager_memo_rule(func: Any, margs: tuple, mkwargs: dict, result: Any) -> Any:
    """The meta kernel's ``result`` of a call on meta arguments, as eager's checks leave it (or
    eager's error raised): applied on a shape-memo miss, so once per signature."""
    rule = MEMO_RULES.get(id(func))
    return result if rule is None else rule(func, margs, mkwargs, result)


# ----------------------------------------------------------------------------------------------
# In-place ops whose inputs share memory with the written tensor.

# (op, layouts of the written tensor and of the inputs sharing its storage) of in-place calls
# eager accepts; bounded, as it only saves replays.
_overlap_accepted: set = set()
_ACCEPTED_MAX = 4096
_OVERLAP_ERROR = "refer to a single memory location"
# id(op) -> whether it draws random numbers (a property PyTorch builds per read).
_SEEDED: dict[int, bool] = {}


def _tensors(args: tuple, kwargs: dict) -> list:
    """The tensor arguments of a call, one list level deep (as TensorIterator's inputs)."""
    found = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


def check_inplace_overlap(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise eager's error for an in-place call of ``func`` whose input shares memory with the
    tensor it writes, ``args[0]``, where eager refuses that (TensorIterator refuses an input that
    overlaps the output partly, ``x.sub_(x[:, 0])``; some ops any overlap).

    Views know their storage and layout, so eager is replayed on CPU views of one buffer laid out
    as the lazy tensors are on theirs, once per layout. A call with no input on the written
    tensor's storage costs one attribute read per tensor argument."""
    self = args[0]
    if type(self) is not LazyTensor:
        return
    storage = self._lazy.storage
    for v in (*args[1:], *kwargs.values()) if kwargs else args[1:]:
        if type(v) is LazyTensor:
            if v._lazy.storage is storage:
                break
        elif type(v) in (list, tuple) and any(_on(x, storage) for x in v):
            break
    else:
        return
    _check_shared(func, args, kwargs, storage)


def check_out_overlap(func: Any, args: tuple, kwargs: dict, out_names: list[str]) -> None:
    """Raise eager's error for an out= call whose out tensor shares memory with an input: eager
    refuses a partial overlap, and some ops (``cat``) any. Replayed as for in-place calls."""
    given = {k: v for k, v in kwargs.items() if k not in out_names}
    for out in _tensors((), {n: kwargs[n] for n in out_names}):
        if type(out) is not LazyTensor:
            continue
        storage = out._lazy.storage
        inputs = [t for t in _tensors(args, given) if _on(t, storage)]
        if not inputs:
            continue
        shared = tuple((t._meta, t is out) for t in inputs)
        pattern = (id(func), "out", out._meta, shared)
        if pattern in _overlap_accepted:
            continue
        error = _replay_aliased(func, args, kwargs, [out, *inputs])
        if isinstance(error, Exception) and _OVERLAP_ERROR in str(error):
            raise error.with_traceback(None) from None
        if len(_overlap_accepted) >= _ACCEPTED_MAX:
            _overlap_accepted.clear()
        _overlap_accepted.add(pattern)


def _on(v: Any, storage: Any) -> bool:
    return type(v) is LazyTensor and v._lazy.storage is storage


def _check_shared(func: Any, args: tuple, kwargs: dict, storage: Any) -> None:
    seeded = _SEEDED.get(id(func))
    if seeded is None:
        seeded = _SEEDED[id(func)] = torch.Tag.nondeterministic_seeded in func.tags
    if seeded:
        return  # a replay would draw from eager's generator
    self = args[0]
    inputs = _tensors(args, kwargs)[1:]
    # Eager checks overlap before anything else of the inputs (TensorIterator's first check),
    # so the layouts on the shared storage decide. Metas hold ints and dtypes only: exact keys.
    shared = tuple((i, t._meta, t is self) for i, t in enumerate(inputs) if _on(t, storage))
    pattern = (id(func), self._meta, shared)
    if pattern in _overlap_accepted:
        return
    error = _replay_aliased(func, args, kwargs, [self] + [t for t in inputs if _on(t, storage)])
    if isinstance(error, Exception) and _OVERLAP_ERROR in str(error):
        raise error.with_traceback(None) from None
    if len(_overlap_accepted) >= _ACCEPTED_MAX:
        _overlap_accepted.clear()
    _overlap_accepted.add(pattern)


def _replay_aliased(func: Any, args: tuple, kwargs: dict, aliased: list) -> Exception | None:
    """Run ``func`` eagerly with the ``aliased`` lazy tensors as views of one zeroed CPU buffer
    (same layouts) and the other tensors as zeros taking no memory; the exception it raises."""
    size = 1
    for t in aliased:
        shape, stride, offset, dtype = t._meta
        if 0 not in shape:
            last = offset + sum((n - 1) * st for n, st in zip(shape, stride))
            size = max(size, (last + 1) * dtype.itemsize)
    buffer = torch.zeros(size, dtype=torch.uint8).untyped_storage()
    standins: dict[int, torch.Tensor] = {}
    for t in aliased:
        shape, stride, offset, dtype = t._meta
        standins[id(t)] = torch.empty(0, dtype=dtype).set_(buffer, offset, shape, stride)

    def cpu(v: Any) -> Any:
        if id(v) in standins:
            return standins[id(v)]
        if type(v) is LazyTensor:
            return torch.zeros((), dtype=v.dtype).expand(v.shape)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        if isinstance(v, torch.device) and v.type == "lazy":
            return torch.device("cpu")
        return v

    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*cpu(args), **{k: cpu(v) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 (judged by the caller)
        return e
    return None
