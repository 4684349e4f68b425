"""Counters, timings, sizes, call sites and graph events of the runtime and the front end.

Everything here is cheap enough to stay on in production: a counter is a dict increment, a timing
a deque append, and memory stays bounded however long training runs: each timing and size keeps
its last ``SAMPLES`` values for percentiles, with the count and total of all of them. Graph
events (one per compile and per execution) go to listeners: the LAZY_DEBUG printer and
``lazy_torch.debug.explain``.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from lazy_core.graph import key_text

SAMPLES = 10_000  # values kept per timing and size (a step records about five)


class _Samples:
    """The last ``SAMPLES`` values of a distribution, and the count and total of every value."""

    __slots__ = ("n", "recent", "total")

    def __init__(self) -> None:
        self.recent: collections.deque = collections.deque(maxlen=SAMPLES)
        self.n = 0
        self.total = 0.0

    def add(self, value: float) -> None:
        self.recent.append(value)
        self.n += 1
        self.total += value


_counters: collections.Counter[str] = collections.Counter()
_timings: dict[str, _Samples] = collections.defaultdict(_Samples)
_sizes: dict[str, _Samples] = collections.defaultdict(_Samples)
_sites: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
_recompiles: dict[str, list[str]] = collections.defaultdict(list)


def count(name: str, n: int = 1) -> None:
    _counters[name] += n


def time(name: str, seconds: float) -> None:
    _timings[name].add(seconds)


def size(name: str, n: int) -> None:
    """A non-time distribution (graph sizes in nodes, transfer sizes in bytes)."""
    _sizes[name].add(n)


def site(kind: str, where: str) -> None:
    """Remember a user call site for ``kind`` (e.g. ``fallback::aten.nonzero.default``)."""
    _sites[kind][where] += 1


def counters() -> dict[str, int]:
    return dict(_counters)


def timings() -> dict[str, list[float]]:
    """The last ``SAMPLES`` seconds of each timing, oldest first."""
    return {k: list(v.recent) for k, v in _timings.items()}


def sizes() -> dict[str, list[int]]:
    """The last ``SAMPLES`` values of each size, oldest first."""
    return {k: list(v.recent) for k, v in _sizes.items()}


def sites() -> dict[str, dict[str, int]]:
    """User call sites (``file:line`` -> times) of every fallback op and sync cause."""
    return {k: dict(v) for k, v in _sites.items()}


def reset() -> None:
    _counters.clear()
    _timings.clear()
    _sizes.clear()
    _sites.clear()
    _recompiles.clear()


# ----------------------------------------------------------------------------------------------
# Graph events.


@dataclass(frozen=True)
class GraphEvent:
    """One compile or one execution of a graph.

    ``cause`` is what cut the graph (mark_step, item, print, cpu, fallback, ...); ``site`` the
    user's ``file:line`` that caused it. A compile's ``seconds`` is its compile time and ``cache``
    says ``"miss"`` (XLA compiled) or ``"persistent"`` (loaded from LAZY_CACHE_DIR); an execution's
    ``seconds`` is its host dispatch time and ``cache`` is ``"hit"`` or ``"new"``, or ``"reuse"``
    for a parameter-free graph whose earlier results were reused (nothing ran), or ``"host"`` for
    a small read that eager PyTorch computed on the host (lazy_torch/host_reads.py). ``reason`` says
    why a site that compiled before compiled again.
    """

    kind: str
    cause: str
    site: str
    key: int
    nodes: int
    seconds: float
    cache: str
    reason: str | None = None

    @property
    def graph(self) -> str:
        return key_text(self.key)

    def line(self) -> str:
        head = (
            f"[lazy] {self.kind:7s} graph {self.graph} ({self.nodes} nodes) "
            f"cause={self.cause} at {self.site}"
        )
        if self.kind == "compile":
            what = "persistent cache hit" if self.cache == "persistent" else "compiled"
            tail = f"{what} in {self.seconds * 1e3:.1f} ms"
            if self.reason:
                tail += f"; recompile: {self.reason}"
        elif self.cache == "reuse":
            tail = "parameter-free: its earlier results reused"
        elif self.cache == "host":
            tail = f"computed on the host by eager PyTorch in {self.seconds * 1e3:.2f} ms"
        else:
            tail = f"{'cache hit' if self.cache == 'hit' else 'new executable'}, dispatched in "
            tail += f"{self.seconds * 1e3:.2f} ms"
        return f"{head}: {tail}"


_listeners: list[Callable[[GraphEvent], None]] = []


def listen(fn: Callable[[GraphEvent], None]) -> Callable[[], None]:
    """Call ``fn`` with every graph event from now on; returns the function that stops it."""
    _listeners.append(fn)
    return lambda: _listeners.remove(fn)


def listening() -> bool:
    return bool(_listeners)


def event(e: GraphEvent) -> None:
    if e.reason:
        _recompiles[e.site].append(e.reason)
    for fn in tuple(_listeners):  # a listener may stop itself
        fn(e)


# ----------------------------------------------------------------------------------------------
# The report.


def _pick(v: list, q: float):
    return v[min(len(v) - 1, int(q * len(v)))]


def _distribution(samples: _Samples, scale: float, unit: str, digits: int) -> str:
    v = sorted(samples.recent)
    if not v:
        return "-"

    def f(x: float) -> str:
        return f"{x * scale:.{digits}f}{unit}"

    window = "" if samples.n == len(v) else f" (percentiles of the last {len(v)})"
    return (
        f"n={samples.n} total={f(samples.total)}{window} median={f(statistics.median(v))} "
        f"p90={f(_pick(v, 0.9))} p99={f(_pick(v, 0.99))} max={f(v[-1])}"
    )


def _site_lines(kinds: dict[str, collections.Counter[str]], top: int = 5) -> list[str]:
    lines = []
    for kind, where in sorted(kinds.items()):
        lines.append(f"  {kind}: {sum(where.values())}")
        lines += [f"    {n:6d}  {w}" for w, n in where.most_common(top)]
    return lines


def report() -> str:
    """Counters, timing and size percentiles, fallbacks and syncs with their user call sites, and
    the recompiles of each call site with their last cause, as text."""
    lines = ["Counters:"]
    lines += [f"  {k}: {v}" for k, v in sorted(_counters.items())]
    lines.append("Timings:")
    lines += [f"  {k}: {_distribution(v, 1e3, 'ms', 3)}" for k, v in sorted(_timings.items())]
    if _sizes:
        lines.append("Sizes:")
        lines += [f"  {k}: {_distribution(v, 1, '', 0)}" for k, v in sorted(_sizes.items())]
    for title, prefix in (
        ("Fallbacks", "fallback::"),
        ("Syncs", "syncs::"),
        ("Recaptures", "recaptures"),  # lazy_torch.compile: where, and which guards changed
    ):
        kinds = {k: v for k, v in _sites.items() if k.startswith(prefix)}
        if kinds:
            lines.append(f"{title} (count, then the top user call sites):")
            lines += _site_lines(kinds)
    if _recompiles:
        lines.append("Recompiles (call site: count, then the last cause):")
        for where, reasons in sorted(_recompiles.items()):
            lines += [f"  {where}: {len(reasons)}", f"    {reasons[-1]}"]
    return "\n".join(lines)
