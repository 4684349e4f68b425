"""Graphs over a mesh of devices: placements, the mesh a graph runs on, and its arguments.

A placement says how one value is laid out over a mesh: ``(mesh key, spec)``. The mesh key is
``(device ids, shape, axis names)``: JAX device ids in row-major mesh order, the mesh's shape and
one name per mesh dimension. ``spec`` has one entry per dimension of the value: None (not split),
an axis name, or a tuple of two or more axis names (split over their product, major first); a
spec of Nones is the value replicated on every device of the mesh. Entries are ints, strs, None
and tuples of them only, so two placements are equal exactly when they are the same layout (no
1 == True or 8 == 8.0 between them), and executable keys hold them.

A graph runs on a mesh when a buffer it reads is laid out on one, when one of its outputs must
be (the placement of the storage it becomes), or when it constrains a value to one
(``lazy.shard``, lowerings/sharding.py). It is compiled with its arguments' shardings and its
outputs constrained to their storages' placements; GSPMD (XLA's SPMD partitioner) partitions the
program and inserts the collectives. A buffer on one device that such a graph reads is replicated
on the mesh first (once per buffer). All of one graph's placements name one mesh.

A graph holding collectives between the processes of a torch.distributed group
(lowerings/collectives.py) runs instead on each process's device of the group's mesh, with that
process's own values, under ``jax.shard_map`` (``Spmd.manual``).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from lazy_core.graph import Graph
from lazy_core.ir import DATA
from runtime import program
from runtime.device import global_devices, place
from runtime.launcher import resolve

MeshKey = tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]
Placement = tuple[MeshKey, tuple[Any, ...]]

SHARD = "lazy.shard"
# Collectives between the processes of a torch.distributed group (lowerings/collectives.py):
# their last argument is the group's mesh key.
COLLECTIVES = frozenset(
    ("lazy.all_reduce", "lazy.all_gather", "lazy.reduce_scatter", "lazy.broadcast")
)

# Whether a mesh was ever made in this process: until then no graph runs on one, and barriers
# skip looking at their buffers' layouts.
_active = [False]


def enable() -> None:
    _active[0] = True


def active() -> bool:
    """Whether a mesh was made in this process (until then, no value is on one)."""
    return _active[0]


class Spmd(NamedTuple):
    """How one graph runs on a mesh: the mesh, each parameter's placement (None for a number),
    each root's (None: as XLA's propagation lays it out), and the parameters whose buffers are
    on one device and are replicated for the call.

    A ``manual`` graph holds collectives between processes: it runs on each process's device
    of the group's mesh with that process's own values (``jax.shard_map``), every buffer it
    reads and writes being one process's, on one device."""

    mesh: MeshKey
    params: tuple[Placement | None, ...]
    roots: tuple[Placement | None, ...]
    moved: tuple[int, ...]
    manual: bool = False

    @property
    def key(self) -> tuple:
        return self.mesh, self.params, self.roots, self.manual


@functools.lru_cache(maxsize=64)
def mesh_of(key: MeshKey) -> jax.sharding.Mesh:
    """The JAX mesh of ``key`` over the platform's devices (every process's, when several)."""
    ids, shape, names = key
    by_id = {d.id: d for d in global_devices()}
    return jax.sharding.Mesh(np.array([by_id[i] for i in ids], dtype=object).reshape(shape), names)


@functools.lru_cache(maxsize=4096)
def sharding_of(placement: Placement) -> jax.sharding.NamedSharding:
    mesh, spec = placement
    return jax.sharding.NamedSharding(mesh_of(mesh), jax.sharding.PartitionSpec(*spec))


def replicated(mesh: MeshKey) -> jax.sharding.NamedSharding:
    """Every device of ``mesh`` holding the whole value."""
    return sharding_of((mesh, ()))


def placement_of(buffer: Any) -> Placement | None:
    """The placement of a device buffer; None for one on a single device."""
    return placement_of_sharding(buffer.sharding, buffer.ndim)


def placement_of_sharding(sharding: Any, ndim: int) -> Placement | None:
    """The placement of a value of ``ndim`` dimensions laid out as ``sharding``."""
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        return None
    return _placement(sharding, ndim)


@functools.lru_cache(maxsize=4096)
def _placement(sharding: Any, ndim: int) -> Placement:
    if not isinstance(sharding, jax.sharding.NamedSharding):
        raise TypeError(f"a buffer laid out by a {type(sharding).__name__}, not on a mesh")
    mesh = sharding.mesh
    key = (
        tuple(int(d.id) for d in mesh.devices.flat),
        tuple(int(n) for n in mesh.devices.shape),
        tuple(str(a) for a in mesh.axis_names),
    )
    spec = tuple(map(_entry, sharding.spec))
    return key, spec + (None,) * (ndim - len(spec))


