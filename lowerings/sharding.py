"""``lazy.shard``: a value constrained to a placement on the graph's mesh inside a program.

A placement is ``(mesh key, spec)`` (runtime/spmd.py defines both); the runtime lowers a graph
that holds one with the graph's ``jax.sharding.Mesh`` in ``ctx.mesh``, and GSPMD (XLA's SPMD
partitioner) partitions the program around the constraint and inserts the collectives.
"""

from __future__ import annotations

import jax

from lowerings.registry import lowering


@lowering("lazy.shard")
def _shard(ctx, x, placement):
    _, spec = placement
    if ctx.mesh is None:
        raise ValueError("lazy.shard lowered outside a graph on a mesh")
    sharding = jax.sharding.NamedSharding(ctx.mesh, jax.sharding.PartitionSpec(*spec))
    return jax.lax.with_sharding_constraint(x, sharding)
