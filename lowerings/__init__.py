"""Lowerings: one table from IR op name to a function emitting StableHLO through jax.numpy/jax.lax.

Importing this package fills ``LOWERINGS`` from the category modules. IR dtypes are exact
(int64 stays int64, float64 stays float64), so JAX's 64-bit mode is switched on here.
"""

import jax

jax.config.update("jax_enable_x64", True)

from lowerings.registry import LOWERINGS, LoweringContext, lowering  # noqa: E402
from lowerings import (  # noqa: E402, F401
    attention,
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
    sorting,
    special,
    windows,
)

__all__ = ["LOWERINGS", "LoweringContext", "lowering"]
