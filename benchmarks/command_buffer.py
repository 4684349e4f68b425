"""How much of XLA's command buffer each training step re-records: lazy with and without spare
buffers, and the JAX ceiling.

PYTHONPATH=. python benchmarks/command_buffer.py [--size gpt2-124m] [--steps 6] [--only BACKENDS]

XLA's GPU runtime records an executable's kernels into a command buffer (a CUDA graph) and
replays it; before each replay it re-records the commands that touch an allocation whose address
changed since the last call. A step whose outputs land in new buffers pays that on the host in
every call. This runs the suite's GPT-2 training step (bf16 autocast) back to back in three child
processes, lazy with spare buffers (``LAZY_RECYCLE=1``: outputs go into the dead outputs of the
previous step, runtime/donation.py), lazy without them, lazy with the whole step under
``lazy_torch.compile`` (the suite's ``lazy+step``), and the same model written in JAX, with
XLA's log of its command-buffer thunk turned on, and prints per steady step the changed
allocations and the update's time as XLA logs them (medians). Needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

_MARK = "=== steady steps"
_ALLOCS = re.compile(r"updated_allocs=(\d+)")
_UPDATE = re.compile(r"Updated command buffer in (\d+) \S+s")  # microseconds


def _child(backend: str, size: str, steps: int) -> None:
    """Run the steps in this process; XLA's log goes to stderr."""
    import jax

    import lazy_torch
    import runtime
    from benchmarks import suite

    args = argparse.Namespace(device="cuda", amp="bf16", size=size)
    wl = suite._build("gpt2", size)
    if backend == "jax":
        ceiling = wl.jax(True, runtime.device(0))
        state = ceiling.init()
        for i in range(4 + steps):
            if i == 4:
                print(_MARK, file=sys.stderr, flush=True)
            state, _ = ceiling.train_step(state, ceiling.batch)
        jax.block_until_ready(state)
        return
    step, _ = suite._torch_backend(backend, wl, "train", args)
    for i in range(4 + steps):
        if i == 4:
            lazy_torch.wait_device_ops()
            print(_MARK, file=sys.stderr, flush=True)
        step()
        lazy_torch.mark_step()
    lazy_torch.wait_device_ops()


def _measure(backend: str, recycle: str, size: str, steps: int) -> tuple[list[int], list[int]]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="command_buffer_thunk=3")
    env["LAZY_RECYCLE"] = recycle
    command = [sys.executable, __file__, "--child", backend, "--size", size, "--steps", str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    steady = done.stderr.split(_MARK, 1)[-1]
    allocs = [int(m) for m in _ALLOCS.findall(steady)]
    micros = [int(m) for m in _UPDATE.findall(steady)]
    return allocs, micros


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="gpt2-124m")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", help="comma-separated backends: lazy, lazy+step, jax (default: all)"
    )
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.size, args.steps)
        return
    runs = (
        ("lazy, spare buffers", "lazy", "1"),
        ("lazy, none", "lazy", "0"),
        ("lazy+step, spares", "lazy+step", "1"),
        ("jax", "jax", ""),
    )
    if args.only:
        runs = tuple(r for r in runs if r[1] in args.only.split(","))
    print(f"GPT-2 ({args.size}, bf16 autocast), {args.steps} steady steps back to back, medians:")
    for name, backend, recycle in runs:
        allocs, micros = _measure(backend, recycle, args.size, args.steps)
        if not allocs:
            print(f"  {name:20} no command-buffer updates logged")
            continue
        print(
            f"  {name:20} {statistics.median(allocs):5.0f} changed allocations, update "
            f"{statistics.median(micros) / 1e3:6.2f} ms a step ({len(allocs)} updates)"
        )


if __name__ == "__main__":
    main()
