"""The torch.Tensor subclass on device 'lazy': a wrapper whose value is a lazy_core Storage."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

import runtime
from lazy_core import Storage, View, data_leaf
from lazy_torch import _native, _wrapper, views
from lazy_torch._dtypes import dtype_name, from_numpy, to_numpy, torch_dtype
from lazy_torch.sync import sync

# The torch-linked C++ extension (_wrapper.py).
extension: Any = _wrapper.load()
# Makes each lazy tensor's wrapper (dispatch.use_wrapper swaps in PyTorch's own, to compare).
make_wrapper = extension.make_wrapper


class Meta(NamedTuple):
    """A tensor's metadata as eager PyTorch would report it. A tuple underneath: memo keys digest
    it, and C reads it (lazy_torch/csrc)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # the storage offset
    dtype: torch.dtype


def is_meta(v: Any) -> bool:
    """Whether an op's output metadata ``v`` is one Meta, not a sequence of Metas (or Nones), one
    per output of a multi-output op."""
    return type(v) is Meta


# torch.device objects of lazy:0 .. lazy:63, made once.
DEVICES = [torch.device("lazy", i) for i in range(64)]


def _bare_lazy(device: Any) -> bool:
    """Whether ``device`` is "lazy" or a lazy torch.device with no index: lazy:0, where a copy
    to it goes (ops._lazy_index)."""
    if type(device) is str:
        return device == "lazy"
    return type(device) is torch.device and device.type == "lazy" and device.index is None


class LazyTensor(torch.Tensor):
    """A tensor on device ``lazy:N``. Its value is ``_lazy.node``: device data or pending IR.

    ``_lazy`` is a View: the storage the tensor shares with its views, and the view steps that
    lead from the storage's value to this tensor's. A tensor that is not a view holds its Storage,
    which is the view of itself with no steps.
    """

    _lazy: View | Storage
    _meta: Meta

    @staticmethod
    def __new__(cls, view: View | Storage, meta: Meta) -> LazyTensor:
        return _native.wrap(view, meta)

    __torch_function__ = torch._C._disabled_torch_function_impl

    # Having these two makes ``Module._apply`` (``model.to('lazy')``) swap each CPU parameter's
    # contents in place instead of making a new Parameter per module: a parameter shared by
    # several modules (tied embeddings, T5's shared/lm_head) stays one object, as in eager.
    # The value lives in ``_lazy``, so there are no inner tensors to flatten.
    def __tensor_flatten__(self) -> tuple[list[str], tuple[View, Meta]]:
        return [], (self._lazy, self._meta)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride) -> LazyTensor:
        return wrap(*ctx)

    def __deepcopy__(self, memo: dict) -> LazyTensor:
        # PyTorch's version clones a lazy tensor, then deep-copies the instance dict over the
        # clone, which would copy the IR graph instead of keeping the clone's own value.
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                "protocol at the moment."
            )
        # As eager's: tensors of one storage share one copy of it, so a view stays a view of the
        # copy of its base, with its own strides.
        storage = self._lazy.storage
        copied = memo.get(id(storage))
        if copied is None:
            node = storage.node
            base = wrap(storage, dense_meta(node.shape, torch_dtype(node.dtype)))
            with torch.no_grad():
                copied = memo[id(storage)] = base.clone()._lazy.storage
        steps = self._lazy.steps
        new = wrap(View(copied, steps) if steps else copied, self._meta)
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        state = {k: v for k, v in self.__dict__.items() if k not in ("_lazy", "_meta")}
        new.__dict__.update(copy.deepcopy(state, memo))
        memo[id(self)] = new
        return new

    @property
    def data(self) -> torch.Tensor:
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        # ``t.data = x`` swaps the C++ metadata; the lazy value lives on the Python object.
        torch.Tensor.data.__set__(self, new)
        self._lazy, self._meta = new._lazy, new._meta

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # PyTorch returns a tensor that needs no change itself, not a copy, but it compares
        # lazy:0 with the "lazy" of t.to("lazy") as different devices. So "lazy" becomes lazy:0
        # here, as t.to("cuda") is the current CUDA device: model.to("lazy") a second time then
        # leaves no pending copy of a parameter.
        if args and _bare_lazy(args[0]):
            args = (DEVICES[0], *args[1:])
        elif _bare_lazy(kwargs.get("device")):
            kwargs["device"] = DEVICES[0]
        return super().to(*args, **kwargs)

    # C: runs the op's plan (records it, makes its view) or calls its handler (dispatch.py).
    __torch_dispatch__ = classmethod(_native.dispatch)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        cpu = to_cpu(self, cause="print")
        body = tensor_contents or torch._tensor_str._tensor_str(cpu, len("tensor("))
        text = torch._tensor_str._str_intern(self, tensor_contents=body)
        return "tensor(" + text.removeprefix(type(self).__name__ + "(")

    def numpy(self, *, force: bool = False):
        return to_cpu(self, cause="numpy").numpy()

    def tolist(self):
        return to_cpu(self, cause="tolist").tolist()

    def __format__(self, format_spec: str) -> str:
        # As eager: a 0-dim tensor formats as its Python number (f"{loss:.4f}"), others as text.
        if self.dim() == 0 and not getattr(self, "_is_param", False):
            return self.item().__format__(format_spec)
        if format_spec:
            kind = "Parameter" if getattr(self, "_is_param", False) else "Tensor"
            raise TypeError(f"unsupported format string passed to {kind}.__format__")
        return str(self)

    # Pickling (torch.save, copy) is serialization.py's: it sets __reduce_ex__.


