"""Training features around the step: checkpoints, DeviceLoader, gradient accumulation, eval
loops, and data-dependent Python control flow inside forward; eager CPU is the oracle."""

import copy
import io
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lazy_torch
from tests.lazy_torch.models import data, mlp


def _step(model, opt, x, y, device):
    opt.zero_grad()
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    if device != "cpu":
        lazy_torch.mark_step()
    return loss


def _run(model, opt, batches, device):
    return [_step(model, opt, x, y, device).item() for x, y in batches]


def _fresh(model, device):
    model = copy.deepcopy(model).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-3)


def test_checkpoint_loads_as_eagers_and_resumes_exactly():
    torch.manual_seed(0)
    base, batches = mlp(), data("mlp", 6)
    model, opt = _fresh(base, "lazy")
    _run(model, opt, batches[:3], "lazy")
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    uninterrupted = _run(model, opt, batches[3:], "lazy")

    def tensors(checkpoint):
        state = checkpoint["opt"]["state"].values()
        return list(checkpoint["model"].values()) + [v for s in state for v in s.values()]

    # As a CUDA checkpoint: back on its device, or plain CPU tensors with map_location="cpu";
    # weights_only loads it either way.
    buffer.seek(0)
    on_device = tensors(torch.load(buffer, weights_only=True))
    assert {t.device.type for t in on_device} == {"lazy", "cpu"}  # Adam's steps stay on the CPU
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True, map_location="cpu")
    assert all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors(checkpoint))

    for device in ("lazy", "cpu"):
        resumed, resumed_opt = _fresh(base, device)
        resumed.load_state_dict(checkpoint["model"])
        resumed_opt.load_state_dict(checkpoint["opt"])
        losses = _run(resumed, resumed_opt, batches[3:], device)
        # Same device: the same computation, bit for bit. Eager CPU: Adam's state from the lazy
        # run meets eager's gradients, whose rounding-level entries it turns into lr-sized steps.
        rtol = 1e-6 if device == "lazy" else 1e-3
        torch.testing.assert_close(losses, uninterrupted, rtol=rtol, atol=1e-6)


def test_loading_mismatched_shapes_gives_pytorchs_error():
    lazy = nn.Linear(4, 3).to("lazy")
    state = nn.Linear(5, 3).state_dict()
    with pytest.raises(RuntimeError) as eager:
        nn.Linear(4, 3).load_state_dict(state)
    with pytest.raises(RuntimeError) as got:
        lazy.load_state_dict(state)
    assert str(got.value) == str(eager.value)


def test_device_loader_prefetches_on_a_thread_and_matches_eager():
    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            return {"x": torch.randn(20, generator=g), "y": torch.tensor(i % 5)}

    loader = torch.utils.data.DataLoader(Pairs(), batch_size=6)
    torch.manual_seed(0)
    base = mlp()
    threads = set()
    got = []
    model, opt = _fresh(base, "lazy")
    for batch in lazy_torch.DeviceLoader(loader):
        threads.update(t.name for t in threading.enumerate())
        assert batch["x"].device.type == "lazy" and batch["y"].dtype == torch.int64
        got.append(_step(model, opt, batch["x"], batch["y"], "lazy"))
    assert len(got) == len(loader) == len(lazy_torch.DeviceLoader(loader))
    assert "lazy-device-loader" in threads
    model, opt = _fresh(base, "cpu")
    expected = [_step(model, opt, b["x"], b["y"], "cpu").item() for b in loader]
    torch.testing.assert_close([l.item() for l in got], expected, rtol=1e-5, atol=1e-6)


def test_device_loader_raises_the_loaders_error_in_the_loop():
    def broken():
        yield torch.ones(2)
        raise ValueError("bad batch")

    it = iter(lazy_torch.DeviceLoader(broken()))
    assert next(it).device.type == "lazy"
    with pytest.raises(ValueError, match="bad batch"):
        next(it)


def test_gradient_accumulation_and_eval_loops_compile_once():
    torch.manual_seed(0)
    base, batches = mlp(), data("mlp", 12, batch=8)
    results = {}
    for device in ("cpu", "lazy"):
        model, opt = _fresh(base, device)
        losses, compiles = [], []
        for step in range(3):
            opt.zero_grad()
            for x, y in batches[4 * step : 4 * step + 4]:  # four micro-batches per step
                loss = F.cross_entropy(model(x.to(device)), y.to(device)) / 4
                loss.backward()
                losses.append(loss)
            opt.step()
            model.eval()
            with torch.no_grad():
                val = [F.cross_entropy(model(x.to(device)), y.to(device)) for x, y in batches[:2]]
            model.train()
            losses += val
            if device == "lazy":
                before = lazy_torch.metrics.counters().get("compiles", 0)
                lazy_torch.mark_step()
                compiles.append(lazy_torch.metrics.counters().get("compiles", 0) - before)
        results[device] = [l.item() for l in losses]
    torch.testing.assert_close(results["lazy"], results["cpu"], rtol=1e-5, atol=1e-6)
    assert compiles[2:] == [0], compiles


class _EarlyExit(nn.Module):
    """Data-dependent Python control flow: ``.item()`` in forward decides the path."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(20, 5), nn.Linear(20, 5)

    def forward(self, x):
        if x.mean().item() > 0:
            return self.a(x)
        return self.b(x)


def test_item_inside_forward_trains_correctly_and_is_reported():
    torch.manual_seed(0)
    base, batches = _EarlyExit(), data("mlp", 6)
    model, opt = _fresh(base, "lazy")
    lazy_torch.metrics.reset()
    got = _run(model, opt, batches, "lazy")
    model, opt = _fresh(base, "cpu")
    torch.testing.assert_close(got, _run(model, opt, batches, "cpu"), rtol=1e-5, atol=1e-6)
    assert lazy_torch.metrics.counters()["syncs::item"] >= len(batches)
    report = lazy_torch.metrics.report()
    assert "syncs::item" in report and "test_training_features.py" in report
