"""Public metrics: counters (names in DESIGN.md), timings and sizes with percentiles, and the user
call sites of fallbacks and syncs."""

from runtime.metrics import counters, report, reset, sites, sizes, timings

__all__ = ["counters", "report", "reset", "sites", "sizes", "timings"]