# What the C recording path needs to make tensors (dispatch.py configures the rest).
_native.configure(
    tensor_type=LazyTensor, meta_type=Meta, make_wrapper=make_wrapper, devices=tuple(DEVICES)
)

# Autograd's detaches of lazy tensors (saving an output, unpacking it in the backward) reach
# __torch_dispatch__ straight from C++ instead of through PyTorch's lookup of the op per call.
extension.set_detach(LazyTensor.__torch_dispatch__, torch.ops.aten.detach.default)


_dense_strides: dict[tuple[int, ...], tuple[int, ...]] = {}


def _dense_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride = _dense_strides.get(shape)
    if stride is None:
        if len(_dense_strides) > 4096:  # shapes that change every step: keep it bounded
            _dense_strides.clear()
        stride = _dense_strides[shape] = contiguous_stride(shape)
    return stride


def dense_meta(shape: tuple[int, ...], dtype: torch.dtype) -> Meta:
    """The Meta of a new contiguous tensor of ``shape`` and ``dtype``."""
    return Meta(shape, _dense_stride(shape), 0, dtype)


def contiguous_stride(shape: Iterable[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(tuple(shape)):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


def meta_of(t: torch.Tensor) -> Meta:
    return Meta(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype)


# A new lazy tensor holding ``view`` (a View or a Storage), of ``meta``: wrap(view, meta).
wrap = _native.wrap
# A new lazy tensor with its own storage holding ``node``: fresh(node, device, meta).
fresh = _native.fresh


def from_cpu(
    t: torch.Tensor, device: int, placement: tuple | None = None, parts: bool = False
) -> Storage:
    """Start a host-to-device copy of CPU tensor ``t``; the storage holds its logical value,
    laid out as ``placement`` over a mesh where one is given (runtime/spmd.py). With ``parts``,
    ``t`` is this process's part of a value split over several processes' devices."""
    name = dtype_name(t.dtype)
    if placement is None and not parts:  # a small value waits on the host for a program
        buffer = runtime.stage(to_numpy(t), device, name)
    else:
        sharding = None if placement is None else runtime.spmd.sharding_of(placement)
        buffer = runtime.to_device(to_numpy(t), device, name, sharding, parts)
    storage = Storage(data_leaf(buffer, name, tuple(buffer.shape)), device)
    storage.placement = placement
    return storage


def upload(
    t: torch.Tensor,
    device: int,
    meta: Meta | None = None,
    placement: tuple | None = None,
    parts: bool = False,
) -> LazyTensor:
    """A lazy tensor on ``device`` holding the value of CPU tensor ``t`` (nothing recorded),
    laid out as ``placement`` where one is given; with ``parts``, ``t`` is this process's part
    of it (``from_cpu``)."""
    storage = from_cpu(t, device, placement, parts)
    if parts:
        meta = dense_meta(tuple(storage.node.shape), t.dtype)
    return wrap(storage, meta_of(t) if meta is None else meta)


def assign_cpu(t: LazyTensor, value: torch.Tensor) -> None:
    """Give ``t`` (maybe a view) the value of CPU tensor ``value``: a transfer, then an Assign."""
    views.write(t, from_cpu(value, t._lazy.storage.device).node)


def materialize(tensors: Iterable[LazyTensor], cause: str) -> None:
    # Each storage once: a sync settles every storage it is given on its own root.
    sync(list({id(t._lazy.storage): t._lazy.storage for t in tensors}.values()), cause)


def to_cpu(t: LazyTensor, cause: str = "cpu") -> torch.Tensor:
    """The value of ``t`` as a CPU tensor with ``t``'s strides (waits for the device)."""
    view = t._lazy
    sync([view.storage], cause)
    node = view.node
    if view.steps:
        # Only the view's elements travel: compute its Access of the base on the device.
        window = Storage(node, view.storage.device)
        sync([window], cause)
        node = window.node
    out = from_numpy(runtime.to_host(node.payload), t.dtype)
    shape, stride, _, _ = t._meta
    if stride != contiguous_stride(shape) and out.numel() > 1:
        # Eager's copy keeps the strides of a dense layout and makes overlapping ones contiguous.
        layout = torch.empty_like(torch.empty_strided(shape, stride, device="meta")).stride()
        out = torch.empty_strided(shape, layout, dtype=t.dtype).copy_(out)
    return out
