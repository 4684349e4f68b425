"""Lowerings: one table from IR op name to a function emitting StableHLO through jax.numpy/jax.lax.

Importing this package fills ``LOWERINGS`` from the category modules. IR dtypes are exact
(int64 stays int64, float64 stays float64), so lowerings run in JAX's 64-bit mode: the runtime
switches it on for its own thread while it lowers, compiles, transfers and calls
(``runtime.device.x64``), and a user's own JAX code keeps its mode.
"""

from lowerings.registry import LOWERINGS, LoweringContext, lowering
from lowerings import (  # noqa: F401
    attention,
    collectives,
    creation,
    decompositions,
    elementwise,
    fft,
    foreach,
    linalg,
    linalg_solvers,
    losses,
    movement,
    convolution,
    indexing,
    normalization,
    optim,
    random,
    reduction,
    resampling,
    scatter,
    selection,
    sharding,
    sorting,
    special,
    windows,
)

__all__ = ["LOWERINGS", "LoweringContext", "lowering"]
