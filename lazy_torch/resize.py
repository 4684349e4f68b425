"""Resizing lazy tensors as eager does: ``resize_``, ``resize_as_`` and ``out=`` arguments.

A resized tensor keeps its storage: its elements keep their places in memory, and every other view
of the storage sees what is written through it. Where eager resizes or refuses an ``out=`` tensor
(and what it warns) depends on the op and on the metadata of the call only, so it is found by
running the call once in eager CPU PyTorch on stand-in tensors of the same shapes, strides and
dtypes, and remembered.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

import torch

import lazy_core
from lazy_core import window as _window
from lazy_torch import eager_checks
from lazy_torch._dtypes import dtype_name
from lazy_torch.fallback import run_in_memory
from lazy_torch.tensor import (
    LazyTensor,
    Meta,
    contiguous_stride,
    dense_meta,
    fresh,
    meta_of,
    to_cpu,
    wrap,
)
from lazy_torch.views import write

aten = torch.ops.aten


def become(self: LazyTensor, other: LazyTensor) -> LazyTensor:
    """Give ``self`` the sizes, strides and value of ``other`` (in-place metadata ops)."""
    if other.is_inference() and not self.is_inference():
        # Made under inference mode: the swap below takes a tensor of self's own kind.
        with torch.inference_mode(False):
            other = wrap(other._lazy, other._meta)
    torch.Tensor.data.__set__(self, other)  # swaps the C++ sizes and strides
    self._lazy, self._meta = other._lazy, other._meta
    return self


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def extent(meta: Meta) -> int:
    """How many elements of its storage a tensor of ``meta`` reaches (its offset included)."""
    shape, stride, offset, _ = meta
    if 0 in shape:
        return 0
    return offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def _stand_in(meta: Meta, device: str) -> torch.Tensor:
    """A plain tensor of ``meta`` (zeros on CPU) on a storage just large enough for it."""
    shape, stride, offset, dtype = meta
    storage = torch.zeros(max(extent(meta), offset), dtype=dtype, device=device)
    return storage.as_strided(shape, stride, offset)


def resized_meta(t: LazyTensor, size: Any, memory_format: Any = None) -> Meta:
    """The Meta eager gives ``t`` for ``t.resize_(size, memory_format=...)`` (raises its errors)."""
    meta = _stand_in(t._meta, "meta")
    with torch._C._DisableTorchDispatch():
        meta.resize_(size, memory_format=memory_format)
    return meta_of(meta)


def resized_as_meta(t: LazyTensor, template: torch.Tensor, memory_format: Any = None) -> Meta:
    """The Meta eager gives ``t`` for ``t.resize_as_(template, memory_format=...)``."""
    meta = _stand_in(t._meta, "meta")
    like = torch.empty_strided(template.shape, template.stride(), device="meta")
    with torch._C._DisableTorchDispatch():
        meta.resize_as_(like, memory_format=memory_format)
    return meta_of(meta)


def window(t: LazyTensor, meta: Meta) -> LazyTensor:
    """A tensor of ``meta`` (``t``'s dtype) on ``t``'s storage, as eager's ``resize_`` leaves it:
    a view of the storage's elements at those strides from the storage offset.

    Where ``meta`` reaches past the storage's end, eager grows the storage, keeping its elements:
    here the window lies on a new storage holding the old elements and then zeros (eager leaves
    the new ones uninitialized). Other views of the old storage do not see later writes through
    it.
    """
    storage = t._lazy.storage
    node = storage.node
    if node.dtype == dtype_name(t.dtype):
        base = wrap(storage, dense_meta(node.shape, t.dtype))
    else:
        # A dtype view (``x.view(torch.int32)``): its own elements stand for its memory.
        base = aten.clone.default(t, memory_format=torch.contiguous_format)
        meta = meta._replace(offset=0)
    have, need = base.numel(), extent(meta)
    if need > have:
        flat = aten.reshape.default(base, (-1,))
        grow = aten.zeros.default((need - have,), dtype=t.dtype, device=t.device)
        base = aten.cat.default([flat, grow])
    shape, stride, offset, _ = meta
    if offset == 0 and _numel(shape) == base.numel() and stride == contiguous_stride(shape):
        return aten.view.default(base, shape)
    return aten.as_strided.default(base, shape, stride, offset)


def resize(t: LazyTensor, meta: Meta) -> LazyTensor:
    """Give ``t`` (in place) the sizes and strides of ``meta`` over its storage, as eager's
    ``resize_``: see ``window``."""
    if meta == t._meta:
        return t
    return become(t, window(t, meta))


# ----------------------------------------------------------------------------------------------
# out= arguments.

# Call metadata -> (Meta of each out tensor after the call, warnings eager gives).
_eager_outs_cache: dict[Any, tuple[list[Meta], list[str]]] = {}
_CACHE_LIMIT = 4096
# Frames of this backend, which a warning skips to name the user's line as eager's warnings do.
_OWN_DIRS = tuple(
    os.path.dirname(os.path.abspath(path)) + os.sep for path in (lazy_core.__file__, __file__)
)


def out_variant(functional: Any, dispatch: Callable) -> Callable:
    """The handler of an out= op: ``dispatch`` its ``functional`` op, then fill the out tensors.

    An out= factory (``arange.start_out``) takes its dtype and device from the out tensor; an op
    with a dtype argument (``sum``, ``cumsum``) computes in the out tensor's dtype when given
    none, as eager does."""
    schema = functional._schema.arguments
    factory = any(a.name == "device" for a in schema)
    dtype_at = next((i for i, a in enumerate(schema) if a.name == "dtype"), None)
    out_names: list[str] = []

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        if not out_names:
            out_names.extend(a.name for a in func._schema.arguments if a.is_out)
        outs = [kwargs[n] for n in out_names]
        inputs = {k: v for k, v in kwargs.items() if k not in out_names}
        eager_checks.check_out_overlap(func, args, kwargs, out_names)
        if factory:
            inputs.update(dtype=outs[0].dtype, device=outs[0].device)
        try:
            result = dispatch(functional, args, inputs)
        except Exception:
            # Some out= kernels check their out tensors before what the functional op refuses
            # (amax's an out of another dtype before an empty reduced dim): eager's first error.
            _raise_eager_error(func, args, kwargs, out_names)
            raise
        if (
            dtype_at is not None
            and not factory
            and isinstance(result, LazyTensor)
            and isinstance(outs[0], LazyTensor)
            and result.dtype != outs[0].dtype
            and (args[dtype_at] if dtype_at < len(args) else inputs.get("dtype")) is None
        ):
            _eager_outs(func, args, kwargs, out_names, [result])  # eager's refusal, if it refuses
            if dtype_at < len(args):
                args = args[:dtype_at] + (outs[0].dtype,) + args[dtype_at + 1 :]
            else:
                inputs["dtype"] = outs[0].dtype
            result = dispatch(functional, args, inputs)
        # An out whose elements share memory: eager writes it, element by element in the order
        # of its loops, into a copy of its memory.
        if not (_shares_own_memory(outs, result) and run_in_memory(func, args, kwargs)):
            fill_outs(func, args, kwargs, out_names, result)
        if not func._schema.returns:
            return None
        return outs[0] if len(outs) == 1 else tuple(outs)

    return handle


def _shares_own_memory(outs: list, result: Any) -> bool:
    """Whether an out tensor's elements share memory (overlapping unfold windows), which eager
    writes in the order of its loops, and every out tensor has its result's shape (no resize)."""
    outs, results = _flat(outs), _flat([result])
    if not any(type(o) is LazyTensor and not o._lazy.writable for o in outs):
        return False  # every out is written through inverses: its elements share no memory
    if len(outs) != len(results) or any(
        type(o) is not LazyTensor or o.shape != r.shape for o, r in zip(outs, results)
    ):
        return False
    return any(not _window.distinct(o._meta[:3]) for o in outs)


def _raise_eager_error(func: Any, args: tuple, kwargs: dict, out_names: list[str]) -> None:
    """Raise the error eager gives for this out= call on stand-ins of its tensors (shapes,
    strides and dtypes: the error comes from checks before any value is computed), if any."""
    if not all(isinstance(o, LazyTensor) for o in _flat([kwargs[n] for n in out_names])):
        return  # an out tensor of another device: the stand-ins would write into it
    try:
        _run_eager(func, args, kwargs, out_names, values=False)
    except Exception as error:  # noqa: BLE001 (whatever eager raises is the answer)
        _raise_as_eager(error)


def fallback_out_variant(run: Callable) -> Callable:
    """The handler of an out= op without a functional op: its out tensors resized as eager
    resizes them, then ``run`` (the CPU fallback) fills them."""

    def handle(func: Any, args: tuple, kwargs: dict) -> Any:
        out_names = [a.name for a in func._schema.arguments if a.is_out]
        outs = _flat([kwargs[n] for n in out_names])
        if all(isinstance(o, LazyTensor) for o in outs):  # else the fallback's device error
            metas, messages = _eager_outs(func, args, kwargs, out_names, None)
            for o, meta in zip(outs, metas):
                resize(o, meta)
            _warn(messages)
        return run(func, args, kwargs)

    return handle


def fill_outs(func: Any, args: tuple, kwargs: dict, out_names: list[str], result: Any) -> None:
    """Write ``result``, the functional op's output, into the ``out=`` tensors of this call of
    ``func`` as eager does: resized (keeping their Python objects and storages) where their shapes
    differ, cast where their dtypes differ and eager allows it, eager's error where it refuses,
    and eager's warnings."""
    outs = _flat([kwargs[n] for n in out_names])
    results = _flat([result])
    if len(outs) == len(results) and all(
        isinstance(o, LazyTensor)
        and o._meta.shape == r._meta.shape
        and o.dtype == r.dtype
        and o._lazy.device == r._lazy.device
        for o, r in zip(outs, results)
    ):
        for o, r in zip(outs, results):
            _assign(o, r)
        return
    for o, r in zip(outs, results):
        if not isinstance(o, LazyTensor) or o.device != r.device:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{r.device} and {o.device}!"
            )
    metas, messages = _eager_outs(func, args, kwargs, out_names, results)
    for o, r, meta in zip(outs, results, metas):
        if r.dtype != o.dtype:
            r = aten._to_copy.default(r, dtype=o.dtype)
        empty = not _numel(o._lazy.storage.node.shape)
        if meta.shape != o._meta.shape and not meta.offset and empty:
            # The ``out=torch.empty(0)`` idiom: no element of the storage to keep.
            become(o, fresh(r._lazy.node, o._lazy.device, meta))
            continue
        storage = o._lazy.storage
        resize(o, meta)
        _assign(o, r)
        if o._lazy.storage is not storage:
            _write_back(storage, o)
    _warn(messages)


