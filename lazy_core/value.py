"""Storages: the current IR value of each live buffer, and the registry of live ones.

The types and the barrier's per-storage bookkeeping are C (lazy_core/csrc/storage.cpp), outside
the cycle collector and without a weak reference per storage:

- ``Storage(node, device)``: the current value of one buffer. In-place updates replace ``node``;
  the object stays. ``node`` is read freely but written only through ``set`` (or ``assign``),
  which also drops the Access nodes cached in ``views`` for views of the old value, so no stale
  graph or device buffer outlives its value. ``buffer_id`` is the id() of the device buffer the
  value last was (at an upload or a barrier): a barrier that donates that buffer gives it this
  storage's new value. ``pending``: the value is an unexecuted computation, not a device buffer.
  A storage is also the view of itself with no steps (``storage``, ``steps == ()``,
  ``writable``, ``then``), so a tensor that is not a view holds its storage directly.
- ``live_storages()``: live storages in creation order (a deterministic order keeps graph keys
  stable); a storage nobody references leaves the registry and never becomes a graph output.
- ``pending_and_held()``: in one pass, the live storages whose value is pending IR, and the ids
  of the device buffers that the others hold as their values.
- ``settle(storages, roots, outputs)``: after a graph ran, each storage's value becomes the output
  buffer of its root (its current node; ``roots[k]`` computed ``outputs[k]``), as a data leaf.
- ``buffer_partners(storages, params, donated, roots)``: donated parameter index -> index of the
  root of the new value of the storage that last held the parameter's buffer (the last such
  storage, where two held one buffer).
- ``unheld(params, candidates, counts, held)``: the ``candidates`` ((parameter index, slot index)
  pairs) whose buffer no live storage holds (``held``: buffer ids), in order, at most
  ``counts[slot]`` of each slot.
"""

from __future__ import annotations

from typing import Any

from lazy_core import _native
from lazy_core.ir import DATA

Storage: Any = _native.Storage
live_storages, pending_and_held = _native.live_storages, _native.pending_and_held
settle, buffer_partners, unheld = _native.settle, _native.buffer_partners, _native.unheld


def pending_storages(device: Any = None) -> list[Storage]:
    """Live storages whose value is pending IR, optionally only those on ``device``."""
    return [
        s for s in live_storages() if s.node.op != DATA and (device is None or s.device == device)
    ]
