"""torch.lazy, the device module of 'lazy': device queries, RNG state, torch.manual_seed, and
torch.utils.checkpoint, which saves and restores the RNG state through it."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import lazy_torch
from lazy_torch import LazyTensor, device_module


def test_registered_as_torch_lazy_with_cudas_queries():
    assert torch.lazy is device_module and torch.get_device_module("lazy") is device_module
    assert torch.lazy.is_available() and torch.lazy.device_count() == lazy_torch.device_count()
    assert torch.lazy.current_device() == 0 and torch.lazy._initialized
    assert not torch.lazy._is_in_bad_fork()
    with torch.lazy.device(0):
        assert torch.lazy.current_device() == 0
    torch.lazy.synchronize()
    # torch.manual_seed reaches lazy through one wrapped function of torch.random, wrapped once.
    seeds = torch.random._seed_custom_device
    assert seeds._seeds_lazy
    device_module.register()
    assert torch.lazy is device_module and torch.random._seed_custom_device is seeds


def test_rng_state_restored_draws_the_same_values_without_syncs():
    lazy_torch.manual_seed(0)
    torch.rand(3, device="lazy")  # a draw already made this step
    lazy_torch.metrics.reset()
    state = torch.lazy.get_rng_state()
    assert type(state) is LazyTensor and state.dtype == torch.uint8 and state.dim() == 1
    assert lazy_torch.metrics.counters().get("executions", 0) == 0  # reading it ran nothing
    a = [torch.randn(4, device="lazy"), torch.rand(2, device="lazy")]
    torch.lazy.set_rng_state(state)
    b = [torch.randn(4, device="lazy"), torch.rand(2, device="lazy")]
    lazy_torch.mark_step()
    assert all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(a, b))
    # A CPU copy of the state, restored in a later step, draws them again.
    cpu_state = state.cpu()
    torch.lazy.set_rng_state(cpu_state, "lazy:0")
    assert torch.equal(torch.randn(4, device="lazy").cpu(), a[0].cpu())
    with pytest.raises(RuntimeError, match="wrong size"):
        torch.lazy.set_rng_state(cpu_state[:-1])
    with pytest.raises(TypeError):
        torch.lazy.set_rng_state(cpu_state.float())


def test_reading_the_state_does_not_change_the_draws():
    lazy_torch.manual_seed(1)
    plain = [torch.rand(3, device="lazy").cpu() for _ in range(3)]
    lazy_torch.manual_seed(1)
    read = []
    for _ in range(3):
        torch.lazy.get_rng_state()
        read.append(torch.rand(3, device="lazy").cpu())
    assert all(torch.equal(x, y) for x, y in zip(plain, read))


def test_fork_rng_restores_the_lazy_stream():
    lazy_torch.manual_seed(2)
    expected = torch.rand(3, device="lazy").cpu()
    lazy_torch.manual_seed(2)
    with torch.random.fork_rng(devices=[0], device_type="lazy"):
        torch.rand(5, device="lazy")
    assert torch.equal(torch.rand(3, device="lazy").cpu(), expected)


class _Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.first, self.second, self.p = nn.Linear(8, 16), nn.Linear(16, 8), p

    def forward(self, x):
        return self.second(F.dropout(self.first(x).relu(), self.p, self.training))


class _Model(nn.Module):
    def __init__(self, p, use_checkpoint, use_reentrant=True, preserve_rng_state=True):
        super().__init__()
        self.blocks = nn.ModuleList(_Block(p) for _ in range(2))
        self.head, self.p = nn.Linear(8, 1), p
        self.checkpoint = use_checkpoint
        self.options = {"use_reentrant": use_reentrant, "preserve_rng_state": preserve_rng_state}

    def forward(self, x):
        x = F.dropout(x, self.p, self.training)  # a draw before the checkpoints
        for block in self.blocks:
            x = checkpoint(block, x, **self.options) if self.checkpoint else block(x)
        return self.head(F.dropout(x, self.p, self.training))


def _train(model, device, steps=3):
    model = copy.deepcopy(model).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    losses, grads = [], []
    torch.manual_seed(7)
    for _ in range(steps):
        x = torch.randn(4, 8, generator=g).to(device).requires_grad_()
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        grads.append([p.grad.cpu() for p in model.parameters()] + [x.grad.cpu()])
        opt.step()
        if device == "lazy":
            lazy_torch.mark_step()
        losses.append(loss.item())
    return losses, grads


def _assert_same(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=1e-5, atol=1e-6)
    for x, y in zip(a[1], b[1]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_without_dropout_trains_as_eager(use_reentrant):
    torch.manual_seed(0)
    model = _Model(0.0, True, use_reentrant)
    _assert_same(_train(model, "lazy"), _train(model, "cpu"))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_recomputes_dropout_with_the_forwards_masks(use_reentrant):
    # Lazy's random stream is its own (as CUDA's), so the oracle for the masks is the same lazy
    # model without checkpoint: recomputation that drew other masks would change the gradients.
    torch.manual_seed(0)
    plain = _Model(0.5, False)
    checkpointed = _Model(0.5, True, use_reentrant)
    checkpointed.load_state_dict(plain.state_dict())
    expected = _train(plain, "lazy")
    _assert_same(_train(checkpointed, "lazy"), expected)
    # Without restoring the RNG state, the recomputation draws other masks: the test can tell.
    unrestored = _Model(0.5, True, use_reentrant, preserve_rng_state=False)
    unrestored.load_state_dict(plain.state_dict())
    with pytest.raises(AssertionError):
        _assert_same(_train(unrestored, "lazy"), expected)
