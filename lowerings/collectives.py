"""Collectives between the processes of a ``torch.distributed`` group (lazy_torch/distributed/
process_group.py): each process's value in, XLA's all-reduce, all-gather and reduce-scatter out.

The runtime runs a graph holding them once per process's device, under ``jax.shard_map`` over
the group's mesh (one device per process; ``group`` is its mesh key, runtime/spmd.py, whose one
axis the collective runs over): each lowering sees its process's own value. Gathers and
scatters concatenate and split along dimension 0, as ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from lowerings.registry import lowering

_REDUCE = {"sum": jax.lax.psum, "avg": jax.lax.psum, "max": jax.lax.pmax, "min": jax.lax.pmin}


def _size(axis: str) -> int:
    return jax.lax.psum(1, axis)


def _axis(group: tuple) -> str:
    _, _, (name,) = group
    return name


@lowering("lazy.all_reduce")
def _all_reduce(ctx, x, op, group):
    axis = _axis(group)
    if x.dtype == jnp.bool_:
        return _all_reduce(ctx, x.astype(jnp.int32), "max" if op == "sum" else op, group) > 0
    out = _REDUCE[op](x, axis)
    return out / _size(axis) if op == "avg" else out


@lowering("lazy.all_gather")
def _all_gather(ctx, x, group):
    return jax.lax.all_gather(x, _axis(group), axis=0, tiled=True)


@lowering("lazy.reduce_scatter")
def _reduce_scatter(ctx, x, op, group):
    axis = _axis(group)
    if op not in ("sum", "avg"):
        raise NotImplementedError(f"reduce_scatter with {op}")
    out = jax.lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
    return out / _size(axis) if op == "avg" else out


@lowering("lazy.broadcast")
def _broadcast(ctx, x, source, group):
    axis = _axis(group)
    wide = x.astype(jnp.int32) if x.dtype == jnp.bool_ else x
    mine = jnp.where(jax.lax.axis_index(axis) == source, wide, jnp.zeros_like(wide))
    out = jax.lax.psum(mine, axis)
    return out.astype(x.dtype)
