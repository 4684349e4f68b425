"""Workload suite: eager PyTorch vs device='lazy' (vs torch.compile on cuda) vs pure-JAX ceilings.

PYTHONPATH=. python benchmarks/suite.py [--steps 20] [--warmup 3] [--device cpu|cuda]
    [--size small|gpt2-124m] [--amp bf16]
    [--backends eager,lazy,lazy+compile,lazy+step,lazy+dynamo,jax]
    [--json benchmarks/results/NAME.json] [mlp cnn gpt2 bert]

Every workload runs a training step and an inference step (``model.eval()``, ``torch.no_grad()``)
on each backend in this one process, from the same initial weights and one fixed random batch
moved to the device before timing. After ``--warmup`` steps, ``--steps`` steps are each timed to
the end of their device work (lazy: ``mark_step()`` then ``wait_device_ops()``; cuda:
``torch.cuda.synchronize()``; jax: ``block_until_ready``) and the median is reported. Time to
first step (``first_step_s``) is the wall time from building the step (copying the model to the
device, wrapping it, making the optimizer) to the end of the first step, compiles included; the
first row of a process also pays its one-off costs, and later rows find whatever the process has
compiled and cached already. Lazy runs a new graph op by op and compiles it whole when it comes
back, so its steady program compiles in a later warm-up step: ``warmup_s`` (to the end of the last
warm-up step) shows that cost. Training rows keep the warm-up steps' losses (``losses``; the table
shows the last): the PyTorch backends start from the same weights and batch, so theirs should
agree (JAX's models draw weights of their own).

``lazy+compile`` and ``lazy+dynamo`` are the lazy backend with the model, once on 'lazy', wrapped
by ``lazy_torch.compile`` or ``torch.compile(model, backend="lazy")``, and ``lazy+step`` the lazy
backend with the whole step (``zero_grad``, forward and loss, ``backward``, ``opt.step()``; the
inference step) as one function under ``lazy_torch.compile``; everything below measured
for lazy is measured for them too (their rows also count ``captures``, which must stay 0 after
warm-up). A backend that raises (``torch.compile`` before the backend "lazy" is registered)
gets its error as its row.

For lazy it also reports: tracing time (host time from the step's start until mark_step is called),
host time (tracing plus mark_step's own host time, ``barrier_ms``), device time
(``metrics.timings()['execute_time']``), aten ops dispatched per step (counted once, outside the
timed steps; not for lazy+dynamo, see ``_count_ops``), microseconds per traced op, compiles during the timed steps (must be 0),
executions per step, CPU fallbacks (over all its steps) and syncs inside the timed steps
(``.item()`` and the like: each runs part of the step early and waits for it). The overlap figure
runs lazy training steps back to back (mark_step without waiting, one wait at the end): if tracing
step N+1 overlaps the device running step N, the step time is max(trace, device) rather than trace +
device. Every backend's training step is also timed that way ("b2b": the mean over ``--steps``
steps queued back to back and waited for once, as a training loop runs them), with the ratio to
JAX's: the synced figure charges lazy its whole tracing time, which a training loop hides under
the previous step's device work. The JSON keeps the overlap figures by workload and backend
(``results[workload]["overlap"][backend]``).

``jax`` (mlp, gpt2) runs the same models written in JAX (``benchmarks/jax_models.py``): jitted,
donated parameters and optimizer state, float32 matmuls at HIGHEST precision. ``--size gpt2-124m``
makes gpt2 the real GPT-2 124M (batch 8, seq 512; meant for a GPU); other workloads keep their size.
``--size tiny`` gives mlp and gpt2 their layers at a few elements wide (batch 1): a step whose
time is the host's alone (``cpu_share.py`` runs it on eager PyTorch as the frontend's cost).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
import runtime
from benchmarks import jax_models
from benchmarks.trace_overhead import CountOps

Batch = tuple[torch.Tensor, ...]


@dataclasses.dataclass
class Workload:
    model: nn.Module  # on the CPU, built from a seed; every backend gets a deep copy
    optimizer: Callable[[Any], torch.optim.Optimizer]
    batch: Batch  # CPU tensors
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    infer: Callable[[nn.Module, Batch], torch.Tensor]
    jax: Callable[[bool, Any], jax_models.JaxWorkload] | None = None  # (amp, device) -> ceiling


def _classify_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1])


def _classify(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(batch[0])


def _mlp(size: str) -> Workload:
    d_in, hidden, rows = (4, 4, 1) if size == "tiny" else (256, 512, 64)
    model = nn.Sequential(
        nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )  # fmt: skip
    x, y = torch.randn(rows, d_in), torch.randint(0, 10, (rows,))

    def ceiling(amp: bool, device: Any) -> jax_models.JaxWorkload:
        return jax_models.mlp(x.numpy(), y.numpy(), lr=0.01, amp=amp, device=device)

    sgd = functools.partial(torch.optim.SGD, lr=0.01)
    return Workload(model, sgd, (x, y), _classify_loss, _classify, ceiling)


def _cnn(size: str) -> Workload:
    def block(cin: int, cout: int) -> list[nn.Module]:
        conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        return [conv, nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]

    layers = [*block(3, 32), *block(32, 64), *block(64, 128), nn.Flatten(), nn.Linear(2048, 10)]
    batch = (torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,)))
    sgd = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
    return Workload(nn.Sequential(*layers), sgd, batch, _classify_loss, _classify)


def _transformers() -> Any:
    import transformers

    transformers.logging.set_verbosity_error()  # warnings about defaults of the tiny configs
    return transformers


def _gpt2(size: str) -> Workload:
    transformers = _transformers()
    if size == "gpt2-124m":
        cfg = jax_models.GPT2Config(vocab=50257, positions=1024, dim=768, layers=12, heads=12)
        batch, seq = 8, 512
    elif size == "tiny":
        cfg, batch, seq = jax_models.GPT2Config(vocab=64, positions=8, dim=8), 1, 8
    else:
        cfg, batch, seq = jax_models.GPT2Config(), 8, 128
    config = transformers.GPT2Config(
        vocab_size=cfg.vocab, n_positions=cfg.positions, n_embd=cfg.dim, n_layer=cfg.layers,
        n_head=cfg.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    ids = torch.randint(0, cfg.vocab, (batch, seq))

    def ceiling(amp: bool, device: Any) -> jax_models.JaxWorkload:
        return jax_models.gpt2(ids.numpy(), cfg, lr=1e-4, amp=amp, device=device)

    return Workload(
        transformers.GPT2LMHeadModel(config),
        functools.partial(torch.optim.AdamW, lr=1e-4),
        (ids,),
        lambda m, b: m(input_ids=b[0], labels=b[0]).loss,
        lambda m, b: m(input_ids=b[0]).logits,
        ceiling,
    )


def _bert(size: str) -> Workload:
    transformers = _transformers()
    config = transformers.BertConfig(
        vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=1024, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    ids = torch.randint(0, 8192, (8, 128))
    labels = torch.where(torch.rand(8, 128) < 0.15, ids, -100)  # masked-LM targets, 15% of tokens
    return Workload(
        transformers.BertForMaskedLM(config),
        functools.partial(torch.optim.AdamW, lr=1e-4),
        (ids, labels),
        lambda m, b: m(input_ids=b[0], labels=b[1]).loss,
        lambda m, b: m(input_ids=b[0]).logits,
    )


WORKLOADS: dict[str, Callable[[str], Workload]] = {"mlp": _mlp, "cnn": _cnn, "gpt2": _gpt2}
WORKLOADS["bert"] = _bert


# ----------------------------------------------------------------------------------------------
# Backends: each returns (step, finish). step() runs one step up to its barrier and returns what
# must stay alive through it; finish(out) waits for the step's device work.

Step = Callable[[], Any]
Finish = Callable[[Any], None]


def _lazy_finish(out: Any) -> None:
    lazy_torch.mark_step()
    lazy_torch.wait_device_ops()


# The backends on device 'lazy': the model, once there, wrapped by each one's entry point.
LAZY_WRAPPERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "lazy": lambda model: model,
    "lazy+compile": lazy_torch.compile,
    "lazy+step": lambda model: model,  # its whole step under lazy_torch.compile (_torch_backend)
    # Raises InvalidBackend, which becomes the row's error, while no backend "lazy" is registered.
    "lazy+dynamo": functools.partial(torch.compile, backend="lazy"),
}


def placed(backend: str, wl: Workload, args: argparse.Namespace) -> tuple[nn.Module, tuple, Any]:
    """A copy of the workload's model and its batch on ``backend``'s device (for the lazy
    backends, the model wrapped by their entry point), and the autocast context (a factory) it
    runs its steps in."""
    if backend in LAZY_WRAPPERS:
        model = LAZY_WRAPPERS[backend](copy.deepcopy(wl.model).to("lazy"))
        return model, lazy_torch.to_device(wl.batch), _autocast(backend, args)
    model = copy.deepcopy(wl.model).to(args.device)
    return model, tuple(t.to(args.device) for t in wl.batch), _autocast(backend, args)


def _autocast(backend: str, args: argparse.Namespace) -> Callable[[], Any]:
    if args.amp != "bf16":
        return contextlib.nullcontext
    if backend in LAZY_WRAPPERS:
        return functools.partial(lazy_torch.amp.autocast, dtype=torch.bfloat16)
    return functools.partial(torch.autocast, args.device, dtype=torch.bfloat16)


def _torch_backend(backend: str, wl: Workload, mode: str, args: argparse.Namespace):
    model, batch, autocast = placed(backend, wl, args)
    compiled = torch.compile if backend == "compile" else lambda fn: fn
    if mode == "train":
        model.train()
        opt = wl.optimizer(model.parameters())
        loss_fn = compiled(functools.partial(wl.loss, model))

        def step() -> Any:
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = loss_fn(batch)
            loss.backward()
            opt.step()
            return loss

    else:
        model.eval()
        infer_fn = compiled(functools.partial(wl.infer, model))

        def step() -> Any:
            with torch.no_grad(), autocast():
                return infer_fn(batch)

    if backend == "lazy+step":
        return lazy_torch.compile(step), _lazy_finish
    if backend in LAZY_WRAPPERS:
        return step, _lazy_finish
    if args.device == "cuda":
        return step, lambda out: torch.cuda.synchronize()
    return step, lambda out: None


def _jax_backend(backend: str, wl: Workload, mode: str, args: argparse.Namespace):
    ceiling = wl.jax(args.amp == "bf16", runtime.device(0))
    state = [ceiling.init()]
    if mode == "train":

        def step() -> Any:
            state[0], loss = ceiling.train_step(state[0], ceiling.batch)
            return state[0], loss

    else:
        params = state.pop()[0]

        def step() -> Any:
            return ceiling.infer_step(params, ceiling.batch)

    return step, jax.block_until_ready


BACKENDS = {"eager": _torch_backend, "compile": _torch_backend, "jax": _jax_backend}
BACKENDS.update(dict.fromkeys(LAZY_WRAPPERS, _torch_backend))


# ----------------------------------------------------------------------------------------------
# Measuring.


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _median_ms(values: list[float]) -> float | None:
    return _ms(statistics.median(values)) if values else None


def _device_ms(steps: int) -> float | None:
    """Device time per step since the last metrics reset (after ``wait_device_ops``): the median
    execute_time when each step ran one graph, else their mean times the graphs per step (syncs
    and fallbacks cut extra graphs). The runtime times a sample of executions
    (``runtime.config.TIME_EXECUTIONS``)."""
    times = lazy_torch.metrics.timings().get("execute_time", [])
    if not times:
        return None
    executions = lazy_torch.metrics.counters().get("executions", 0)
    if executions == steps:
        return _median_ms(times)
    return _ms(statistics.fmean(times) * executions / steps)


def _prefixed(counters: dict[str, int], prefix: str) -> dict[str, int]:
    return {k.removeprefix(prefix): v for k, v in counters.items() if k.startswith(prefix)}


def _merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def _timed(step: Step, finish: Finish, steps: int) -> tuple[list[float], list[float]]:
    """Per step: seconds to the end of its device work, and host seconds until its barrier."""
    totals, hosts = [], []
    for _ in range(steps):
        start = time.perf_counter()
        out = step()
        traced = time.perf_counter()
        finish(out)
        totals.append(time.perf_counter() - start)
        hosts.append(traced - start)
    return totals, hosts


def _back_to_back(step: Step, finish: Finish, steps: int) -> float:
    """Mean ms per training step when steps are dispatched back to back and waited for once, as
    a training loop runs them (eager CUDA and JAX queue device work asynchronously too)."""
    finish(step())
    start = time.perf_counter()
    for _ in range(steps):
        out = step()
    finish(out)
    return _ms((time.perf_counter() - start) / steps)


def _overlap(step: Step, steps: int, synced_ms: float) -> dict[str, Any]:
    """Lazy training steps dispatched back to back: mark_step without waiting, one wait at the end."""
    for _ in range(2):  # the pipeline's first steps, untimed
        out = step()
        lazy_torch.mark_step()
    lazy_torch.wait_device_ops()
    lazy_torch.metrics.reset()
    traces, barriers = [], []
    start = time.perf_counter()
    for _ in range(steps):
        begin = time.perf_counter()
        out = step()
        traced = time.perf_counter()
        lazy_torch.mark_step()
        traces.append(traced - begin)
        barriers.append(time.perf_counter() - traced)
    lazy_torch.wait_device_ops()
    step_ms = _ms((time.perf_counter() - start) / steps)
    del out
    trace, device = statistics.median(traces) * 1e3, _device_ms(steps)
    result = {
        "synced_step_ms": synced_ms,
        "step_ms": step_ms,
        "trace_ms": round(trace, 4),
        "barrier_ms": _median_ms(barriers),
        "device_ms": device,
        "compiles": lazy_torch.metrics.counters().get("compiles", 0),
        "captures": lazy_torch.metrics.counters().get("captures", 0),
    }
    if device is None:  # no execution was timed (the runtime samples them)
        return result
    return result | {
        "max_trace_device_ms": round(max(trace, device), 4),
        "trace_plus_device_ms": round(trace + device, 4),
        # the share of the shorter phase that ran under the longer one (1: full overlap)
        "hidden": round((trace + device - step_ms) / max(min(trace, device), 1e-6), 3),
    }


def _loss(out: Any) -> float:
    """The loss a training step returned (JAX's: its state and its loss), read after its barrier."""
    return float(out[1] if isinstance(out, tuple) else out.detach())


def _warm_up(
    build: Callable[[], tuple[Step, Finish]], mode: str, warmup: int
) -> tuple[Step, Finish, dict[str, Any]]:
    """Builds the step and runs the warm-up steps. Reports the seconds from building the step to
    the end of the first step (compiles and captures included) and to the end of the last, and a
    training step's losses."""
    start = time.perf_counter()
    step, finish = build()
    result: dict[str, Any] = {}
    losses = []
    for i in range(warmup):
        out = step()
        finish(out)
        if i == 0:
            result["first_step_s"] = round(time.perf_counter() - start, 3)
        if mode == "train":
            losses.append(_loss(out))
        del out
    result["warmup_s"] = round(time.perf_counter() - start, 3)
    if losses:
        result["losses"] = losses
    return step, finish, result


def _count_ops(backend: str, step: Step, finish: Finish) -> int | None:
    """The aten ops one more (untimed) step dispatches, counted by a TorchDispatchMode. Not for
    lazy+dynamo: Dynamo runs a frame called under a dispatch mode uncompiled and marks its code
    object to be skipped for good (pytorch/pytorch#190286), so every later step ran op by op."""
    if backend == "lazy+dynamo":
        return None
    with CountOps() as counter:
        finish(step())
    return counter.count


def _run(backend: str, wl: Workload, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    lazy = backend in LAZY_WRAPPERS
    if lazy:
        lazy_torch.metrics.reset()
    build = functools.partial(BACKENDS[backend], backend, wl, mode, args)
    step, finish, result = _warm_up(build, mode, args.warmup)
    if lazy:
        ops = _count_ops(backend, step, finish)
        warm = lazy_torch.metrics.counters()
        lazy_torch.metrics.reset()
    # Synced steps, each waited for: lazy times every execution (back to back, a sample).
    sampled = runtime.config.TIME_EXECUTIONS
    runtime.config.TIME_EXECUTIONS = 1
    totals, hosts = _timed(step, finish, args.steps)
    runtime.config.TIME_EXECUTIONS = sampled
    result["step_ms"] = _median_ms(totals)
    result["steps_ms"] = [_ms(t) for t in totals]
    result["load_1m"] = round(os.getloadavg()[0], 2)  # the machines are shared: was it busy?
    if not lazy:
        if mode == "train":
            result["back_to_back_ms"] = _back_to_back(step, finish, args.steps)
        return result
    timed = lazy_torch.metrics.counters()
    trace = statistics.median(hosts)
    result.update(
        trace_ms=_ms(trace),
        device_ms=_device_ms(args.steps),
        barrier_ms=_median_ms(lazy_torch.metrics.timings().get("mark_step_time", [])),
        ops=ops,
        us_per_op=round(trace / ops * 1e6, 2) if ops else None,
        compiles=timed.get("compiles", 0),
        warmup_compiles=warm.get("compiles", 0),
        captures=timed.get("captures", 0),
        warmup_captures=warm.get("captures", 0),
        executions_per_step=timed.get("executions", 0) / args.steps,
        fallbacks=_merge(_prefixed(warm, "fallback::"), _prefixed(timed, "fallback::")),
        syncs={k: v for k, v in _prefixed(timed, "syncs::").items() if k != "mark_step"},
    )
    if result["barrier_ms"] is not None:
        result["host_ms"] = round(result["trace_ms"] + result["barrier_ms"], 4)
    if mode == "train":
        # Pipelined steps are timed as a whole (total / steps), so they compare with the mean of
        # the synced steps, not the median: both include the occasional slow step.
        result["overlap"] = _overlap(step, args.steps, _ms(statistics.mean(totals)))
        result["back_to_back_ms"] = result["overlap"]["step_ms"]
    return result


# ----------------------------------------------------------------------------------------------
# Reporting.


def _machine(args: argparse.Namespace) -> dict[str, Any]:
    def version(module: str) -> str | None:
        try:
            return __import__(module).__version__
        except ImportError:
            return None

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), cpu)

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], check=False, capture_output=True, text=True
        ).stdout.strip()

    lazy_device = runtime.device(0)
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "jax": jax.__version__,
        "transformers": version("transformers"),
        "torch_threads": torch.get_num_threads(),
        "eager_device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "lazy_device": f"{lazy_device.platform}: {lazy_device.device_kind}",
        "git_commit": git("rev-parse", "HEAD") or None,
        "git_changes": git("status", "--short", "--untracked-files=no").splitlines(),
        "load_average_start": os.getloadavg(),
    }


