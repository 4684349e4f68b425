"""Train a small transformers ViT classifier on synthetic 32x32 images on device='lazy'."""

import argparse
import time

import torch
import transformers
from _summary import print_summary

import lazy_torch


def vit(classes: int, hidden: int, layers: int) -> transformers.ViTForImageClassification:
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.0,
        num_labels=classes,
    )
    return transformers.ViTForImageClassification(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--device", default="lazy", help="'lazy' (default) or 'cpu' for eager")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    classes = 10
    g = torch.Generator().manual_seed(0)
    templates = torch.randn(classes, 3, 32, 32, generator=g)  # one noisy template per class
    model = vit(classes, args.hidden, args.layers).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    print(f"ViT: {sum(p.numel() for p in model.parameters())} parameters on {device}")

    warmup = 3  # the first steps compile; images/s below counts the steady state only
    for step in range(args.steps):
        if step == warmup:
            if device.type == "lazy":
                lazy_torch.wait_device_ops()
            start = time.perf_counter()
        labels = torch.randint(0, classes, (args.batch,), generator=g)
        images = templates[labels] + 0.8 * torch.randn(args.batch, 3, 32, 32, generator=g)
        opt.zero_grad()
        loss = model(pixel_values=images.to(device), labels=labels.to(device)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if device.type == "lazy":
            lazy_torch.mark_step()
        if step % args.print_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    lazy_torch.wait_device_ops()
    elapsed = time.perf_counter() - start
    steady = args.steps - warmup
    print_summary(steady * args.batch / elapsed, "images/s")


if __name__ == "__main__":
    main()