def _entry(e: Any) -> Any:
    if e is None or isinstance(e, str):
        return e
    names = tuple(str(a) for a in e)
    return names[0] if len(names) == 1 else (names or None)


def layout(graph: Graph, placements: tuple | None) -> Spmd | None:
    """How ``graph`` runs on a mesh, given the placements its roots' storages keep (None each,
    or all); None when it runs on its device alone."""
    if not _active[0]:
        return None
    meshes, groups = _meshes_of(graph)
    meshes = set(meshes)
    params: list[Placement | None] = []
    for p in graph.params:
        found = placement_of(resolve(p.payload)) if p.op == DATA else None
        if found is not None:
            meshes.add(found[0])
        params.append(found)
    roots = placements or (None,) * len(graph.roots)
    meshes.update(p[0] for p in roots if p is not None)
    data = tuple(i for i, p in enumerate(graph.params) if p.op == DATA)
    if groups:
        if len(groups) > 1 or meshes:
            raise ValueError(
                "one graph holds collectives of two process groups, or collectives and values "
                f"laid out on a mesh ({', '.join(map(_describe, sorted(groups | meshes)))}): "
                "mark_step() between them"
            )
        (mesh,) = groups
        whole = [(mesh, (None,) * len(p.shape)) if p.op == DATA else None for p in graph.params]
        return Spmd(mesh, tuple(whole), (None,) * len(graph.roots), data, True)
    if not meshes:
        return None
    if len(meshes) > 1:
        raise ValueError(
            "one graph reads or writes tensors laid out on different meshes ("
            + "; ".join(_describe(m) for m in sorted(meshes))
            + "): lazy_torch.distributed.mark_sharding one of them onto the other's mesh"
        )
    mesh = meshes.pop()
    moved = tuple(i for i in data if params[i] is None)
    for i in moved:
        params[i] = (mesh, (None,) * len(graph.params[i].shape))
    return Spmd(mesh, tuple(params), tuple(roots), moved)


def _describe(mesh: MeshKey) -> str:
    ids, shape, names = mesh
    return f"devices {list(ids)} as {dict(zip(names, shape))}"


def _meshes_of(graph: Graph) -> tuple[frozenset, frozenset]:
    """The meshes ``graph``'s ``lazy.shard`` nodes name, and the process groups' of its
    collectives (per graph key: its nodes decide them)."""
    found = _named.get(graph.key)
    if found is None:
        if len(_named) >= 1024:
            _named.clear()
        shards: set = set()
        groups: set = set()
        _name_meshes(((n.op, n.arg) for n in graph.nodes), shards, groups)
        found = _named[graph.key] = (frozenset(shards), frozenset(groups))
    return found


def _name_meshes(entries: Any, shards: set, groups: set) -> None:
    """Add the meshes of ``entries`` ((op, arg) pairs) to ``shards`` and ``groups``, looking
    into the plans of captured regions (``program.CALL``) and control-flow bodies they run."""
    for op, arg in entries:
        if op == SHARD:
            shards.add(arg[0][1][0])
        elif op in COLLECTIVES:
            groups.add(arg[0][-1])
        else:  # a captured region's or a control-flow body's plan
            for key in program.regions(op, arg):
                plan, _ = program.called(key)
                _name_meshes(((e[0], e[1]) for e in plan), shards, groups)


_named: dict[int, tuple[frozenset, frozenset]] = {}


def arguments(spmd: Spmd, graph: Graph, values: list) -> list:
    """``values`` (the data parameters' buffers, in parameter order) with each one-device buffer
    replaced by its replica on the mesh."""
    moved = set(spmd.moved)
    out, k = list(values), 0
    for i, p in enumerate(graph.params):
        if p.op != DATA:
            continue
        if spmd.manual:  # this process's value, as its device's part of the group's
            buffer = resolve(out[k])
            out[k] = jax.make_array_from_single_device_arrays(
                buffer.shape, sharding_of(spmd.params[i]), [buffer]
            )
        elif i in moved:
            out[k] = replica(resolve(out[k]), spmd.params[i])
        k += 1
    return out


def replica(buffer: jax.Array, placement: Placement) -> jax.Array:
    """``buffer`` laid out as ``placement``, copied once per buffer while it lives."""
    key = (id(buffer), placement)
    found = _replicas.get(key)
    if found is None:
        found = _replicas[key] = put(buffer, placement)
        weakref.finalize(buffer, _replicas.pop, key, None)
    return found


_replicas: dict[tuple, jax.Array] = {}


def put(value: Any, placement: Placement) -> jax.Array:
    """A host array or device buffer laid out as ``placement`` (``device.place``)."""
    sharding = sharding_of(placement)
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return _reshard(sharding)(value)  # from one layout over processes to another
    return place(value, sharding)


@functools.lru_cache(maxsize=256)
def _reshard(sharding: jax.sharding.NamedSharding) -> Any:
    return jax.jit(lambda x: x, out_shardings=sharding)