# (header, key, format) of the columns; a missing value prints "-".
_COLUMNS = [
    ("step ms", "step_ms", "9.2f"), ("x eager", "vs_eager", "7.2f"), ("x jax", "vs_jax", "6.2f"),
    ("trace ms", "trace_ms", "8.2f"), ("host ms", "host_ms", "7.2f"),
    ("device ms", "device_ms", "9.2f"), ("ops", "ops", "5d"), ("us/op", "us_per_op", "6.1f"),
    ("compiles", "compiles", "8d"), ("b2b ms", "back_to_back_ms", "7.2f"),
    ("b2b x eager", "b2b_vs_eager", "11.2f"), ("b2b x jax", "b2b_vs_jax", "9.2f"),
    ("1st step s", "first_step_s", "10.2f"), ("warm-up s", "warmup_s", "9.2f"),
    ("loss", "loss", "9.5f"),
]  # fmt: skip
_OVERLAP_COLUMNS = [
    ("synced", "synced_step_ms", "8.2f"), ("pipelined", "step_ms", "9.2f"),
    ("trace", "trace_ms", "8.2f"), ("barrier", "barrier_ms", "8.2f"),
    ("device", "device_ms", "8.2f"), ("max(t,d)", "max_trace_device_ms", "9.2f"),
    ("t+d", "trace_plus_device_ms", "8.2f"), ("hidden", "hidden", "6.2f"),
]  # fmt: skip


