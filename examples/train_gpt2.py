"""Train a small GPT-2 (Hugging Face transformers, random init) on device='lazy'.

The data is a synthetic language the example generates: each token is followed by one of a few
successors fixed per token, so a model that learns the table drives the loss towards log(fanout).
AdamW with linear warm-up and cosine decay, gradient clipping, dropout on; batches reach the device
through lazy_torch.DeviceLoader, one step ahead of the training loop.

python examples/train_gpt2.py                 # lazy (XLA CPU by default)
python examples/train_gpt2.py --device cpu    # eager PyTorch baseline
"""

import argparse
import math
import time

import torch
import transformers

import lazy_torch
from _summary import print_summary


class SyntheticLanguage(torch.utils.data.Dataset):
    def __init__(self, vocab: int, seq: int, size: int, fanout: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, fanout), generator=g)
        self.vocab, self.seq, self.size, self.fanout, self.seed = vocab, seq, size, fanout, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        choice = torch.randint(0, self.fanout, (self.seq,), generator=g)
        out = torch.empty(self.seq, dtype=torch.int64)
        out[0] = torch.randint(0, self.vocab, (), generator=g)
        for t in range(1, self.seq):
            out[t] = self.successors[out[t - 1], choice[t]]
        return out


def warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--device", default="lazy", help="'lazy' (default) or 'cpu' for eager")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    config = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=4,
    )
    model = transformers.GPT2LMHeadModel(config).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(20, args.steps))
    data = SyntheticLanguage(args.vocab, args.seq, args.steps * args.batch)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch)
    if device.type == "lazy":
        loader = lazy_torch.DeviceLoader(loader, device)

    print(f"GPT-2: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters")
    warmup = 3  # the first steps compile; throughput counts the steady state only
    losses = []
    for step, tokens in enumerate(loader):
        if step == warmup:
            if device.type == "lazy":
                lazy_torch.wait_device_ops()
            start = time.perf_counter()
        tokens = tokens.to(device)
        opt.zero_grad()
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if device.type == "lazy":
            lazy_torch.mark_step()
        losses.append(loss.detach())
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {sched.get_last_lr()[0]:.2e}")
    lazy_torch.wait_device_ops()
    elapsed = time.perf_counter() - start
    steady = len(losses) - warmup
    print(f"floor log({data.fanout}) = {math.log(data.fanout):.4f}")
    print_summary(steady * args.batch * args.seq / elapsed, "tokens/s")


if __name__ == "__main__":
    main()