def _write_back(storage: Any, grown: LazyTensor) -> None:
    """Give ``storage`` the first elements of the storage it grew into (``grown``'s), as other
    views of it see them in eager, where a storage grows in place."""
    new = grown._lazy.storage
    if storage.node.dtype != new.node.dtype:
        return
    flat = aten.reshape.default(wrap(new, dense_meta(new.node.shape, grown.dtype)), (-1,))
    head = aten.slice.Tensor(flat, 0, 0, _numel(storage.node.shape))
    storage.set(aten.reshape.default(head, storage.node.shape)._lazy.node)


def _flat(values: Any) -> list:
    out = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.extend(_flat(v))
        elif isinstance(v, dict):
            out.extend(_flat(list(v.values())))
        elif isinstance(v, torch.Tensor):
            out.append(v)
    return out


def _assign(target: LazyTensor, value: LazyTensor) -> None:
    write(target, value._lazy.node)


def _eager_outs(
    func: Any, args: tuple, kwargs: dict, out_names: list[str], results: list | None
) -> tuple[list[Meta], list[str]]:
    """The Meta eager gives each out tensor of this call, and the warnings it gives; raises
    eager's error where eager refuses the out tensors. ``results``: the functional op's outputs,
    whose sizes are the out tensors' (None: no functional op)."""
    try:
        key = (func, _key(args), _key(kwargs))
        hash(key)
    except TypeError:
        key = None
    entry = _eager_outs_cache.get(key) if key is not None else None
    if entry is None:
        try:
            entry = _run_eager(func, args, kwargs, out_names, values=False)
        except Exception:  # noqa: BLE001 (eager decides)
            # Zeros may make eager fail (a singular matrix) where the inputs would not: ask with
            # the inputs' own values (a sync), and raise what eager raises for them.
            try:
                entry = _run_eager(func, args, kwargs, out_names, values=True)
            except Exception as error:  # noqa: BLE001 (whatever eager raises is the answer)
                _raise_as_eager(error)
        else:
            if key is not None:
                if len(_eager_outs_cache) >= _CACHE_LIMIT:
                    _eager_outs_cache.clear()
                _eager_outs_cache[key] = entry
    metas, messages = entry
    if results is not None and (
        len(metas) != len(results) or any(m.shape != r._meta.shape for m, r in zip(metas, results))
    ):
        # Zeros gave eager another result size (nonzero): resize as eager's resize_output would.
        return _by_rule(_flat([kwargs[n] for n in out_names]), results)
    return metas, messages