def _cells(columns: list[tuple[str, str, str]], row: dict[str, Any] | None = None) -> str:
    def cell(head: str, key: str, spec: str) -> str:
        width = int(spec.rstrip("df").split(".")[0])
        if row is None:
            return head.rjust(width)
        value = row.get(key)
        return "-".rjust(width) if value is None else format(value, spec)

    return " ".join(cell(*c) for c in columns)


def _notes(backend: str, r: dict[str, Any]) -> str:
    notes = [f"{k} x{v}" for k, v in r.get("fallbacks", {}).items()]
    notes += [f"sync {k} x{v}" for k, v in r.get("syncs", {}).items()]
    if r.get("warmup_captures") or r.get("captures"):
        notes.append(f"captures x{r['warmup_captures']} warm-up, x{r['captures']} timed")
    return ", ".join(notes) or ("none" if backend in LAZY_WRAPPERS else "")


def _table(results: dict[str, Any]) -> str:
    """The rows; ``loss``: the last warm-up step's (after ``--warmup`` - 1 updates)."""
    lines = [f"{'workload':8s} {'mode':5s} {'backend':12s} {_cells(_COLUMNS)}  notes"]
    for name, modes in results.items():
        for mode in ("train", "infer"):
            for backend, r in modes.get(mode, {}).items():
                head = f"{name:8s} {mode:5s} {backend:12s}"
                if "error" in r:
                    lines.append(f"{head} ERROR {r['error']}")
                    continue
                row = {**r, "loss": r["losses"][-1]} if r.get("losses") else r
                lines.append(f"{head} {_cells(_COLUMNS, row)}  {_notes(backend, r)}")
    overlaps = {(n, b): o for n, m in results.items() for b, o in m.get("overlap", {}).items()}
    if overlaps:
        lines += [
            "",
            "lazy training, steps dispatched back to back (ms per step, means: synced and",
        ]
        lines += ["pipelined; medians: the rest; hidden: the share of the shorter of trace/device"]
        lines += ["that ran under the longer; 1 = full overlap)"]
        lines.append(f"{'workload':8s} {'backend':12s} {_cells(_OVERLAP_COLUMNS)}")
        lines += [f"{n:8s} {b:12s} {_cells(_OVERLAP_COLUMNS, o)}" for (n, b), o in overlaps.items()]
    return "\n".join(lines)


