"""``torch.save``/``torch.load`` of lazy tensors through PyTorch's storages and location tags.

A lazy tensor pickles as eager pickles a CUDA tensor: ``torch._utils._rebuild_tensor_v2`` of a
storage, its offset, sizes and strides. The storage is a CPU image of the lazy storage's memory,
one per lazy storage however many tensors of it one save holds, and a tagger registered with
``torch.serialization.register_package`` tags it ``lazy:N``. At load, ``map_location`` (string,
device, dict or callable) acts on that CPU storage and tag as on any device's; where the tag
stays ``lazy:N``, the registered deserializer gives a storage on device ``lazy:N``, and the
rebuild function's ``set_`` of a lazy tensor to it uploads its elements once, so tensors that
shared a storage share one again. ``weights_only`` loads allow all of it, and a process without
lazy_torch loads such a file with ``map_location='cpu'``.

>>> import io, torch, lazy_torch
>>> base = torch.arange(6.0, device="lazy")
>>> buffer = io.BytesIO()
>>> torch.save([base, base[2:].view(2, 2)], buffer)
>>> _ = buffer.seek(0)
>>> b, v = torch.load(buffer, weights_only=True)
>>> _ = b.add_(10)
>>> v.tolist()
[[12.0, 13.0], [14.0, 15.0]]
"""

from __future__ import annotations

import collections
import functools
import math
import re
import weakref
from typing import Any

import torch

from lazy_torch import device_module
from lazy_torch._dtypes import torch_dtype
from lazy_torch.dispatch import special
from lazy_torch.recording import bound_arguments
from lazy_torch.resize import become, extent
from lazy_torch.tensor import (
    LazyTensor,
    contiguous_stride,
    dense_meta,
    from_cpu,
    to_cpu,
    wrap,
)

aten = torch.ops.aten

# Dtypes that PyTorch saves with ``_rebuild_tensor_v3`` (no typed storage class exists for them).
_V3_DTYPES = torch.storage._new_dtypes()

# Same-size stand-ins for the dtypes eager's CPU index_put lacks (the bytes are what is written).
_INDEXABLE = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}

# The CPU image of each lazy storage (by id) while a save holds it: the pickler keeps the images
# it wrote alive, so every tensor of one storage in one save gets the same one.
_images: weakref.WeakValueDictionary[int, torch.UntypedStorage] = weakref.WeakValueDictionary()


def reduce_ex(t: LazyTensor, protocol: int) -> tuple:
    """``LazyTensor.__reduce_ex__``, as PyTorch pickles CUDA tensors and parameters: a parameter
    stays a parameter, and a tensor is rebuilt from its storage, offset and strides."""
    if getattr(t, "_is_param", False):
        state = {k: v for k, v in t.__dict__.items() if k not in ("_lazy", "_meta", "_is_param")}
        args = (t.detach(), t.requires_grad, collections.OrderedDict())
        if state:
            return (torch._utils._rebuild_parameter_with_state, (*args, state))
        return (torch._utils._rebuild_parameter, args)
    return reduce(t)


LazyTensor.__reduce_ex__ = reduce_ex


def reduce(t: LazyTensor) -> tuple:
    """Eager's rebuild of a lazy tensor from its storage, offset and strides."""
    image, offset, stride = _image_of(t)
    shape, _, _, dtype = t._meta
    if dtype in _V3_DTYPES:
        args = (image, offset, shape, stride, t.requires_grad, collections.OrderedDict(), dtype)
        return (torch._utils._rebuild_tensor_v3, args)
    typed = torch.storage.TypedStorage(wrap_storage=image, dtype=dtype, _internal=True)
    args = (typed, offset, shape, stride, t.requires_grad, collections.OrderedDict())
    return (torch._utils._rebuild_tensor_v2, args)


def _image_of(t: LazyTensor) -> tuple[torch.UntypedStorage, int, tuple[int, ...]]:
    """The tagged CPU storage holding ``t``'s elements at its offset and strides, and those."""
    source = t._lazy.storage
    shape, stride, offset, dtype = t._meta
    need = extent(t._meta) * t.element_size()
    image = _images.get(id(source))
    if (
        image is None
        or image._lazy_value[0] is not source
        or image._lazy_value[1] is not source.node
    ):
        image = _images[id(source)] = _new_image(source, need)
    if image.nbytes() < need:
        # Reaches past the memory its storage's other tensors span (a strided tensor made with
        # gaps): its own elements, in a storage of their own.
        cpu = to_cpu(t, cause="save")
        return _tagged(cpu.untyped_storage(), source.device), cpu.storage_offset(), cpu.stride()
    if t._lazy.steps or t._meta != dense_meta(source.node.shape, torch_dtype(source.node.dtype)):
        # The image lays the storage's value out densely, which is its memory when the tensor
        # that made it was contiguous; a view or a strided tensor writes its own elements where
        # its strides put them, which is right whatever that layout was.
        same_size = _INDEXABLE.get(dtype, dtype)
        elements = _elements(image, same_size)
        positions = torch.arange(elements.numel()).as_strided(shape, stride, offset)
        elements[positions] = to_cpu(t, cause="save").view(same_size)
    return image, offset, stride


