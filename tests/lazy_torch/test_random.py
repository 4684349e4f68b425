"""Random ops: fresh values every step, reproducible after manual_seed, never recompiled."""

import torch
import torch.nn.functional as F

import lazy_torch


def _dropout_masks(steps):
    x = torch.ones(64, 64, device="lazy")
    masks = []
    for _ in range(steps):
        y = F.dropout(x, p=0.5, training=True)
        lazy_torch.mark_step()
        masks.append(y.cpu())
    return masks


def test_dropout_fresh_masks_each_step_without_recompiles():
    lazy_torch.manual_seed(1)
    masks = _dropout_masks(5)
    for m in masks:
        assert set(m.unique().tolist()) <= {0.0, 2.0}  # kept values scaled by 1 / (1 - p)
        assert 0.4 < (m == 0).float().mean().item() < 0.6
    assert all(not torch.equal(a, b) for a, b in zip(masks, masks[1:]))
    counters = lazy_torch.metrics.counters()
    assert counters["compiles"] <= 2, counters


def test_manual_seed_reproduces_sequences():
    lazy_torch.manual_seed(7)
    first = _dropout_masks(3) + [torch.randn(5, device="lazy").cpu()]
    lazy_torch.manual_seed(7)
    second = _dropout_masks(3) + [torch.randn(5, device="lazy").cpu()]
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    lazy_torch.manual_seed(8)
    assert not torch.equal(_dropout_masks(1)[0], first[0])


def test_distributions_have_the_right_moments():
    lazy_torch.manual_seed(0)
    n = torch.randn(20000, device="lazy")
    u = torch.rand(20000, device="lazy")
    r = torch.randint(3, 9, (20000,), device="lazy")
    b = torch.empty(20000, device="lazy").bernoulli_(0.3)
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert r.dtype == torch.int64 and r.min().item() == 3 and r.max().item() == 8
    assert abs(b.mean().item() - 0.3) < 0.02
    assert n.dtype == torch.float32 and u.shape == (20000,)
