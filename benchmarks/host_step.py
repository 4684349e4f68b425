"""Host time of a training step with the structure of a large model and tiny tensors.

PYTHONPATH=. python benchmarks/host_step.py [--layers 12] [--steps 40] [--amp] [--gc-freeze]
    [--eager cpu|cuda] [--torch-wrapper] [--compile] [--compile-step]

GPT-2 (transformers) with ``--layers`` blocks of width 48, AdamW, batch 1 x 64 on device='lazy':
the device work is negligible, so a step's time is the host's (tracing plus mark_step). Prints
the mean, median and slowest step (waiting for each step's device work outside the timing), the
time the cycle collector took per step and its collections by generation (a full collection
over transformers' heap takes hundreds of ms), and how many ops per step went to the Python path
instead of the C fast path. Compare two checkouts by running it with PYTHONPATH set to each.

``--eager DEVICE`` also runs the same step on eager PyTorch on DEVICE, alternating blocks of five
steps with lazy's, and prints each backend's median host time per step and per aten op, with the
share of the ops that are views (metadata only: in eager no kernel runs for them, while every op
on a Python tensor subclass goes through PyTorch's Python key and makes a new tensor).
``--torch-wrapper`` also runs lazy's step with lazy tensors' wrappers made by PyTorch's
``_make_wrapper_subclass`` instead of ``lazy_torch/csrc/wrapper.cpp``, alternating blocks of five
steps in the same process, and prints the ratio of the two medians.
``--compile`` also runs lazy's step with the model under ``lazy_torch.compile`` (its forward and
backward one node each), alternating blocks of five steps in the same process. Every lazy step
prints its median host time per phase: ``zero_grad``, the forward and loss, ``backward``, the
optimizer's step and ``mark_step``.
``--compile-step`` also runs the whole step (``zero_grad``, forward and loss, ``backward``,
``opt.step()``) as one function under ``lazy_torch.compile``, its phases ``step`` and ``mark_step``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import lazy_torch
from benchmarks.trace_overhead import CountOps
from lazy_torch.tensor import _native


class _CollectorTime:
    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1


PHASES = ("zero_grad", "forward", "backward", "optimizer", "mark_step")
COMPILED = "lazy, compiled"
COMPILED_STEP = "lazy, whole step"


def _model_step(
    device: str,
    amp: bool,
    layers: int,
    compiled: bool = False,
    phases: dict | None = None,
    whole: bool = False,
) -> Callable[[], None]:
    """A training step of the tiny-tensor GPT-2 on ``device`` (lazy: with its mark_step; its
    model under lazy_torch.compile if ``compiled``, the whole step before mark_step if
    ``whole``), appending each phase's host seconds to ``phases`` (by name) if given."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        vocab_size=512, n_positions=128, n_embd=48, n_layer=layers, n_head=12,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    if compiled:
        lazy_torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 512, (1, 64)).to(device)
    lazy = device == "lazy"
    if not amp:
        autocast: Callable[[], Any] = contextlib.nullcontext
    elif lazy:
        autocast = lambda: lazy_torch.amp.autocast(dtype=torch.bfloat16)
    else:
        autocast = lambda: torch.autocast(device, dtype=torch.bfloat16)

    def train() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()

    if whole:
        compiled_step = lazy_torch.compile(train)

        def step() -> None:
            start = time.perf_counter()
            compiled_step()
            middle = time.perf_counter()
            lazy_torch.mark_step()
            if phases is not None:
                phases.setdefault("step", []).append(middle - start)
                phases.setdefault("mark_step", []).append(time.perf_counter() - middle)

        return step

    def step() -> None:
        marks = [time.perf_counter()]
        opt.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        with autocast():
            loss = model(input_ids=ids, labels=ids).loss
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        opt.step()
        marks.append(time.perf_counter())
        if lazy:
            lazy_torch.mark_step()
        marks.append(time.perf_counter())
        if phases is not None:
            for name, start, end in zip(PHASES, marks, marks[1:]):
                phases.setdefault(name, []).append(end - start)

    return step


TORCH_WRAPPER = "lazy, torch wrapper"


