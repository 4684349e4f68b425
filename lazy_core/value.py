"""Storages: the current IR value of each live buffer, and the registry of live ones."""

from __future__ import annotations

import itertools
import weakref
from typing import Any

from lazy_core.ir import DATA, Node, _native

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


# The C types and registry when the extension is built (the same contracts as the twins above).
if _native is not None:
    Storage: Any = _native.Storage
    live_storages, pending_and_held = _native.live_storages, _native.pending_and_held
else:
    Storage = PyStorage
    live_storages, pending_and_held = _py_live_storages, _py_pending_and_held


def pending_storages(device: Any = None) -> list[Storage]:
    """Live storages whose value is pending IR, optionally only those on ``device``."""
    return [
        s for s in live_storages() if s.node.op != DATA and (device is None or s.device == device)
    ]


from lazy_core.view import PyView  # last: view.py builds on this module
