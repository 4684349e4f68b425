"""Host time of a data-parallel training step on a mesh against the same step without one.

PYTHONPATH=. python benchmarks/mesh_host_step.py [--devices 4] [--layers 12] [--steps 60]
    [--rounds 3]

GPT-2 (transformers) with ``--layers`` blocks of width 48 and AdamW, ``--devices`` sequences of
64 tokens a step, on device='lazy' without a mesh and on a mesh of ``--devices`` devices of the
CPU platform (``LAZY_CPU_DEVICES``), each in its own process, alternating for ``--rounds``
rounds. The tensors are tiny, so a step's time is the host's (tracing plus mark_step, each step's
device work waited for outside the timing): what a mesh costs on a host-bound step. Prints each
run's median host step and mark_step times, then the medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def one_run(mesh_devices: int, layers: int, steps: int) -> tuple[float, float]:
    """(median host step, median mark_step) in ms; ``mesh_devices`` 0: no mesh."""
    import torch
    import transformers

    import lazy_torch
    from lazy_torch.distributed import DeviceLoader, Mesh

    config = transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=48, n_layer=layers, n_head=4
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to("lazy")
    n = max(mesh_devices, 1)
    mesh = Mesh(range(n), (n,), ("data",)) if mesh_devices else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [torch.randint(0, 256, (n, 64)) for _ in range(steps)]
    spec = None if mesh is None else ("data", None)
    host, mark = [], []
    for i, tokens in enumerate(DeviceLoader(data, mesh=mesh, partition_spec=spec)):
        lazy_torch.wait_device_ops()
        start = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        traced = time.perf_counter()
        lazy_torch.mark_step()
        if i >= 5:  # after the warm-up's compiles
            host.append(time.perf_counter() - start)
            mark.append(time.perf_counter() - traced)
    return 1e3 * statistics.median(host), 1e3 * statistics.median(mark)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(*one_run(args.child, args.layers, args.steps))
        return
    env = {**os.environ, "LAZY_CPU_DEVICES": os.environ.get("LAZY_CPU_DEVICES", str(args.devices))}
    figures: dict[str, list[tuple[float, float]]] = {"no mesh": [], f"mesh x{args.devices}": []}
    for r in range(args.rounds):
        for name, child in zip(figures, (0, args.devices)):
            command = [sys.executable, __file__, "--child", str(child), "--layers",
                       str(args.layers), "--steps", str(args.steps)]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            host, mark = map(float, done.stdout.split()[-2:])
            figures[name].append((host, mark))
            print(f"round {r + 1} {name:10s} host step {host:6.1f} ms, mark_step {mark:5.2f} ms")
    for name, runs in figures.items():
        host = statistics.median(h for h, _ in runs)
        mark = statistics.median(m for _, m in runs)
        print(f"median    {name:10s} host step {host:6.1f} ms, mark_step {mark:5.2f} ms")


if __name__ == "__main__":
    main()
