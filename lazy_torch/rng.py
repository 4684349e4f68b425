"""Device RNG state: a byte vector per device (a PRNG key and a draw counter), threaded through
graphs as a parameter.

Each random op of a step draws from the state with its position ``i`` in the step (key
``fold_in(key, counter + i)``, lowerings/random.py). At the barrier the state re-keys once; a
partial sync (``.cpu()``, ``.item()``) moves the counter past the draws made so far and makes the
state device data again, so an observation loop of random draws replays one graph, and the values
drawn do not depend on where a step was observed. The state is device data, never a constant, so
every step gets fresh values without recompiling, and ``manual_seed`` makes sequences reproducible.
"""

from __future__ import annotations

import runtime
from lazy_core import Node, Operand, Storage, data_leaf

_ADVANCE = "lazy.rng_advance"  # a new key past ``draws`` draws, counter 0
_SKIP = "lazy.rng_skip"  # the same key, counter moved past ``draws`` draws


class _DeviceRng:
    __slots__ = ("draws", "storage")

    def __init__(self, device: int, seed: int):
        state = runtime.rng_state(seed)
        buffer = runtime.to_device(state, device)
        self.storage = Storage(data_leaf(buffer, state.dtype.name, state.shape), device)
        self.draws = 0

    def moved(self, op: str) -> Node:
        """The state past this step's draws so far: ``op`` of the current state, or the state."""
        state = self.storage.node
        if not self.draws:
            return state
        return Node(op, (state,), ((Operand(0), self.draws), ()), state.dtype, state.shape)


_states: dict[int, _DeviceRng] = {}
_seed = 0


def manual_seed(seed: int) -> None:
    """Reset the RNG of every lazy device: device ``i`` starts from seed ``seed + i``.

    ``torch.manual_seed(seed)`` does this too.

    >>> import torch, lazy_torch
    >>> lazy_torch.manual_seed(0); a = torch.rand(3, device="lazy").tolist()
    >>> lazy_torch.manual_seed(0); b = torch.rand(3, device="lazy").tolist()
    >>> a == b
    True
    """
    global _seed
    _seed = int(seed)
    _states.clear()


def initial_seed() -> int:
    """The seed of the last ``manual_seed`` (0 before any)."""
    return _seed


def _rng(device: int) -> _DeviceRng:
    rng = _states.get(device)
    if rng is None:
        rng = _states[device] = _DeviceRng(device, _seed + device)
    return rng


def draw(device: int) -> tuple[Node, int]:
    """The state node and draw index for the next random op on ``device``."""
    rng = _rng(device)
    index = rng.draws
    rng.draws += 1
    return rng.storage.node, index


def get_state(device: int) -> Node:
    """The state of ``device`` as it stands (pending IR or device data); the draws go on as if it
    had not been read."""
    return _rng(device).moved(_SKIP)


def set_state(device: int, state: Node) -> None:
    """Make ``state`` (a node of ``get_state``'s shape and dtype) the state of ``device``."""
    rng = _rng(device)
    rng.storage.set(state)
    rng.draws = 0


def state_shape(device: int) -> tuple[int, ...]:
    """The shape of the state of ``device`` (a uint8 vector)."""
    return _rng(device).storage.node.shape


def advance() -> None:
    """At a barrier: re-key every state that was drawn from this step."""
    for device in _states:
        rekey(device)


def rekey(device: int) -> None:
    """Re-key the state of ``device`` (made if missing) where it was drawn from since: later
    draws start a sequence of their own. A loop body ends with it, so the state is a carry of
    the loop and each iteration draws anew (control_flow.py)."""
    rng = _rng(device)
    if rng.draws:
        rng.storage.set(rng.moved(_ADVANCE))
        rng.draws = 0


def settle(device: int) -> Storage | None:
    """At a partial sync on ``device``: the state's storage, moved past the draws so far, if it
    has a value to compute (the sync makes it device data); None when it is data already."""
    rng = _states.get(device)
    if rng is None or not (rng.draws or rng.storage.pending):
        return None
    rng.storage.set(rng.moved(_SKIP))
    rng.draws = 0
    return rng.storage
