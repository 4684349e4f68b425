"""Counters, timings and fallback call sites of the runtime and the front end."""

from __future__ import annotations

import collections
import statistics
from collections.abc import Iterable

_counters: collections.Counter[str] = collections.Counter()
_timings: dict[str, list[float]] = collections.defaultdict(list)
_sites: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def count(name: str, n: int = 1) -> None:
    _counters[name] += n


def time(name: str, seconds: float) -> None:
    _timings[name].append(seconds)


def site(kind: str, where: str) -> None:
    """Remember a user call site for ``kind`` (e.g. ``fallback::aten.nonzero.default``)."""
    _sites[kind][where] += 1


def counters() -> dict[str, int]:
    return dict(_counters)


def timings() -> dict[str, list[float]]:
    return {k: list(v) for k, v in _timings.items()}


def reset() -> None:
    _counters.clear()
    _timings.clear()
    _sites.clear()


def _percentiles(values: Iterable[float]) -> str:
    v = sorted(values)
    if not v:
        return "-"
    p90 = v[min(len(v) - 1, int(0.9 * len(v)))]
    return (
        f"n={len(v)} total={sum(v) * 1e3:.2f}ms median={statistics.median(v) * 1e3:.3f}ms "
        f"p90={p90 * 1e3:.3f}ms max={v[-1] * 1e3:.3f}ms"
    )


def report() -> str:
    """Counters, timings and the call sites of fallbacks and syncs, as text."""
    lines = ["Counters:"]
    lines += [f"  {k}: {v}" for k, v in sorted(_counters.items())]
    lines.append("Timings:")
    lines += [f"  {k}: {_percentiles(v)}" for k, v in sorted(_timings.items())]
    if _sites:
        lines.append("Call sites:")
        for kind, where in sorted(_sites.items()):
            lines.append(f"  {kind}:")
            lines += [f"    {n:6d}  {w}" for w, n in where.most_common(5)]
    return "\n".join(lines)
