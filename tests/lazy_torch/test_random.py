"""Random ops: fresh values every step, reproducible after manual_seed, never recompiled."""

import itertools
import re

import pytest
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
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(masks))
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


def _fallbacks():
    return {k: v for k, v in lazy_torch.metrics.counters().items() if k.startswith("fallback::")}


def test_like_factories_are_lowered_with_the_right_distributions():
    lazy_torch.manual_seed(0)
    x = torch.empty(20000, device="lazy")
    u, n = torch.rand_like(x), torch.randn_like(x, dtype=torch.float64)
    r = torch.randint_like(x, 7)
    r_low = torch.randint_like(x, -3, 4, dtype=torch.int32)
    r_tensor = torch.randint_like(x, torch.tensor(5), dtype=torch.int64)
    assert (u.dtype, n.dtype, r.dtype, r_low.dtype) == (
        x.dtype,
        torch.float64,
        x.dtype,
        torch.int32,
    )
    assert 0 <= u.min().item() and u.max().item() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    assert r.unique().tolist() == list(range(7)) and r_low.unique().tolist() == list(range(-3, 4))
    assert r_tensor.unique().tolist() == list(range(5))
    for t in (r, r_low, r_tensor):  # uniform over the range: every value about equally often
        counts = torch.bincount((t - t.min()).long().cpu()).double()
        assert (counts / counts.mean() - 1).abs().max() < 0.1
    assert not _fallbacks()


def test_low_precision_rand_like_stays_below_one():
    lazy_torch.manual_seed(0)
    u = torch.rand_like(torch.empty(100000, device="lazy", dtype=torch.bfloat16))
    assert u.dtype == torch.bfloat16 and u.max().item() < 1 and u.min().item() >= 0


def test_cauchy_and_log_normal_decompositions_draw_on_the_device():
    lazy_torch.manual_seed(0)
    c = torch.empty(20000, device="lazy").cauchy_(2.0, 0.5)
    ln = torch.empty(20000, device="lazy").log_normal_(1.0, 0.5)
    c, ln = c.cpu(), ln.cpu()
    assert abs(c.median().item() - 2.0) < 0.05
    assert abs(((c - 2.0).abs() < 0.5).double().mean().item() - 0.5) < 0.02  # quartiles at +-sigma
    assert ln.min().item() > 0
    assert abs(ln.log().mean().item() - 1.0) < 0.02 and abs(ln.log().std().item() - 0.5) < 0.02
    assert not _fallbacks()


def test_multinomial_with_replacement_frequencies():
    lazy_torch.manual_seed(0)
    p = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0], [2.0, 0.0, 0.0, 1.0, 1.0]])
    draws = torch.multinomial(p.to("lazy"), 20000, replacement=True)
    flat = torch.multinomial(p[0].to("lazy"), 20000, replacement=True)
    assert draws.shape == (2, 20000) and flat.shape == (20000,) and draws.dtype == torch.int64
    for row, probs in zip([*draws.cpu(), flat.cpu()], [*p, p[0]]):
        freq = torch.bincount(row, minlength=5).double() / row.numel()
        assert torch.all(freq[probs == 0] == 0)  # zero-probability categories are never drawn
        assert torch.allclose(freq, probs.double() / probs.sum(), atol=0.015)
    assert not _fallbacks()


def test_multinomial_without_replacement_draws_distinct_categories():
    lazy_torch.manual_seed(0)
    p = torch.tensor([0.5, 0.0, 0.2, 0.1, 0.0, 0.2])
    batch = p.expand(4000, 6).contiguous().to("lazy")
    draws = torch.multinomial(batch, 4).cpu()
    assert draws.shape == (4000, 4)
    assert all(len(set(row)) == 4 for row in draws.tolist())
    assert not torch.isin(draws, torch.tensor([1, 4])).any()
    # The first draw of each row follows p; later draws renormalize over what is left.
    first = torch.bincount(draws[:, 0], minlength=6).double() / 4000
    assert torch.allclose(first, p.double(), atol=0.03)
    # Drawing every category with nonzero weight draws each exactly once.
    all_of_them = torch.multinomial(p.to("lazy"), 4).cpu()
    assert sorted(all_of_them.tolist()) == [0, 2, 3, 5]
    assert not _fallbacks()


