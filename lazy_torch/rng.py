"""Device RNG state: raw PRNG key data per device, threaded through graphs as a parameter.

Each random op of a step draws key ``fold_in(state, i)`` for its position ``i`` in the step; at
the barrier the state advances once. The state is device data, never a constant, so every step
gets fresh values without recompiling, and ``manual_seed`` makes sequences reproducible.
"""

from __future__ import annotations

import runtime
from lazy_core import Node, Operand, Storage, data_leaf

_ADVANCE = "lazy.rng_advance"


class _DeviceRng:
    __slots__ = ("draws", "storage")

    def __init__(self, device: int, seed: int):
        state = runtime.rng_state(seed)
        buffer = runtime.to_device(state, device)
        self.storage = Storage(data_leaf(buffer, state.dtype.name, state.shape), device)
        self.draws = 0


_states: dict[int, _DeviceRng] = {}
_seed = 0


def manual_seed(seed: int) -> None:
    """Reset the RNG of every lazy device to ``seed``.

    >>> import torch, lazy_torch
    >>> lazy_torch.manual_seed(0); a = torch.rand(3, device="lazy").tolist()
    >>> lazy_torch.manual_seed(0); b = torch.rand(3, device="lazy").tolist()
    >>> a == b
    True
    """
    global _seed
    _seed = int(seed)
    _states.clear()


def draw(device: int) -> tuple[Node, int]:
    """The state node and draw index for the next random op on ``device``."""
    rng = _states.get(device)
    if rng is None:
        rng = _states[device] = _DeviceRng(device, _seed + device)
    index = rng.draws
    rng.draws += 1
    return rng.storage.node, index


def advance() -> None:
    """At a barrier: move every state that was drawn from this step past all of its draws."""
    for rng in _states.values():
        if rng.draws:
            state = rng.storage.node
            arg = ((Operand(0), rng.draws), ())
            rng.storage.set(Node(_ADVANCE, (state,), arg, state.dtype, state.shape))
            rng.draws = 0
