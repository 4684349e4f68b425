"""Advanced indexing and the index family of ops: eager's argument checks at the user's line, CPU
index tensors and masks moved to the device (as eager CUDA moves them), boolean masks turned into
integer indices before a node is recorded.

Meta kernels accept some arguments eager refuses (a mask of the wrong shape, index tensors that do
not broadcast, values of the wrong shape or dtype, an index into an empty dimension, ...). Such an
op would be recorded and fail at the barrier's compile, long after the user's line, for every
barrier while its result lives. So each op here first replays eager CPU PyTorch on stand-ins of
its arguments' shapes and dtypes (``check``), once per signature: eager's own error, raised where
eager raises it. Errors that depend on the index values (out of range) are left to the runtime
checks of lowerings/bounds.py, which report the value eager names.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from lazy_core import digest
from lazy_torch.dispatch import dispatch, recorded, special
from lazy_torch.eager_checks import standin
from lazy_torch.recording import RECORD, bound_arguments, record
from lazy_torch.tensor import LazyTensor, dense_meta, to_cpu, upload
from lazy_torch.variants import assign

aten = torch.ops.aten

# ----------------------------------------------------------------------------------------------
# Eager's checks, replayed on CPU stand-ins.

# Signatures (op, argument shapes, dtypes and plain values) eager accepts; bounded, as it only
# saves replays.
_accepted: set = set()
_ACCEPTED_MAX = 4096


def _signature(v: Any) -> Any:
    """``v`` as a part of a type-exact key (lazy_core/digest.py: True, 1 and 1.0, or 0.0 and
    -0.0, are different arguments)."""
    kind = type(v)
    if kind is LazyTensor:
        return ("lazy", v._meta)
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype)
    if kind is list or kind is tuple:
        return (kind.__name__, tuple([_signature(x) for x in v]))
    return v


def _standin(v: Any, fill: int) -> Any:
    if isinstance(v, torch.Tensor):
        return standin(v, fill)
    if isinstance(v, (list, tuple)):
        return type(v)(_standin(x, fill) for x in v)
    return v


def _replay(func: Any, args: tuple, kwargs: dict, fill: int) -> Exception | None:
    standins = _standin(args, fill)
    if func._schema.arguments[0].is_write:
        # Written in place: a tensor of its own (uninitialized; only what is written is touched).
        self = args[0]
        standins = (torch.empty(self.shape, dtype=self.dtype), *standins[1:])
    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*standins, **{k: _standin(v, fill) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 (whatever eager raises is the answer)
        return e
    return None


def check(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise the error eager CPU PyTorch gives for arguments of these shapes and dtypes, if any.

    Indices are replayed as zeros, valid in every dimension but an empty one. An error that
    changes when they are -1 instead names an index value (``index 0 is out of bounds``): the
    runtime check reports it with the real value, so it is not raised here.
    """
    try:
        key = (id(func), digest((_signature(args), _signature(tuple(kwargs.items())))))
    except TypeError:  # an argument no key can hold: replay every time
        key = None
    if key in _accepted:
        return
    error = _replay(func, args, kwargs, 0)
    if error is not None:
        again = _replay(func, args, kwargs, -1)
        if type(again) is type(error) and str(again) == str(error):
            raise error.with_traceback(None)
    if len(_accepted) >= _ACCEPTED_MAX:
        _accepted.clear()
    if key is not None:
        _accepted.add(key)


# ----------------------------------------------------------------------------------------------
# Index tensors: CPU ones move to the device, masks become integer indices.


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _on_device(index: Any, device: int) -> Any:
    """``index`` on lazy ``device``: a CPU tensor is transferred (a 0-dim one is a graph scalar
    already)."""
    if type(index) is torch.Tensor and index.dim() > 0:
        return upload(index, device, dense_meta(tuple(index.shape), index.dtype))
    return index


def _check_masks(self: LazyTensor, indices: list) -> None:
    """Eager's checks of the masks among ``indices`` (their shapes against the dims they index),
    before they become integer indices: the other index tensors replayed empty, which
    broadcasts with what the masks select and indexes no dimension out of range."""
    standins = [
        None if i is None else i if _is_mask(i) else torch.empty((0,), dtype=i.dtype)
        for i in indices
    ]
    check(aten.index.Tensor, (self, standins), {})


def _integer_indices(self: LazyTensor, indices: list) -> list:
    """``indices`` as integer index tensors on ``self``'s device (masks checked already): a mask
    as the indices it selects, found with a sync for a lazy mask, on the CPU (and moved in one
    transfer) for a CPU one."""
    device = self._lazy.device
    out: list = []
    for index in indices:
        if _is_mask(index):
            out.extend(_on_device(aten.nonzero.default(index), device).unbind(1))
        else:
            out.append(_on_device(index, device))
    return out