def _ratios(rows: dict[str, dict[str, Any]]) -> None:
    for base in ("eager", "jax"):
        for key, prefix in (("step_ms", "vs"), ("back_to_back_ms", "b2b_vs")):
            ref = rows.get(base, {}).get(key)
            for backend, r in rows.items():
                if ref and backend != base and r.get(key):
                    r[f"{prefix}_{base}"] = round(r[key] / ref, 3)


def _build(name: str, size: str) -> Workload:
    torch.manual_seed(0)
    return WORKLOADS[name](size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--size", choices=["small", "gpt2-124m", "tiny"], default="small")
    parser.add_argument("--amp", choices=["none", "bf16"], default="none")
    parser.add_argument(
        "--backends", help="comma-separated (default: eager,lazy,jax; +compile on cuda)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {list(WORKLOADS)}")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (the first step is timed on its own)")
    backends = args.backends or "eager,lazy,jax" + (",compile" if args.device == "cuda" else "")
    backends = backends.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = _machine(args)
    results: dict[str, Any] = {}
    for name in args.workloads or WORKLOADS:
        try:
            wl = _build(name, args.size)
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        results[name] = {}
        for mode in ("train", "infer"):
            rows = results[name][mode] = {}
            for backend in backends:
                if backend == "jax" and wl.jax is None:
                    continue
                print(f"{name} {mode} {backend} ...", file=sys.stderr, flush=True)
                try:
                    rows[backend] = _run(backend, wl, mode, args)
                except Exception as e:  # noqa: BLE001 (one broken backend must not end the suite)
                    traceback.print_exc()
                    rows[backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                if "overlap" in rows[backend]:
                    overlap = rows[backend].pop("overlap")
                    results[name].setdefault("overlap", {})[backend] = overlap
            _ratios(rows)
    machine["load_average_end"] = os.getloadavg()
    print(_table(results))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "args": vars(args), "results": results}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