def _with_torch_wrapper(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with lazy tensors' wrappers made by PyTorch's ``_make_wrapper_subclass`` instead
    of the C++ one (lazy_torch/csrc/wrapper.cpp)."""
    from lazy_torch import dispatch, tensor

    ours = tensor.make_wrapper

    def wrapped() -> None:
        dispatch.use_wrapper(torch.Tensor._make_wrapper_subclass)
        try:
            step()
        finally:
            dispatch.use_wrapper(ours)

    return wrapped


def _wait(device: str) -> None:
    if device.startswith("lazy"):
        lazy_torch.wait_device_ops()
    elif device == "cuda":
        torch.cuda.synchronize()


def _ops(step: Callable[[], None], device: str) -> tuple[int, int]:
    """Aten ops one step dispatches, and how many of them are views."""
    with CountOps() as counter:
        step()
    _wait(device)
    return counter.count, counter.views


def _times(step: Callable[[], None], device: str, steps: int) -> list[float]:
    """Host seconds of each step, waiting for its device work outside the timing."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        _wait(device)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--amp", action="store_true", help="autocast to bfloat16")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() after warm-up (docs/training.md)"
    )
    parser.add_argument("--eager", help="also run the step on eager PyTorch on this device")
    parser.add_argument(
        "--torch-wrapper",
        action="store_true",
        help="also run lazy's step with PyTorch's wrapper function, alternating blocks",
    )
    parser.add_argument(
        "--compile", action="store_true", help="also run lazy's step under lazy_torch.compile"
    )
    parser.add_argument(
        "--compile-step",
        action="store_true",
        help="also run lazy's whole step as one function under lazy_torch.compile",
    )
    args = parser.parse_args()
    devices = ["lazy"] + ([args.eager] if args.eager else [])
    phases: dict[str, dict[str, list[float]]] = {"lazy": {}}
    steps = {d: _model_step(d, args.amp, args.layers, phases=phases.get(d)) for d in devices}
    if args.torch_wrapper:
        steps[TORCH_WRAPPER] = _with_torch_wrapper(steps["lazy"])
        devices.append(TORCH_WRAPPER)
    if args.compile:
        phases[COMPILED] = {}
        steps[COMPILED] = _model_step("lazy", args.amp, args.layers, True, phases[COMPILED])
        devices.append(COMPILED)
    if args.compile_step:
        phases[COMPILED_STEP] = {}
        steps[COMPILED_STEP] = _model_step(
            "lazy", args.amp, args.layers, phases=phases[COMPILED_STEP], whole=True
        )
        devices.append(COMPILED_STEP)
    for device, step in steps.items():
        for _ in range(5):
            step()
            _wait(device)
    ops = {d: _ops(step, d) for d, step in steps.items()}
    for recorded in phases.values():
        recorded.clear()  # the warm-up's
    if args.gc_freeze:
        gc.freeze()
    collector = _CollectorTime()
    gc.callbacks.append(collector)
    before = _native.stats()["python"]
    times: dict[str, list[float]] = {d: [] for d in devices}
    lazy_seconds = 0.0
    for block in range(0, args.steps, 5):
        for device, step in steps.items():
            collected = collector.seconds
            times[device] += _times(step, device, min(5, args.steps - block))
            if device == "lazy":
                lazy_seconds += collector.seconds - collected
    gc.callbacks.remove(collector)
    ms = [t * 1e3 for t in times["lazy"]]
    print(
        f"host per step: mean {statistics.mean(ms):.1f} ms, median {statistics.median(ms):.1f}, "
        f"slowest {max(ms):.1f}"
    )
    print(
        f"cycle collector: {lazy_seconds / args.steps * 1e3:.2f} ms per lazy step, collections "
        f"by generation {collector.collections} in {args.steps} steps of each backend"
    )
    python_ops = (_native.stats()["python"] - before) / args.steps
    print(f"ops handed to their Python handlers per step: {python_ops:.0f}")
    for device in devices:
        count, views = ops[device]
        median = statistics.median(times[device])
        name = device if device.startswith("lazy") else f"eager {device}"
        print(
            f"{name:19s} median host {median * 1e3:6.2f} ms per step, {count} aten ops "
            f"({views} views), {median / count * 1e6:5.2f} us per op"
        )
    if args.torch_wrapper:
        ratio = statistics.median(times["lazy"]) / statistics.median(times[TORCH_WRAPPER])
        print(f"lazy / lazy with PyTorch's wrapper function: {ratio:.3f}")
    for device, recorded in phases.items():
        if recorded:
            cells = ", ".join(
                f"{name} {statistics.median(recorded[name]) * 1e3:.2f}" for name in recorded
            )
            print(f"{device:19s} median ms per phase: {cells}")


if __name__ == "__main__":
    main()
