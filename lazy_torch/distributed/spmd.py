"""SPMD over a mesh of devices: ``Mesh``, ``mark_sharding``, ``get_sharding`` and ``fsdp``.

A tensor's layout over devices belongs to its storage (``Storage.placement``, a plain tuple:
runtime/spmd.py). Views read it, in-place updates and optimizer steps keep it (a barrier
constrains the storage's new value to it), donation hands its buffer to the same layout, and a
barrier records the layout XLA gave every other value it computed, so a value never changes
layout between steps unless it is marked again. Reading a value (``.cpu()``, ``print``,
``state_dict()``, ``torch.save``) gathers it; ``copy_`` from the host (``load_state_dict``)
transfers straight into the storage's layout.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

import runtime
from lazy_core import Node, Operand, data_leaf
from lazy_torch.tensor import LazyTensor

SHARD = runtime.spmd.SHARD


class Mesh:
    """A logical grid of devices: ``device_ids`` (indices below ``lazy_torch.device_count()``,
    every process's devices in a multi-process run; in one process, lazy device indices), in
    row-major grid order, arranged as ``mesh_shape``, one name per grid dimension.

    >>> mesh = Mesh(range(1), (1,), ("data",))
    >>> mesh.shape()
    {'data': 1}
    """

    def __init__(
        self,
        device_ids: Iterable[int],
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ):
        ids = tuple(_index(i, "device id") for i in np.asarray(list(device_ids)).reshape(-1))
        shape = tuple(_index(n, "mesh dimension") for n in mesh_shape)
        names = tuple(f"dim{k}" for k in range(len(shape))) if axis_names is None else axis_names
        names = tuple(names)
        if math.prod(shape) != len(ids):
            raise ValueError(
                f"a mesh of shape {shape} holds {math.prod(shape)} devices, not "
                f"the {len(ids)} given"
            )
        if len(set(ids)) != len(ids):
            raise ValueError(f"a mesh names each device once: {list(ids)}")
        devices = runtime.global_devices()
        for i in ids:
            if not 0 <= i < len(devices):
                raise ValueError(
                    f"the mesh needs device {i}, but there are {len(devices)} "
                    f"(lazy_torch.device_count())"
                )
        if len(names) != len(shape) or not all(type(n) is str for n in names):
            raise ValueError(f"a mesh needs one axis name (a str) per dimension: {names!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"a mesh's axis names are distinct: {names!r}")
        self.device_ids, self.mesh_shape, self.axis_names = ids, shape, names
        self.key = (tuple(int(devices[i].id) for i in ids), shape, names)
        _meshes[self.key] = self
        runtime.spmd.enable()

    def placement(
        self, t: torch.Tensor, partition_spec: Sequence[Any], part: bool = False
    ) -> tuple:
        """The placement of ``t`` laid out on this mesh as ``partition_spec`` (checked); with
        ``part``, ``t`` is this process's part of the value (a ``DeviceLoader`` batch), whose
        dimensions the mesh's axes need not divide where they span several processes."""
        return placement(t, self, partition_spec, part and runtime.processes.process_count() > 1)

    def size(self) -> int:
        return len(self.device_ids)

    def shape(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return np.array(self.device_ids).reshape(self.mesh_shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"Mesh({list(self.device_ids)}, {self.mesh_shape}, {self.axis_names})"


# Mesh key -> the mesh last made with it, what ``get_sharding`` returns.
_meshes: dict[tuple, Mesh] = {}


def _index(v: Any, what: str) -> int:
    if isinstance(v, bool | np.bool_):
        raise TypeError(f"a {what} is an int, not {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"a {what} is an int, not {v!r}") from None


def placement(
    t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any], part: bool = False
) -> tuple:
    """The placement of ``t`` laid out on ``mesh`` as ``partition_spec`` (checked; a ``part``
    of a value over several processes is checked by JAX as it is put)."""
    spec = tuple(partition_spec)
    shape = tuple(t.shape)
    if len(spec) > len(shape):
        raise ValueError(
            f"partition spec {spec!r} has {len(spec)} entries for a tensor of {len(shape)} "
            f"dimensions {shape}"
        )
    entries, used = [], set()
    for dim, entry in enumerate(spec + (None,) * (len(shape) - len(spec))):
        names = _axes(entry, mesh)
        for name in names:
            if name in used:
                raise ValueError(f"mesh axis {name!r} is used twice in {spec!r}")
            used.add(name)
        ways = math.prod(mesh.shape()[n] for n in names)
        if shape[dim] % ways and not part:
            raise ValueError(
                f"dimension {dim} of a tensor of shape {shape} ({shape[dim]}) does not divide "
                f"over mesh axis {entry!r} of {ways} devices"
            )
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return mesh.key, tuple(entries)


def _axes(entry: Any, mesh: Mesh) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, tuple | list):
        return tuple(n for e in entry for n in _axes(e, mesh))
    if isinstance(entry, str):
        if entry not in mesh.axis_names:
            raise ValueError(f"unknown mesh axis {entry!r}: the mesh has {mesh.axis_names}")
        return (entry,)
    if isinstance(entry, int) and not isinstance(entry, bool):  # a mesh dimension's index
        if not 0 <= entry < len(mesh.axis_names):
            raise ValueError(f"mesh dimension {entry} out of range for a mesh of {mesh.shape()}")
        return (mesh.axis_names[entry],)
    raise TypeError(f"a partition spec entry is None, an axis name or a tuple of them: {entry!r}")


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """Lay ``t`` out on ``mesh``: dimension ``d`` split over the mesh axes ``partition_spec[d]``
    names (None: not split). A tensor holding device data is resharded now; pending IR gets a
    constraint, so the program computes it in that layout. Returns ``t``.
    """
    if not isinstance(t, LazyTensor):
        raise TypeError(f"mark_sharding takes a lazy tensor, not one on {t.device}")
    storage = t._lazy.storage
    if not _whole(t):
        raise ValueError(
            "mark_sharding lays out a whole tensor, not a view of one: mark the tensor it views"
        )
    where = placement(t, mesh, partition_spec)
    node = storage.node
    if storage.pending:
        storage.set(Node(SHARD, (node,), ((Operand(0), where), ()), node.dtype, node.shape))
    elif runtime.spmd.placement_of(runtime.resolve(node.payload)) != where:
        buffer = runtime.spmd.put(runtime.resolve(node.payload), where)
        storage.set(data_leaf(buffer, node.dtype, tuple(node.shape)))
    storage.placement = where
    return t


def _whole(t: LazyTensor) -> bool:
    """Whether ``t`` is its storage's whole value, not a view of it (a layout is a storage's)."""
    return not t._lazy.steps and tuple(t._lazy.storage.node.shape) == tuple(t.shape)


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Forget ``t``'s layout: its next computed value is laid out as XLA chooses."""
    if isinstance(t, LazyTensor):
        t._lazy.storage.placement = None
    return t


def get_sharding(t: torch.Tensor) -> tuple[Mesh, tuple] | None:
    """``(mesh, partition_spec)`` of a tensor laid out on a mesh; None for one on one device."""
    if not isinstance(t, LazyTensor):
        return None
    storage = t._lazy.storage
    where = storage.placement
    if where is None and not storage.pending:
        where = runtime.spmd.placement_of(runtime.resolve(storage.node.payload))
    if where is None:
        return None
    key, spec = where
    mesh = _meshes.get(key)
    if mesh is None:  # laid out by a barrier on a mesh made under other device indices
        return None
    return mesh, spec


def fsdp(module: torch.nn.Module, mesh: Mesh, axis: str = "fsdp") -> torch.nn.Module:
    """Shard every parameter of ``module`` over mesh axis ``axis`` along its first dimension
    that divides, and replicate the rest (buffers, parameters with no such dimension) on the
    mesh. Optimizer state made from the parameters afterwards takes their layout. Returns
    ``module``.

    As in ZeRO-3, a submodule's forward computes with its parameters gathered: a forward
    pre-hook gives it, under each sharded parameter's name, the parameter constrained to be
    whole on every device, whose gradient is constrained back to the parameter's layout (a
    reduce-scatter). Without that the partitioner may split the computation along the
    parameters' dimensions instead of the batch's and move the activations between devices,
    at a cost in memory and time (benchmarks/RESULTS.md, "GPT-2 124M bf16 on 4 H100s"). Each
    gradient, once accumulated, is laid out as its parameter."""
    ways = mesh.shape().get(axis)
    if ways is None:
        raise ValueError(f"unknown mesh axis {axis!r}: the mesh has {mesh.axis_names}")
    for p in module.parameters():
        dims = [d for d, n in enumerate(p.shape) if n % ways == 0 and n >= ways]
        spec = [None] * p.dim()
        if dims:
            spec[dims[0]] = axis
        mark_sharding(p, mesh, spec)
        if p.requires_grad and not hasattr(p, "_lazy_grad_layout"):
            p.register_post_accumulate_grad_hook(_lay_out_grad)
            p._lazy_grad_layout = True
    for b in module.buffers():
        if isinstance(b, LazyTensor):
            mark_sharding(b, mesh, [None] * b.dim())
    for m in module.modules():
        sharded = [
            name
            for name, p in m.named_parameters(recurse=False)
            if isinstance(p, LazyTensor)
            and any(e is not None for e in p._lazy.storage.placement[1])
        ]
        if sharded and not hasattr(m, "_lazy_gathered"):
            m._lazy_gathered = (mesh, tuple(sharded))
            m.register_forward_pre_hook(_gather_parameters)
            m.register_forward_hook(_release_parameters, always_call=True)
    return module


def _gather_parameters(module: torch.nn.Module, args: Any) -> None:
    mesh, names = module._lazy_gathered
    for name in names:
        p = module._parameters.get(name)
        if isinstance(p, LazyTensor):
            module.__dict__[name] = _Gathered.apply(p, mesh)  # found before _parameters


def _lay_out_grad(p: torch.Tensor) -> None:
    """Give ``p.grad`` its parameter's layout (what a gradient summed over two uses of a tied
    parameter would otherwise take from XLA)."""
    where, grad = p._lazy.storage.placement, p.grad
    if not isinstance(grad, LazyTensor) or where is None:
        return
    if not _whole(grad):
        grad = p.grad = grad.clone()  # a view (of a bias's summed gradient)
    mark_sharding(grad, _meshes[where[0]], where[1])


def _release_parameters(module: torch.nn.Module, args: Any, output: Any) -> None:
    for name in module._lazy_gathered[1]:
        module.__dict__.pop(name, None)


class _Gathered(torch.autograd.Function):
    """A sharded parameter whole on every device of ``mesh``; its gradient in the parameter's
    layout."""

    @staticmethod
    def forward(ctx: Any, p: torch.Tensor, mesh: Mesh) -> torch.Tensor:
        ctx.mesh, ctx.spec = mesh, p._lazy.storage.placement[1]
        return mark_sharding(p.detach().clone(), mesh, [None] * p.dim())

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return mark_sharding(grad.clone(), ctx.mesh, ctx.spec), None
