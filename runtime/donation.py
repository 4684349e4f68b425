"""Which buffers an executable takes over for its outputs: donated parameters and spare buffers.

A donated parameter is a buffer the graph reads for the last time (the caller decides which).
A spare is an output of the device's previous full barrier that nothing holds any more, such as
the gradients that ``zero_grad()`` set to None: it is passed as one more, unused, donated argument,
so the output of the same shape and dtype is written into it instead of a new allocation.

Spares keep a training loop's outputs in the same buffers step after step. That is what lets
XLA's GPU runtime replay its command buffer (a CUDA graph of the whole step) without re-recording
the kernels that write or read a moved buffer: on an H200, GPT-2 124M's step re-recorded 151
changed allocations in 3.4-5.4 ms a call, against one allocation and 0.4-0.6 ms for the same
step written in JAX, whose loop donates everything it replaces. A dead output is kept from its
barrier until the next one, where it is reused or released.
"""

from __future__ import annotations

import collections

from lazy_core.graph import Graph
from lazy_core.ir import DATA
from runtime.launcher import failed

Slot = tuple[tuple[int, ...], str]  # (shape, dtype)


class Offer:
    """Spare buffers offered to one execution: their values, their slots, and the root each one
    was the output of (by spare index) when the graph is the one that made them."""

    __slots__ = ("roots", "slots", "values")

    def __init__(self, values: list, slots: list[Slot], roots: dict[int, int]):
        self.values, self.slots, self.roots = values, slots, roots

    def for_roots(self, graph: Graph, roots: tuple[int, ...]) -> list[int | None]:
        """The spare to give each of ``roots`` (root indices of ``graph``), by offer index: the
        buffer that root wrote last time if it is offered, else an unused one of its slot, else
        None (the caller makes a new buffer)."""
        by_root = {k: j for j, k in self.roots.items()}
        picks: list[int | None] = []
        used: set[int] = set()
        for k in roots:
            j = by_root.get(k)
            if j is None or j in used:
                want = (graph.roots[k].shape, graph.roots[k].dtype)
                j = next((i for i, s in enumerate(self.slots) if s == want and i not in used), None)
            if j is not None:
                used.add(j)
            picks.append(j)
        return picks


class Spares:
    """The outputs of each device's last full barrier, kept to be offered to its next one, and
    which roots of each graph write into spares.

    Spare arguments change an executable, so a graph gets them only at its first compile, and
    its later runs pass spares to the same roots: a new buffer where no dead one of its shape
    and dtype is left (the output a loop now keeps, such as a loss it collects). A graph first
    compiled without spares (a loop whose first step is its steady one) keeps running without
    them rather than compile a second time.
    """

    def __init__(self) -> None:
        # device -> (graph key, outputs in root order, each output's slot)
        self._last: dict[int, tuple[int, list, tuple[Slot, ...]]] = {}
        self._slots: dict[int, tuple[Slot, ...]] = {}  # graph key -> its roots' slots
        self.roots: dict[int, tuple[int, ...]] = {}  # graph key -> the roots given spares

    def remember(self, device: int, graph: Graph, outputs: list) -> None:
        slots = self._slots.get(graph.key)
        if slots is None:
            if len(self._slots) >= 1024:
                self._slots.clear()
            slots = self._slots[graph.key] = tuple((r.shape, r.dtype) for r in graph.roots)
        self._last[device] = (graph.key, outputs, slots)

    def offer(self, device: int, graph: Graph, held: set[int], kept: set[int]) -> Offer | None:
        """The last barrier's outputs on ``device`` that no live storage holds (``held``), this
        graph does not read, and the runtime does not keep (``kept``: buffer ids), with a slot
        some root of ``graph`` has; the rest are released."""
        last = self._last.pop(device, None)
        if last is None:
            return None
        key, outputs, slots = last
        if failed(outputs[0]):  # their launch raised: there are no buffers
            return None
        same = key == graph.key
        wanted = None if same else {(r.shape, r.dtype) for r in graph.roots}
        read = {id(p.payload) for p in graph.params if p.op == DATA}
        values, offered, roots = [], [], {}
        for k, value in enumerate(outputs):
            ident = id(value)
            if ident in held or ident in read or ident in kept:
                continue
            if wanted is not None and slots[k] not in wanted:
                continue
            if same:
                roots[len(values)] = k
            values.append(value)
            offered.append(slots[k])
        return Offer(values, offered, roots) if values else None


def pairing(
    graph: Graph,
    donate: tuple[int, ...],
    partners: dict[int, int],
    spare_slots: tuple[Slot, ...] = (),
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """The donated buffers to keep, and the order the executable returns its roots in (None:
    their own), so that each donated buffer goes to its partner root.

    ``donate`` lists parameter indices, then spares as ``len(graph.params) + j`` for
    ``spare_slots[j]`` (their arguments come after the parameters'). JAX pairs each output, in
    order, with the first unused donated argument of its shape and dtype. So, for each donated
    buffer in argument order, the order lists its partner, or else the next root of its shape and
    dtype that no buffer claims; a buffer left with neither is not donated (it would take a later
    buffer's partner). Every other root follows. A root claimed by two buffers (two storages
    given one value) goes to the first.
    """
    roots, params = graph.roots, graph.params
    n_params = len(params)

    def slot(i: int) -> Slot:
        return (params[i].shape, params[i].dtype) if i < n_params else spare_slots[i - n_params]

    owner: dict[int, int] = {}
    for i in donate:
        k = partners.get(i)
        if k is not None and k not in owner and (roots[k].shape, roots[k].dtype) == slot(i):
            owner[k] = i
    unclaimed: dict[Slot, collections.deque] = collections.defaultdict(collections.deque)
    for k, r in enumerate(roots):
        if k not in owner:
            unclaimed[(r.shape, r.dtype)].append(k)
    kept, order = [], []
    for i in donate:
        k = partners.get(i)
        if k is None or owner.get(k) != i:
            queue = unclaimed.get(slot(i))
            k = queue.popleft() if queue else None
        if k is not None:
            kept.append(i)
            order.append(k)
    placed = set(order)
    order += [k for k in range(len(roots)) if k not in placed]
    return tuple(kept), (None if order == list(range(len(roots))) else tuple(order))


class Pairings:
    """``pairing`` by graph key, donated buffers and spare slots, redone when the partners
    change."""

    def __init__(self) -> None:
        self._found: dict[tuple, tuple[dict[int, int], tuple]] = {}

    def __call__(
        self,
        graph: Graph,
        donate: tuple[int, ...],
        partners: dict[int, int],
        spare_slots: tuple[Slot, ...],
    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        key = (graph.key, donate, spare_slots)
        found = self._found.get(key)
        if found is not None and found[0] == partners:
            return found[1]
        if len(self._found) >= 1024:
            self._found.clear()
        result = pairing(graph, donate, partners, spare_slots)
        self._found[key] = (partners, result)
        return result
