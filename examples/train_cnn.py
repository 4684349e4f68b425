"""Train a small CNN with batch norm on synthetic images on device='lazy'."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
from _summary import print_summary


class Net(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--device", default="lazy", help="'lazy' (default) or 'cpu' for eager")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    templates = torch.randn(10, 3, 32, 32, generator=g)  # one noisy template per class
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    warmup = 3  # the first steps compile; steps/s below counts the steady state only
    for step in range(args.steps):
        if step == warmup:
            if device.type == "lazy":
                lazy_torch.wait_device_ops()
            start = time.perf_counter()
        labels = torch.randint(0, 10, (args.batch,), generator=g)
        images = templates[labels] + 0.8 * torch.randn(args.batch, 3, 32, 32, generator=g)
        opt.zero_grad()
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        loss.backward()
        opt.step()
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
