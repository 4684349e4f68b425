"""Input pipelines: move batches to the lazy device ahead of use, on a background thread.

>>> import torch, lazy_torch
>>> data = [(torch.ones(2, 3), torch.zeros(2)) for _ in range(3)]
>>> [x.device.type for x, y in lazy_torch.DeviceLoader(data)]
['lazy', 'lazy', 'lazy']
"""

from __future__ import annotations

import collections.abc
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from lazy_torch.tensor import upload

_END = object()

# Storages a DeviceLoader's thread made and has not handed over yet, by id (each held by its
# queue meanwhile): the watch of a capture (side_effects.py) does not take them for storages
# the watched call made. Changed and read under ``prefetching``.
prefetching = threading.Lock()
prefetched: set[int] = set()


def _storage_ids(batch: Any) -> list[int]:
    leaves = pytree.tree_leaves(batch)
    return [id(t._lazy.storage) for t in leaves if hasattr(t, "_lazy")]


def _handed_over(ids: list[int]) -> None:
    with prefetching:
        prefetched.difference_update(ids)


def to_device(
    batch: Any,
    device: torch.device | str | None = None,
    mesh: Any = None,
    partition_spec: Sequence[Any] | None = None,
) -> Any:
    """``batch`` (tensors in any nesting of tuples, lists, dicts, dataclasses) on a lazy device,
    or laid out on ``mesh`` (lazy_torch.distributed.Mesh) as ``partition_spec``: each tensor by
    the spec's first entries, one per dimension it has. In a multi-process run each process
    gives its own part (its batch), and the lazy tensor is all processes' parts.

    Each CPU tensor becomes a lazy tensor holding its transferred buffer; nothing is recorded, so
    this is safe to run on a background thread while the main thread traces.
    """
    index = torch.device(device or "lazy").index or 0
    if mesh is None:
        return _move(batch, lambda x: upload(x, index))
    spec = tuple(partition_spec or ())
    return _move(
        batch,
        lambda x: upload(x, index, None, mesh.placement(x, spec[: x.dim()], True), parts=True),
    )


def _move(x: Any, upload: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        if x.device.type == "lazy":
            return x
        x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        return upload(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_move(v, upload) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_move(v, upload) for v in x)
    if isinstance(x, collections.abc.Mapping):
        return type(x)({k: _move(v, upload) for k, v in x.items()})
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(
            x,
            **{f.name: _move(getattr(x, f.name), upload) for f in dataclasses.fields(x) if f.init},
        )
    return x


class DeviceLoader:
    """Iterate ``loader`` (any iterable of batches, e.g. a ``torch.utils.data.DataLoader``) with
    every batch already on ``device``.

    A background thread pulls batches and starts their host-to-device transfers up to
    ``prefetch`` batches ahead, so loading and transfer overlap the training step. Errors raised
    by the loader surface in the consuming loop. With a ``mesh`` (lazy_torch.distributed.Mesh),
    each batch goes straight to its devices laid out as ``partition_spec`` (``("data", None)``:
    the batch dimension split over mesh axis "data"), each tensor by the spec's first entries.
    """

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str | None = None,
        prefetch: int = 2,
        *,
        mesh: Any = None,
        partition_spec: Sequence[Any] | None = None,
    ):
        if (mesh is None) != (partition_spec is None):
            raise ValueError("DeviceLoader takes a mesh and a partition_spec together")
        self.loader = loader
        self.device = device
        self.prefetch = max(1, int(prefetch))
        self.mesh, self.partition_spec = mesh, partition_spec

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        batches: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    batches.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for batch in self.loader:
                    with prefetching:
                        moved = to_device(batch, self.device, self.mesh, self.partition_spec)
                        ids = _storage_ids(moved)
                        prefetched.update(ids)
                    if not put((moved, ids)):
                        _handed_over(ids)
                        return
                put(_END)
            except BaseException as e:  # handed to the consumer, raised there
                put(e)

        thread = threading.Thread(target=produce, name="lazy-device-loader", daemon=True)
        thread.start()
        try:
            while True:
                item = batches.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                _handed_over(item[1])
                yield item[0]
        finally:
            stop.set()
            thread.join(timeout=5)
            while not batches.empty():  # batches never handed over: their ids go too
                item = batches.get_nowait()
                if type(item) is tuple:
                    _handed_over(item[1])