def test_multinomial_argument_errors_match_eager():
    for args in [(torch.ones(5), 7), (torch.ones(5), 0), (torch.ones(2, 2, 2), 1)]:
        with pytest.raises(RuntimeError) as eager:
            torch.multinomial(*args)
        with pytest.raises(RuntimeError, match=re.escape(str(eager.value))):
            torch.multinomial(args[0].to("lazy"), *args[1:])


def test_rrelu_training_writes_noise_and_its_gradient():
    lazy_torch.manual_seed(0)
    x_cpu = torch.randn(20000)
    x = x_cpu.to("lazy").requires_grad_()
    y = F.rrelu(x, 0.1, 0.3, training=True)
    (grad,) = torch.autograd.grad(y.sum(), x)
    y, grad = y.detach().cpu(), grad.cpu()
    negative = x_cpu <= 0
    slope = y[negative] / x_cpu[negative]
    assert torch.equal(y[~negative], x_cpu[~negative])
    assert 0.1 <= slope.min().item() and slope.max().item() <= 0.3
    assert abs(slope.mean().item() - 0.2) < 0.005
    assert torch.equal(grad[~negative], torch.ones(int((~negative).sum())))
    assert torch.allclose(grad[negative], slope)  # backward multiplies by the drawn noise
    inplace = x_cpu.to("lazy")
    F.rrelu(inplace, 0.1, 0.3, training=True, inplace=True)
    assert torch.equal(inplace.cpu()[~negative], x_cpu[~negative])
    assert not torch.equal(inplace.cpu(), x_cpu)
    evaluation = F.rrelu(x_cpu.to("lazy"), 0.1, 0.3, training=False)
    torch.testing.assert_close(evaluation.cpu(), F.rrelu(x_cpu, 0.1, 0.3, training=False))
    assert not _fallbacks()


@pytest.mark.parametrize("n", [2, 3])
def test_fractional_max_pool_matches_eager_for_given_samples(n):
    torch.manual_seed(0)
    pool = F.fractional_max_pool2d if n == 2 else F.fractional_max_pool3d
    shape = (2, 3, 11, 9) if n == 2 else (2, 3, 7, 8, 9)
    x = torch.randn(shape).round(decimals=1)  # ties: the first maximum wins
    x[0, 0].view(-1)[:5] = float("nan")
    samples = torch.rand(2, 3, n)
    kw = {"output_size": (5, 4) if n == 2 else (4, 3, 5), "return_indices": True}
    expected, expected_index = pool(x.requires_grad_(), 3, _random_samples=samples, **kw)
    lx = x.detach().to("lazy").requires_grad_()
    got, index = pool(lx, 3, _random_samples=samples.to("lazy"), **kw)
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    assert torch.equal(index.cpu(), expected_index)
    cotangent = torch.randn(expected.shape)
    (eager_grad,) = torch.autograd.grad(expected, x, cotangent)
    (lazy_grad,) = torch.autograd.grad(got, lx, cotangent.to("lazy"))
    torch.testing.assert_close(lazy_grad.cpu(), eager_grad)
    unbatched = pool(lx[0], 2, output_size=kw["output_size"])
    assert unbatched.shape == expected.shape[1:]
    assert not _fallbacks()


def _random_step(x, p):
    return (
        torch.rand_like(x),
        torch.randint_like(x, 0, 100),
        torch.multinomial(p, 3),
        torch.multinomial(p, 5, replacement=True),
        F.rrelu(x, training=True),
        F.fractional_max_pool2d(x, 2, output_size=(6, 6)),
    )


def test_new_random_ops_fresh_each_step_and_reproducible():
    x = torch.randn(1, 2, 16, 16).to("lazy")
    p = torch.ones(4, 10, device="lazy")
    lazy_torch.manual_seed(3)
    runs = []
    for _ in range(2):
        lazy_torch.manual_seed(3)
        steps = []
        for _ in range(4):
            outs = _random_step(x, p)
            lazy_torch.mark_step()
            steps.append([o.cpu() for o in outs])
        runs.append(steps)
    for a, b in zip(runs[0], runs[1]):  # the same values after the same seed
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    for a, b in itertools.pairwise(runs[0]):  # fresh values every step
        assert all(not torch.equal(u, v) for u, v in zip(a, b))
    counters = lazy_torch.metrics.counters()
    assert counters["compiles"] <= 3, counters
    assert not _fallbacks()


