"""The closing line every example prints: throughput and the backend's compile/fallback counts."""

import lazy_torch


def print_summary(rate: float, unit: str) -> None:
    c = lazy_torch.metrics.counters()
    fallbacks = sum(v for k, v in c.items() if k.startswith("fallback::"))
    print(
        f"{rate:.1f} {unit} (steady state), compiles {c.get('compiles', 0)}, "
        f"cache hits {c.get('cache_hits', 0)}, fallbacks {fallbacks}"
    )