def _key(v: Any) -> Any:
    """Hashable metadata of an argument: what decides eager's handling of out= tensors."""
    if isinstance(v, LazyTensor):
        return v._meta
    if isinstance(v, torch.Tensor):
        value = v.item() if v.numel() == 1 and v.device.type == "cpu" else None
        return ("tensor", meta_of(v), str(v.device), type(value), value)
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_key(x) for x in v))
    if isinstance(v, dict):
        return tuple((k, _key(x)) for k, x in v.items())
    return (type(v), v)


def _run_eager(
    func: Any, args: tuple, kwargs: dict, out_names: list[str], values: bool
) -> tuple[list[Meta], list[str]]:
    """Run this call in eager CPU PyTorch on stand-ins of its out tensors and of its inputs (zeros,
    or with ``values`` the inputs' own values): the out tensors' Metas after it, its warnings."""
    cpu_args = _to_cpu(args, values)
    cpu_kwargs = {k: _to_cpu(v, values and k not in out_names) for k, v in kwargs.items()}
    messages = _call(func, cpu_args, cpu_kwargs)
    return [meta_of(o) for o in _flat([cpu_kwargs[n] for n in out_names])], messages


def _call(func: Any, args: tuple, kwargs: dict) -> list[str]:
    """Run ``func`` in eager CPU PyTorch (the RNG state kept as it was); its warnings' texts.
    Where it raises, raises ``_Refusal``: its error and the warnings eager gives before it."""
    failed: list[Exception] = []
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _WithWarnings.apply(func, args, kwargs, failed)
    messages = [str(w.message) for w in caught]
    if failed:
        raise _Refusal(failed[0], messages)
    return messages