def _new_image(source: Any, nbytes: int) -> torch.UntypedStorage:
    node = source.node
    dense = wrap(source, dense_meta(node.shape, torch_dtype(node.dtype)))
    image = to_cpu(dense, cause="save").untyped_storage()
    if image.nbytes() < nbytes:
        grown = torch.zeros(nbytes, dtype=torch.uint8)
        grown[: image.nbytes()] = _elements(image, torch.uint8)
        image = grown.untyped_storage()
    image._lazy_value = (source, source.node)  # the value it is an image of (synced by to_cpu)
    return _tagged(image, source.device)


def _tagged(image: torch.UntypedStorage, device: int) -> torch.UntypedStorage:
    image._lazy_location = f"lazy:{device}"
    return image


def _tag(storage: Any) -> str | None:
    return getattr(storage, "_lazy_location", None)


def _restore(storage: torch.UntypedStorage, location: str) -> torch.UntypedStorage | None:
    """A CPU storage tagged ``lazy:N`` as a storage on device ``lazy:N`` (its bytes stay on the
    host until a tensor is set to it)."""
    if not re.fullmatch(r"lazy(:\d+)?", location):
        return None
    # PyTorch's own check of the device module, with eager's messages for a bad index.
    device = torch.serialization._validate_device(location, "lazy")
    index = device_module.current_device() if device.index is None else device.index
    restored = torch._C._construct_storage_from_data_pointer(
        storage.data_ptr(), torch.device("lazy", index), storage.nbytes()
    )
    restored._host = storage  # owns the bytes ``restored`` points to
    if getattr(storage, "_torch_load_uninitialized", False):
        # The legacy format (plain pickle, ``_use_new_zipfile_serialization=False``) reads the
        # bytes into the restored storage after the tensors on it are built.
        restored._set_from_file = functools.partial(_read_legacy, restored)
    return restored


def _read_legacy(restored: torch.UntypedStorage, *args: Any) -> Any:
    """Read the bytes into the host storage, then give the tensors' lazy storages their values."""
    result = restored._host._set_from_file(*args)
    for dtype, storage in restored.__dict__.get("_lazy_values", {}).items():
        elements = _elements(restored._host, dtype).view(storage.node.shape)
        storage.assign(from_cpu(elements, storage.device).node)
    return result


def _elements(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.Tensor:
    """The CPU storage's bytes as a 1-d tensor of ``dtype`` elements (no copy)."""
    return torch.empty(0, dtype=dtype).set_(storage, 0, (storage.nbytes() // dtype.itemsize,))


# Before the CPU tagger (priority 10): the images are CPU storages.
torch.serialization.register_package(9, _tag, _restore)


@special(aten.set_.source_Storage_storage_offset, aten.set_.source_Storage)
def _set_storage(func, args, kwargs):
    # The rebuild functions' ``torch.empty((0,), device=...).set_(storage, offset, size, stride)``.
    bound = bound_arguments(func, args, kwargs)
    self, source = bound["self"], bound["source"]
    host = getattr(source, "_host", None)
    if source.device != self.device:
        raise RuntimeError(
            f'Attempted to set the storage of a tensor on device "{self.device}" to a storage on '
            f'different device "{source.device}".  This is no longer allowed; the devices must '
            "match."
        )
    if host is None:
        raise RuntimeError("set_ of a lazy tensor takes only a storage that torch.load made")
    numel = source.nbytes() // self.element_size()
    if func is aten.set_.source_Storage:
        size, stride, offset = (numel,), (1,), 0
    else:
        size, offset = tuple(bound["size"]), bound["storage_offset"]
        stride = tuple(bound["stride"] or contiguous_stride(size))
    meta = (size, stride, offset, self.dtype)
    # One lazy storage per loaded storage (and dtype): its tensors share it, as eager's do.
    values = source.__dict__.setdefault("_lazy_values", {})
    storage = values.get(self.dtype)
    if storage is None:
        elements = _elements(host, self.dtype)
        if meta == dense_meta(size, self.dtype) and math.prod(size) == numel:
            elements = elements.view(size)  # the whole storage: no view needed
        storage = values[self.dtype] = from_cpu(elements, self.device.index)
    base = wrap(storage, dense_meta(storage.node.shape, self.dtype))
    if base._meta != meta:
        base = aten.as_strided.default(base, size, stride, offset)
    return become(self, base)
