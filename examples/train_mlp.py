"""Train an MLP classifier on a synthetic data set on device='lazy' (the README's main example)."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
from _summary import print_summary


def synthetic_data(n: int, features: int, classes: int, seed: int = 0):
    """Points around one random centre per class: learnable, so the loss visibly falls."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=g) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    return centres[labels] + torch.randn(n, features, generator=g), labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--print-every", type=int, default=50)
    parser.add_argument("--device", default="lazy", help="'lazy' (default) or 'cpu' for eager")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    x, y = synthetic_data(8192, 32, 10)
    model = nn.Sequential(
        nn.Linear(32, 256),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Linear(256, 256),
        nn.ReLU(),
        nn.Linear(256, 10),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    warmup = 3  # the first steps compile; steps/s below counts the steady state only
    for step in range(args.steps):
        if step == warmup:
            if device.type == "lazy":
                lazy_torch.wait_device_ops()
            start = time.perf_counter()
        idx = torch.randint(0, x.shape[0], (args.batch,))
        xb, yb = x[idx].to(device), y[idx].to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        sched.step()
        if device.type == "lazy":
            lazy_torch.mark_step()
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    lazy_torch.wait_device_ops()
    elapsed = time.perf_counter() - start
    steady = args.steps - warmup
    print_summary(steady / elapsed, "steps/s")


if __name__ == "__main__":
    main()