class _WithWarnings(torch.autograd.Function):
    """Calls an op where its C++ warnings become Python warnings at once: a ``torch.ops`` call
    installs no warning handler of its own (its warnings would go to stderr, or wait for the
    handler of the user's call), and ``apply``'s binding installs one."""

    @staticmethod
    def forward(ctx: Any, func: Any, args: tuple, kwargs: dict, failed: list) -> None:
        try:
            func(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 (handed to _call)
            # Raised out of forward, the error would still be set when apply's handler gives the
            # warnings the op gave before it: Python then fails the warning (a SystemError, or
            # apply returns NULL with no exception) instead of raising the op's error.
            failed.append(error)


class _Refusal(Exception):
    """Eager's error for a call (``error``) and the warnings it gave before it (``messages``)."""

    def __init__(self, error: Exception, messages: list[str]):
        super().__init__(str(error))
        self.error, self.messages = error, messages


def _raise_as_eager(error: Exception) -> NoReturn:
    """Raise eager's ``error`` at the user's call, after the warnings eager gave before it."""
    if isinstance(error, _Refusal):
        _warn(error.messages)
        error = error.error
    raise error.with_traceback(None) from None


def _to_cpu(v: Any, values: bool = False) -> Any:
    if isinstance(v, LazyTensor):
        return to_cpu(v, cause="out=") if values else _stand_in(v._meta, "cpu")
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(x, values) for x in v)
    if isinstance(v, torch.device) and v.type == "lazy":
        return torch.device("cpu")
    return v


def _by_rule(outs: list, results: list) -> tuple[list[Meta], list[str]]:
    """Eager's ``resize_output`` where eager cannot be asked: an out tensor of another shape takes
    the result's sizes and strides, with eager's warning when it had elements."""
    metas, messages = [], []
    for o, r in zip(outs, results):
        if o._meta.shape == r._meta.shape:
            metas.append(o._meta)
            continue
        metas.append(Meta(r._meta.shape, r._meta.stride, o._meta.offset, o.dtype))
        # Copy ops' out= kernels resize with ``resize_output``: its warning, word for word.
        like = torch.zeros(r.shape, dtype=o.dtype)
        messages.extend(_call(aten.alias_copy.out, (like,), {"out": _to_cpu(o)}))
    return metas, messages


def _warn(messages: list[str]) -> None:
    """Warn as eager does, from the innermost frame outside this backend (the user's call).

    Last in an op's handler: shape inference of new ops resets Python's registry of warnings
    given (``catch_warnings``), which would let the next call at that line warn again."""
    if not messages:
        return
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_DIRS):
        frame, level = frame.f_back, level + 1
    for message in messages:
        warnings.warn(message, UserWarning, stacklevel=level)
