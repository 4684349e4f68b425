"""Train GPT-2 (Hugging Face transformers, random init) over every lazy device: data-parallel,
then FSDP (parameters and optimizer state sharded), each printing per-device throughput and
memory.

Data-parallel: the batch is split over mesh axis "data" (``DeviceLoader(mesh=, partition_spec=)``)
and the parameters stay whole on every device; XLA all-reduces the gradients. FSDP: every
parameter is split along its first dimension that divides (``lazy_torch.distributed.fsdp``), and
XLA all-gathers each weight where it is used and reduce-scatters its gradient. Each device gets
``--batch`` sequences per step either way.

python examples/train_gpt2_spmd.py                    # over every device (on CPU: LAZY_CPU_DEVICES)
LAZY_CPU_DEVICES=4 python examples/train_gpt2_spmd.py --mode fsdp --steps 20
LAZY_PLATFORM=gpu python examples/train_gpt2_spmd.py --size 124m --amp bf16
LAZY_CPU_DEVICES=2 torchrun --nproc-per-node 2 examples/train_gpt2_spmd.py   # 2 processes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

# On the XLA CPU platform, 4 devices unless told otherwise (read when lazy_torch is imported).
os.environ.setdefault("LAZY_CPU_DEVICES", "4")

import torch  # noqa: E402
import transformers  # noqa: E402

import lazy_torch  # noqa: E402
import runtime  # noqa: E402
from lazy_torch.distributed import (  # noqa: E402
    DeviceLoader,
    Mesh,
    fsdp,
    get_sharding,
    initialize,
    process_count,
    process_index,
)

SIZES = {  # n_layer, n_embd, n_head, vocab, seq
    "tiny": (2, 64, 4, 256, 64),
    "124m": (12, 768, 12, 50257, 512),
}


def batches(vocab: int, seq: int, batch: int, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Token sequences where each token is followed by one of 4 successors fixed per token: a
    model that learns the table drives the loss towards log(4)."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g)
    out = []
    for _ in range(steps):
        tokens = torch.empty(batch, seq, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        choice = torch.randint(0, 4, (batch, seq), generator=g)
        for t in range(1, seq):
            tokens[:, t] = successors[tokens[:, t - 1], choice[:, t]]
        out.append(tokens)
    return out


def train(
    mode: str, devices: int, batch: int, steps: int, size: str, amp: str | None, warmup: int = 3
) -> dict:
    """One run: ``mode`` "dp" or "fsdp" over the first ``devices`` devices, or "plain" (one
    device, no mesh: what a mesh costs), ``batch`` sequences per device per step. Returns its
    figures."""
    n_layer, n_embd, n_head, vocab, seq = SIZES[size]
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=seq, n_embd=n_embd, n_layer=n_layer, n_head=n_head
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to("lazy")
    mesh = None if mode == "plain" else Mesh(range(devices), (devices,), ("data",))
    if mode == "fsdp":
        fsdp(model, mesh, "data")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    data = batches(vocab, seq, batch * devices, steps)
    if process_count() > 1:  # each process gives its own devices' part of every batch
        local = batch * len(runtime.devices())
        data = [b[process_index() * local : (process_index() + 1) * local] for b in data]
    spec = None if mesh is None else ("data", None)
    loader = DeviceLoader(data, mesh=mesh, partition_spec=spec)
    autocast = lazy_torch.amp.autocast(dtype=torch.bfloat16) if amp == "bf16" else None
    losses, compiles_after_warmup = [], 0
    for step, tokens in enumerate(loader):
        if step == warmup:
            lazy_torch.wait_device_ops()
            compiles = lazy_torch.metrics.counters().get("compiles", 0)
            start = time.perf_counter()
        if autocast is not None:
            with autocast:
                loss = model(input_ids=tokens, labels=tokens).loss
        else:
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lazy_torch.mark_step()
        losses.append(loss.detach())
    lazy_torch.wait_device_ops()
    elapsed = time.perf_counter() - start
    compiles_after_warmup = lazy_torch.metrics.counters().get("compiles", 0) - compiles
    timed = steps - warmup
    state = [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]
    state = [t for t in state if t.device.type == "lazy"]  # Adam's step counts live on the host
    return {
        "mode": mode,
        "devices": devices,
        "batch_per_device": batch,
        "step_ms": 1e3 * elapsed / timed,
        "tokens_per_s_per_device": timed * batch * seq / elapsed,
        "losses": [float(x) for x in losses],
        "compiles_after_warmup": compiles_after_warmup,
        # Parameters and optimizer state held by device 0, and that state whole.
        "state_bytes_device0": sum(_bytes_on_first(t) for t in state),
        "state_bytes_total": sum(t.numel() * t.element_size() for t in state),
        "sharded_parameters": sum(1 for p in model.parameters() if any(_spec(p))),
        "peak_bytes_device0": _peak(0),
    }


def _spec(t: torch.Tensor) -> tuple:
    found = get_sharding(t)
    return () if found is None else found[1]


def _bytes_on_first(t: torch.Tensor) -> int:
    """Bytes of ``t`` that lazy device 0 holds (a shard of a split tensor, or all of it)."""
    buffer = runtime.resolve(t._lazy.node.payload)
    first = runtime.device(0)
    return sum(s.data.nbytes for s in buffer.addressable_shards if s.device == first)


def _peak(index: int) -> int | None:
    stats = runtime.device(index).memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("dp", "fsdp", "both", "plain"), default="both")
    parser.add_argument("--devices", type=int, default=0, help="how many (default: all)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per device per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny")
    parser.add_argument("--amp", choices=("bf16",), default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON line per run")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by torchrun: one process per host
        initialize()
    devices = 1 if args.mode == "plain" else args.devices or lazy_torch.device_count()
    for mode in ("dp", "fsdp") if args.mode == "both" else (args.mode,):
        r = train(mode, devices, args.batch, args.steps, args.size, args.amp)
        if args.json:
            print(json.dumps(r))
            continue
        mib = 1 / 2**20
        print(
            f"{mode:4s} over {devices} {runtime.device(0).platform} device(s): "
            f"{r['tokens_per_s_per_device']:.0f} tokens/s per device, step {r['step_ms']:.1f} ms, "
            f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f} (floor {math.log(4):.3f}), "
            f"compiles after warm-up {r['compiles_after_warmup']}"
        )
        print(
            f"     parameters + optimizer state on device 0: "
            f"{r['state_bytes_device0'] * mib:.1f} MiB of {r['state_bytes_total'] * mib:.1f} MiB"
            + ("" if r["peak_bytes_device0"] is None else
               f", peak device memory {r['peak_bytes_device0'] * mib:.0f} MiB")
        )  # fmt: skip


if __name__ == "__main__":
    main()
