"""Storages: the current IR value of each live buffer, and the registry of live ones."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from lazy_core.ir import DATA, Node, _native, data_leaf

# The Python twin's registry: weak references to live storages by id. Dead entries are swept in
# bulk (when the registry has doubled, and before every walk) instead of by a callback per
# storage, which would cost a Python call on every tensor's death.
_live: dict[int, weakref.ref] = {}
_ids = itertools.count()
_SWEEP_MIN = 4096
_sweep_at = _SWEEP_MIN


def _sweep() -> None:
    global _sweep_at
    for key in [k for k, ref in _live.items() if ref() is None]:
        del _live[key]
    _sweep_at = max(_SWEEP_MIN, 2 * len(_live))


class PyStorage:
    """The current value of one buffer. In-place updates replace ``node``; the object stays.

    Storages register themselves so a barrier can find every live value with pending IR; a
    storage nobody references disappears from the registry and never becomes a graph output.
    ``node`` is read freely but written only through ``set``, which also drops the Access nodes
    cached for views of the old value (so no stale graph or device buffer outlives its value).

    The C extension's Storage (lazy_core/csrc/storage.cpp) is the one used when it is built: the
    same attributes and registry without a weak reference per storage, and outside the cycle
    collector. This twin registers weakly and sweeps dead entries in bulk.
    """

    __slots__ = ("__weakref__", "buffer_id", "device", "id", "node", "views")

    def __init__(self, node: Node, device: Any):
        self.node = node
        self.device = device
        self.id = next(_ids)
        self.views: dict[tuple, Node] | None = None  # view steps -> Access node of ``node``
        # id() of the device buffer the value last was (at an upload or a barrier): a barrier that
        # donates that buffer gives it this storage's new value. An id only: no buffer kept alive.
        self.buffer_id = id(node.payload) if node.op == DATA else None
        _live[self.id] = weakref.ref(self)
        if len(_live) >= _sweep_at:
            _sweep()

    # A storage is also the view of itself with no steps, so a tensor that is not a view holds
    # its storage directly (one object fewer to make and free per traced op).
    steps: tuple = ()
    writable = True

    @property
    def storage(self) -> Storage:
        return self

    def assign(self, value: Node) -> None:
        self.set(value)

    def then(self, step: Any) -> PyView:
        return PyView(self, (step,))

    def set(self, node: Node) -> None:
        self.node = node
        self.views = None
        if node.op == DATA:
            self.buffer_id = id(node.payload)

    @property
    def pending(self) -> bool:
        """True while the value is an unexecuted computation rather than a device buffer."""
        return self.node.op != DATA

    def __repr__(self) -> str:
        return f"Storage#{self.id}({self.node!r})"


def _py_live_storages() -> list[PyStorage]:
    """Live storages in creation order (a deterministic order keeps graph keys stable)."""
    _sweep()
    return [s for s in (ref() for ref in list(_live.values())) if s is not None]


def _py_pending_and_held() -> tuple[list[PyStorage], set[int]]:
    """In one pass: the live storages whose value is pending IR, and the ids of the device
    buffers that the others hold as their values."""
    pending, held = [], set()
    for s in _py_live_storages():
        node = s.node
        if node.op != DATA:
            pending.append(s)
        else:
            held.add(id(node.payload))
    return pending, held


# A barrier's bookkeeping, per storage or parameter of the graph it cut (sync.py).


def _py_settle(storages: list, roots: tuple, outputs: Any) -> None:
    """After a graph ran: each storage's value becomes the output buffer of its root (its current
    node; ``roots[k]`` computed ``outputs[k]``), as a data leaf."""
    buffers = {id(r): b for r, b in zip(roots, outputs)}
    for s in storages:
        root = s.node
        s.set(data_leaf(buffers[id(root)], root.dtype, root.shape))


def _py_buffer_partners(storages: list, params: tuple, donated: tuple, roots: tuple) -> dict:
    """Donated parameter index -> index of the root of the new value of the storage that last
    held the parameter's buffer (the last such storage, where two held one buffer)."""
    by_buffer = {id(params[i].payload): i for i in donated}
    root_index = {id(r): k for k, r in enumerate(roots)}
    partners = {}
    for s in storages:
        i = by_buffer.get(s.buffer_id)
        if i is not None:
            partners[i] = root_index[id(s.node)]
    return partners


def _py_unheld(params: tuple, candidates: tuple, counts: tuple, held: set) -> tuple[int, ...]:
    """The ``candidates`` ((parameter index, slot index) pairs) whose buffer no live storage
    holds (``held``: buffer ids), in order, at most ``counts[slot]`` of each slot."""
    free = list(counts)
    out = []
    for i, slot in candidates:
        if free[slot] > 0 and id(params[i].payload) not in held:
            free[slot] -= 1
            out.append(i)
    return tuple(out)


# The C types and functions when the extension is built (the same contracts as the twins above).
if _native is not None:
    Storage: Any = _native.Storage
    live_storages, pending_and_held = _native.live_storages, _native.pending_and_held
    settle, buffer_partners, unheld = _native.settle, _native.buffer_partners, _native.unheld
else:
    Storage = PyStorage
    live_storages, pending_and_held = _py_live_storages, _py_pending_and_held
    settle, buffer_partners, unheld = _py_settle, _py_buffer_partners, _py_unheld


def pending_storages(device: Any = None) -> list[Storage]:
    """Live storages whose value is pending IR, optionally only those on ``device``."""
    return [
        s for s in live_storages() if s.node.op != DATA and (device is None or s.device == device)
    ]


from lazy_core.view import PyView  # last: view.py builds on this module
