"""Which buffers an executable takes over for its outputs: donated parameters and spare buffers.

A donated parameter is a buffer the graph reads for the last time (the caller decides which).
A spare is an output of the device's previous full barrier that nothing holds any more, such as
the gradients that ``zero_grad()`` set to None: it is passed as one more, unused, donated argument,
so the output of the same shape and dtype is written into it instead of a new allocation.

Spares keep a training loop's outputs in the same buffers step after step. That is what lets
XLA's GPU runtime replay its command buffer (a CUDA graph of the whole step) without re-recording
the kernels that write or read a moved buffer, as it replays the same step written in JAX, whose
loop donates everything it replaces; without spares, every call re-records the step's many
changed allocations, which costs host time on each call (figures: benchmarks/RESULTS.md, "Spare
buffers"). A dead output is kept from its barrier until the next one, where it is reused or
released.
"""

from __future__ import annotations

import collections
import operator
from typing import Any, NamedTuple

import jax

from lazy_core.graph import Graph
from runtime.device import device
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
                want = _slot(graph.roots[k])
                j = next((i for i, s in enumerate(self.slots) if s == want and i not in used), None)
            if j is not None:
                used.add(j)
            picks.append(j)
        return picks


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
        return _slot(params[i]) if i < n_params else spare_slots[i - n_params]

    owner: dict[int, int] = {}
    for i in donate:
        k = partners.get(i)
        if k is not None and k not in owner and _slot(roots[k]) == slot(i):
            owner[k] = i
    unclaimed: dict[Slot, collections.deque] = collections.defaultdict(collections.deque)
    for k, r in enumerate(roots):
        if k not in owner:
            unclaimed[_slot(r)].append(k)
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


class Plan(NamedTuple):
    """What one execution takes over: the donated parameters it keeps, the order it returns its
    roots in (None: their own), and its spare arguments' slots, buffers and roots."""

    donate: tuple[int, ...]
    order: tuple[int, ...] | None
    spares: tuple[Slot, ...] = ()
    values: tuple = ()
    roots: tuple[int, ...] = ()


class Donations:
    """Plans each execution's donation, keeping what later plans need: the outputs of each
    device's last full barrier, to be offered to its next one as spares, the roots of each graph
    that get spares, and the pairings worked out so far.

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
        self._roots: dict[int, tuple[int, ...]] = {}  # graph key -> the roots given spares
        # (graph key, donated buffers, spare slots) -> the partners and the pairing for them
        self._pairings: dict[tuple, tuple[dict[int, int], tuple]] = {}

    def plan(
        self,
        graph: Graph,
        device_index: int,
        donate: tuple[int, ...],
        partners: dict[int, int] | None,
        held: set[int] | None,
        kept: set[int],
    ) -> Plan:
        """``donate`` (parameters) and their ``partners`` paired with roots, and at a full barrier
        (``held``: the buffer ids live storages hold) the spares of ``device_index``'s last
        one that are not ``kept`` by the runtime."""
        offer = None if held is None else self._offer(device_index, graph, held, kept)
        roots = self._roots.get(graph.key)
        if offer is None or roots == ():
            if not partners:
                return Plan(donate, None)
            return Plan(*self._pairing(graph, donate, partners, ()))
        if roots is None:  # a first compile: each spare to the root it wrote, or one of its slot
            picks: list[int | None] = list(range(len(offer.values)))
            targets = offer.roots
        else:
            picks, targets = offer.for_roots(graph, roots), dict(enumerate(roots))
        slots = tuple(
            offer.slots[j] if j is not None else _slot(graph.roots[targets[m]])
            for m, j in enumerate(picks)
        )
        n = len(graph.params)
        partners = {**(partners or {}), **{n + m: k for m, k in targets.items()}}
        kept_buffers, order = self._pairing(
            graph, (*donate, *range(n, n + len(picks))), partners, slots
        )
        at = order or range(len(graph.roots))  # kept buffer m goes to root at[m]
        spares = [(i - n, k) for i, k in zip(kept_buffers, at) if i >= n]
        return Plan(
            tuple(i for i in kept_buffers if i < n),
            order,
            tuple(slots[m] for m, _ in spares),
            tuple(
                blank(slots[m], device_index) if picks[m] is None else offer.values[picks[m]]
                for m, _ in spares
            ),
            tuple(k for _, k in spares),
        )

    def compiled(self, key: int, plan: Plan) -> None:
        """A graph was compiled to ``plan``: its later runs give spares to the same roots."""
        self._roots.setdefault(key, plan.roots)

    def remember(self, device_index: int, graph: Graph, outputs: list) -> None:
        """The outputs of a full barrier, to offer to the device's next one."""
        slots = self._slots.get(graph.key)
        if slots is None:
            if len(self._slots) >= 1024:
                self._slots.clear()
            slots = self._slots[graph.key] = tuple(_slot(r) for r in graph.roots)
        self._last[device_index] = (graph.key, outputs, slots)

    def _offer(
        self, device_index: int, graph: Graph, held: set[int], kept: set[int]
    ) -> Offer | None:
        """The last barrier's outputs on the device that no live storage holds (``held``), this
        graph does not read, and the runtime does not keep (``kept``: buffer ids), with a slot
        some root of ``graph`` has; the rest are released."""
        last = self._last.pop(device_index, None)
        if last is None:
            return None
        key, outputs, slots = last
        if failed(outputs[0]):  # their launch raised: there are no buffers
            return None
        same = key == graph.key
        wanted = None if same else {_slot(r) for r in graph.roots}
        # The buffers this graph reads (a scalar's payload is a number: no output has its id).
        read = set(map(id, map(_PAYLOAD, graph.params)))
        values, offered, roots = [], [], {}
        for k, (value, ident) in enumerate(zip(outputs, map(id, outputs))):
            if ident in held or ident in read or ident in kept:
                continue
            if wanted is not None and slots[k] not in wanted:
                continue
            if same:
                roots[len(values)] = k
            values.append(value)
            offered.append(slots[k])
        return Offer(values, offered, roots) if values else None

    def _pairing(
        self,
        graph: Graph,
        donate: tuple[int, ...],
        partners: dict[int, int],
        spare_slots: tuple[Slot, ...],
    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        """``pairing``, redone only when the partners change."""
        key = (graph.key, donate, spare_slots)
        found = self._pairings.get(key)
        if found is not None and found[0] == partners:
            return found[1]
        if len(self._pairings) >= 1024:
            self._pairings.clear()
        result = pairing(graph, donate, partners, spare_slots)
        self._pairings[key] = (partners, result)
        return result


_PAYLOAD = operator.attrgetter("payload")


def _slot(node: Any) -> Slot:
    return node.shape, node.dtype


def blank(slot: Slot, device_index: int) -> jax.Array:
    """A new buffer of ``slot`` on the device, for a spare argument no dead output fills."""
    shape, dtype = slot
    return jax.numpy.zeros(shape, jax.numpy.dtype(dtype), device=device(device_index))
