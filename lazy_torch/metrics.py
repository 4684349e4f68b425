"""Public metrics: counters (names in DESIGN.md), timings and fallback call sites."""

from runtime.metrics import counters, report, reset

__all__ = ["counters", "report", "reset"]