def test_randperm_draws_fresh_permutations_on_the_device():
    lazy_torch.manual_seed(0)
    perms = []
    for _ in range(600):
        perms.append(torch.randperm(6, device="lazy"))
        lazy_torch.mark_step()
    perms = torch.stack([p.cpu() for p in perms])
    assert perms.dtype == torch.int64
    assert torch.equal(perms.sort(dim=1).values, torch.arange(6).expand(600, 6))
    # Each value lands in each position about equally often (100 times; sd about 9).
    counts = torch.stack([torch.bincount(perms[:, i], minlength=6) for i in range(6)])
    assert (counts / 100.0 - 1).abs().max() < 0.4
    assert torch.randperm(5, device="lazy", dtype=torch.float32).dtype == torch.float32
    assert lazy_torch.metrics.counters()["compiles"] <= 3
    assert not _fallbacks()


def test_torch_manual_seed_seeds_the_lazy_device():
    # As it seeds CUDA: the same draws as lazy_torch.manual_seed, reproducibly.
    lazy_torch.manual_seed(5)
    expected = [torch.randn(4, device="lazy").cpu(), torch.rand(3, device="lazy").cpu()]
    for seed_with in (torch.manual_seed, torch.random.manual_seed):
        torch.rand(2, device="lazy").cpu()  # the stream moved on
        seed_with(5)
        got = [torch.randn(4, device="lazy").cpu(), torch.rand(3, device="lazy").cpu()]
        assert all(torch.equal(a, b) for a, b in zip(got, expected))
    torch.manual_seed(6)
    assert not torch.equal(torch.randn(4, device="lazy").cpu(), expected[0])
    torch.seed()  # a non-deterministic seed, for lazy devices too
    assert lazy_torch.device_module.initial_seed() == torch.initial_seed()
    torch.manual_seed(0)


def test_observation_loops_of_random_draws_replay_one_graph():
    # Each .cpu() moves the RNG state past its draws and makes it device data, so the next draw
    # starts from data again: the same graph every iteration, fresh values.
    def loop(n):
        return [torch.randn(2, device="lazy").cpu() for _ in range(n)]

    lazy_torch.manual_seed(3)
    lazy_torch.metrics.reset()
    first = loop(8)
    counters = lazy_torch.metrics.counters()
    assert counters["compiles"] <= 2 and counters.get("cache_hits", 0) >= 6, counters
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(first, 2))
    lazy_torch.manual_seed(3)
    assert all(torch.equal(a, b) for a, b in zip(loop(8), first))
    # The values do not depend on where the step was observed: drawn without syncs, the same.
    lazy_torch.manual_seed(3)
    unobserved = [torch.randn(2, device="lazy") for _ in range(8)]
    assert all(torch.equal(a.cpu(), b) for a, b in zip(unobserved, first))
    # Steps that observe their draws replay the same graphs too.
    lazy_torch.metrics.reset()
    for _ in range(4):
        loop(2)
        lazy_torch.mark_step()
    assert lazy_torch.metrics.counters().get("compiles", 0) == 0, lazy_torch.metrics.counters()


def test_every_random_lowering_gets_the_device_rng_state():
    # A random lowering recorded without the RNG operands failed to compile ("unexpected PRNG
    # key type"): torch.normal(mean, std, size, out=) reached normal.float_float that way.
    from lazy_torch import dispatch, ops
    from lowerings.registry import LOWERINGS, category

    random_ops = [n for n in LOWERINGS if n.startswith("aten.") and category(n) == "random"]
    assert len(random_ops) > 20
    for name in random_ops:
        packet, _, overload = name.removeprefix("aten.").partition(".")
        func = getattr(getattr(torch.ops.aten, packet), overload)
        handler = dispatch.handler_of(func)
        assert handler.__module__ == ops.__name__, name
    o = torch.empty(0, device="lazy")
    torch.normal(1.5, 0.25, (4,), out=o)
    assert o.shape == (4,) and torch.isfinite(o.cpu()).all()
    u = torch.ops.aten.uniform.default(torch.zeros(3, device="lazy"), 2.0, 3.0)
    assert ((u.cpu() >= 2.0) & (u.cpu() < 3.0)).all()