# In C once a signature is known, as the rest of the family below: masks and CPU index tensors
# never reach the shape memo, so C hands them here.
@special(aten.index.Tensor, plan=RECORD)
def _index(func, args, kwargs):
    self, indices = args
    if type(self) is not LazyTensor:
        return recorded(func, args, kwargs)  # a CPU tensor indexed by lazy indices: a mismatch
    indices = list(indices)
    if any(_is_mask(i) for i in indices):
        _check_masks(self, indices)
    indices = _integer_indices(self, indices)
    check(func, (self, indices), {})
    return recorded(func, (self, indices), {})


def _masked_fill_form(self: LazyTensor, indices: list, values: Any, accumulate: bool) -> Any:
    """``x[mask] = v``, ``x[:, mask] = v`` with one value, as eager CPU does it (a masked fill,
    with no check of the value's shape): the mask broadcast to ``self``, or None if the call
    has another form."""
    present = [k for k, i in enumerate(indices) if i is not None]
    if accumulate or values.numel() != 1 or len(present) != 1:
        return None
    before = present[0]
    mask = indices[before]
    if not _is_mask(mask):
        return None
    shape = (1,) * before + tuple(mask.shape)
    shape += (1,) * (self.dim() - len(shape))
    return _on_device(mask, self._lazy.device).bool().reshape(shape)


@special(aten.index_put.default)
def _index_put(func, args, kwargs):
    bound = bound_arguments(func, args, kwargs)
    self, indices, values, accumulate = bound.values()
    if type(self) is not LazyTensor:
        return recorded(func, args, kwargs)
    indices = list(indices)
    if any(_is_mask(i) for i in indices):
        _check_masks(self, indices)
        mask = _masked_fill_form(self, indices, values, accumulate)
        if mask is not None:  # a select: no data-dependent shape, no sync
            value = values.reshape(()).to(self.dtype)
            return dispatch(aten.where.self, (mask, value, self), {})
    indices = _integer_indices(self, indices)
    args = (self, indices, values, accumulate)
    # The in-place op checks as the functional one (a clone, then it) without a copy of self.
    check(aten.index_put_.default, args, {})
    return recorded(func, args, {})


@special(aten.index_put_.default)
def _index_put_(func, args, kwargs):
    # Its own handler (not the in-place variant of index_put): CPU indices move before any
    # operand is collected.
    self, indices, values, accumulate = bound_arguments(func, args, kwargs).values()
    result = dispatch(aten.index_put.default, (self, indices, values, accumulate), {})
    assign(self, result)
    return self


# ----------------------------------------------------------------------------------------------
# The rest of the family: eager's checks, then the recorded op (in C once its signature is known:
# a signature reaches the shape memo only after its check).

_FAMILY = (
    aten.index_select.default,
    aten.gather.default,
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    aten.index_add.default,
    aten.index_copy.default,
    aten.index_fill.int_Scalar,
    aten.index_fill.int_Tensor,
    aten.index_reduce.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.masked_scatter.default,
    aten.put.default,
    aten.take.default,
    aten.embedding.default,
)


def _foreign(v: Any) -> bool:
    """A non-lazy tensor that is no graph scalar: recording raises the device mismatch."""
    if isinstance(v, (list, tuple)):
        return any(_foreign(x) for x in v)
    return isinstance(v, torch.Tensor) and type(v) is not LazyTensor and v.dim() > 0


@special(*_FAMILY, plan=RECORD)
def _checked(func, args, kwargs):
    if not (_foreign(args) or _foreign(tuple(kwargs.values()))):
        check(func, args, kwargs)
    return recorded(func, args, kwargs)


# ----------------------------------------------------------------------------------------------
# one_hot: PyTorch's composite for tensor subclasses checks no class value (an out-of-range one
# gave a row of zeros), so it is recorded whole; the runtime checks raise eager's errors.


def _one_hot(self: Any, num_classes: int = -1) -> Any:
    if self.dtype != torch.long:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if self.numel() == 0:
        if num_classes <= 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        return torch.zeros((*self.shape, num_classes), dtype=torch.long, device=self.device)
    if num_classes == -1:  # eager reads the values too, the smallest first
        low, high = to_cpu(torch.stack([self.min(), self.max()]), cause="one_hot").tolist()
        if low < 0:
            raise RuntimeError("Class values must be non-negative.")
        num_classes = high + 1
    return record(aten.one_hot.default, (self, num_classes), {})


# At AutogradLazy, where the composite would run; inference mode hands it to the Python key.
special(aten.one_hot.default)(lambda func, args, kwargs: _one_hot(*args, **kwargs))
_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (a kernel for an existing aten op)
_lib.impl("one_hot", _one_hot, "AutogradLazy")
