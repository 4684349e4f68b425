"""Compile time of sorting graphs (sort, topk, kthvalue, median, mode) against an add graph.

PYTHONPATH=. python benchmarks/sort_compile.py [--runs 5] [--shapes 8x64,8x1024,16384]
    [--dtype float32] ["op" ...]

Every measurement is a fresh compile: the executable cache is dropped
(``runtime.executor.drop_cache()``) before each op is traced on a tensor already on the device,
and the time is the metrics' ``compile_time`` of its first ``.cpu()`` (lowering to StableHLO plus
XLA's compile). Rounds interleave every op with the add graph of the same shape, so drifts in the
host's speed reach all alike; each op's figure is the median over ``--runs`` rounds and its ratio
is taken against the add's median of the same run. Two JAX references show XLA's own cost for a
plain key: ``lax.sort`` with an index operand and ``lax.top_k``, jitted fresh each time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import torch
from jax import lax

import lazy_torch
from runtime import executor

OPS = {
    "add": lambda x: x + 1,
    "sort": lambda x: torch.sort(x),
    "sort descending": lambda x: torch.sort(x, descending=True),
    "sort stable": lambda x: torch.sort(x, stable=True),
    "sort dim=0": lambda x: torch.sort(x, dim=0),
    "argsort": lambda x: torch.argsort(x),
    "msort": lambda x: torch.msort(x),
    "topk 4": lambda x: torch.topk(x, min(4, x.shape[-1])),
    "topk n/2": lambda x: torch.topk(x, x.shape[-1] // 2),
    "topk 4 unsorted": lambda x: torch.topk(x, min(4, x.shape[-1]), sorted=False),
    "kthvalue 3": lambda x: torch.kthvalue(x, min(3, x.shape[-1])),
    "median": lambda x: torch.median(x),
    "median dim": lambda x: torch.median(x, -1),
    "nanmedian": lambda x: torch.nanmedian(x),
    "mode": lambda x: torch.mode(x),
}


def _jax_reference(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> float:
    spec = jax.ShapeDtypeStruct(shape, jnp.dtype(str(dtype).removeprefix("torch.")))

    def fn(x):
        if name == "jax lax.sort":
            index = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
            return lax.sort((x, index), dimension=x.ndim - 1, is_stable=True, num_keys=1)
        return lax.top_k(x, min(4, x.shape[-1]))

    start = time.perf_counter()
    jax.jit(fn).lower(spec).compile()
    return time.perf_counter() - start


def _compile_time(name: str, x: torch.Tensor) -> float:
    """Seconds the first sync of ``OPS[name](x)`` spends compiling, with every cache dropped."""
    executor.drop_cache()
    lazy_torch.metrics.reset()
    out = OPS[name](x)
    for t in out if isinstance(out, tuple) else (out,):
        t.cpu()
    return sum(lazy_torch.metrics.timings().get("compile_time", []))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", help=f"a subset of: {', '.join(OPS)}")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", default="8x64,8x1024,16384")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    names = ["add"] + [n for n in (args.ops or OPS) if n != "add"]
    refs = ["jax lax.sort", "jax lax.top_k"]
    print(f"XLA compile time per graph, {args.dtype}, medians of {args.runs} fresh compiles")
    print(f"{'shape':>8s}  {'op':18s} {'compile ms':>10s} {'x add':>7s}")
    for text in args.shapes.split(","):
        shape = tuple(int(n) for n in text.split("x"))
        x = (torch.randn(shape) * 4).to(dtype).to("lazy")  # some ties in low precisions
        lazy_torch.mark_step(wait=True)
        times: dict[str, list[float]] = {n: [] for n in names + refs}
        for _ in range(args.runs):
            for name in names:
                times[name].append(_compile_time(name, x))
            for name in refs:
                times[name].append(_jax_reference(name, shape, dtype))
        add = statistics.median(times["add"])
        for name, runs in times.items():
            ms = statistics.median(runs) * 1e3
            print(f"{text:>8s}  {name:18s} {ms:10.1f} {ms / 1e3 / add:7.1f}")


if __name__ == "__main__":
    main()
