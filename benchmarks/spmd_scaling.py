"""Scale-out: GPT-2 data-parallel and FSDP over 1, 2, 4 ... devices with a fixed per-device batch
(examples/train_gpt2_spmd.py, one process per run), side by side with PyTorch DDP over NCCL.

PYTHONPATH=. python benchmarks/spmd_scaling.py [--size tiny|124m] [--amp bf16] [--batch 4]
    [--steps 10] [--devices 1,2,4] [--ddp] [--runs plain,dp,fsdp,ddp]

Prints, per run: tokens/s per device, its ratio to the same backend on one device (the scaling
efficiency; "plain" is one device without a mesh, against which "dp x1" shows what a mesh
costs), the step time, the parameters and optimizer state device 0 holds (FSDP: about 1/N),
peak device memory where the platform reports it, and the compiles after warm-up (must be 0).
``--ddp`` (CUDA only) adds eager PyTorch DDP, one process per GPU, the same model, batches and
bf16 autocast. On the CPU platform (LAZY_CPU_DEVICES=N devices of one host) the figures are for
correctness and overhead only: the devices share the host's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "train_gpt2_spmd.py")


def lazy_run(mode: str, devices: int, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        EXAMPLE,
        "--json",
        "--mode",
        mode,
        "--devices",
        str(devices),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--size",
        args.size,
    ]
    if args.amp:
        command += ["--amp", args.amp]
    env = {
        **os.environ,
        "LAZY_CPU_DEVICES": os.environ.get("LAZY_CPU_DEVICES", str(max(args.devices))),
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ddp_worker(rank: int, world: int, args: argparse.Namespace, port: int, out) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    sys.path.insert(0, os.path.dirname(EXAMPLE))
    from train_gpt2_spmd import SIZES, batches

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    n_layer, n_embd, n_head, vocab, seq = SIZES[args.size]
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=n_embd, n_layer=n_layer, n_head=n_head
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    data = batches(vocab, seq, args.batch * world, args.steps)
    warmup = 3
    for step, tokens in enumerate(data):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        tokens = tokens[rank * args.batch : (rank + 1) * args.batch].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        timed = args.steps - warmup
        out.put({
            "mode": "ddp", "devices": world, "step_ms": 1e3 * elapsed / timed,
            "tokens_per_s_per_device": timed * args.batch * seq / elapsed,
            "peak_bytes_device0": torch.cuda.max_memory_allocated(0), "compiles_after_warmup": 0,
            "state_bytes_device0": None,
        })  # fmt: skip
    dist.destroy_process_group()


def ddp_run(devices: int, args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    port = 29500 + devices
    mp.start_processes(
        _ddp_worker, (devices, args, port, out), nprocs=devices, start_method="spawn"
    )
    return out.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "124m"), default="tiny")
    parser.add_argument("--amp", choices=("bf16",), default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--devices", default="1,2,4", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--ddp", action="store_true", help="add PyTorch DDP over NCCL (CUDA)")
    parser.add_argument(
        "--runs", default="plain,dp,fsdp,ddp", help="which of plain,dp,fsdp,ddp to run"
    )
    args = parser.parse_args()
    kinds = set(args.runs.split(","))

    runs = [lambda: lazy_run("plain", 1, args)] if "plain" in kinds else []  # no mesh
    runs += [lambda k=k: lazy_run("dp", k, args) for k in args.devices if "dp" in kinds]
    if "fsdp" in kinds:
        runs.append(lambda: lazy_run("fsdp", max(args.devices), args))
    if args.ddp and "ddp" in kinds:
        runs += [lambda k=k: ddp_run(k, args) for k in args.devices]
    rows = []
    for run in runs:
        rows.append(run())
        print(json.dumps(rows[-1]), flush=True)  # each as it comes: a long run may be cut short
    base = {}
    mib = 1 / 2**20
    print(f"GPT-2 {args.size}, {args.batch} sequences per device, amp {args.amp}")
    print(f"{'run':12s} {'tok/s/dev':>10s} {'vs 1 dev':>8s} {'step ms':>8s} "
          f"{'state MiB dev0':>14s} {'peak MiB dev0':>13s} {'compiles':>8s}")  # fmt: skip
    for r in rows:
        backend = "ddp" if r["mode"] == "ddp" else "lazy"
        if r["devices"] == 1 and r["mode"] in ("dp", "ddp"):
            base[backend] = r["tokens_per_s_per_device"]
        ratio = r["tokens_per_s_per_device"] / base[backend] if backend in base else float("nan")
        state = "-" if r["state_bytes_device0"] is None else f"{r['state_bytes_device0'] * mib:.1f}"
        peak = (
            "-" if r.get("peak_bytes_device0") is None else f"{r['peak_bytes_device0'] * mib:.0f}"
        )
        print(f"{r['mode'] + ' x' + str(r['devices']):12s} {r['tokens_per_s_per_device']:10.0f} "
              f"{ratio:8.2f} {r['step_ms']:8.1f} {state:>14s} {peak:>13s} "
              f"{r['compiles_after_warmup']:8d}")  # fmt: skip


if __name__ == "__main__":
    main()
