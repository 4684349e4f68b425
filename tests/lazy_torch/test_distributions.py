"""torch.distributions on lazy tensors: argument checks recorded (no CPU fallback), a sampling
loop's log-probs, entropies and gradients equal to eager, eager's errors for bad arguments."""

import copy

import pytest
import torch

import lazy_torch

D = torch.distributions


@pytest.fixture(autouse=True)
def _validated_arguments():
    # Validation is what calls torch._is_all_true; keep it on whatever the interpreter's mode.
    previous = D.Distribution._validate_args
    D.Distribution.set_default_validate_args(True)
    yield
    D.Distribution.set_default_validate_args(previous)


def _fallbacks() -> dict[str, int]:
    return {k: v for k, v in lazy_torch.metrics.counters().items() if k.startswith("fallback::")}


_BOOLS = [
    torch.tensor(True),
    torch.tensor(False),
    torch.zeros(0, dtype=torch.bool),
    torch.ones(3, 4, dtype=torch.bool),
    torch.tensor([[True, False], [True, True]]),
    torch.zeros(2, 3, dtype=torch.bool),
]


@pytest.mark.parametrize("op", [torch._is_all_true, torch._is_any_true])
@pytest.mark.parametrize("x", _BOOLS, ids=lambda x: f"{tuple(x.shape)}:{x.sum().item()}")
def test_is_all_true_and_is_any_true_are_recorded(op, x):
    got = op(x.to("lazy"))
    expected = op(x)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    assert got.item() is expected.item()
    assert _fallbacks() == {}


@pytest.mark.parametrize("op", [torch._is_all_true, torch._is_any_true])
def test_is_all_true_of_a_view_reads_the_view(op):
    x = torch.tensor([[True, False], [True, True]])
    view = x.to("lazy").t()[1]  # [False, True]: neither all nor none
    assert op(view).item() is op(x.t()[1]).item()
    assert _fallbacks() == {}


@pytest.mark.parametrize("op", [torch._is_all_true, torch._is_any_true])
def test_is_all_true_rejects_non_bool_like_eager(op):
    with pytest.raises(Exception) as eager:
        op(torch.ones(2))
    with pytest.raises(type(eager.value)):
        op(torch.ones(2, device="lazy"))


def _build(name: str, dev: str):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, generator=g).to(dev)
    loc = torch.randn(5, generator=g).to(dev)
    scale = (torch.rand(5, generator=g) + 0.5).to(dev)
    return {
        "Categorical": lambda: D.Categorical(logits=logits),
        "Categorical_probs": lambda: D.Categorical(probs=logits.softmax(-1)),
        "OneHotCategorical": lambda: D.OneHotCategorical(logits=logits),
        "Normal": lambda: D.Normal(loc, scale),
        "Bernoulli": lambda: D.Bernoulli(logits=loc),
        "Uniform": lambda: D.Uniform(loc, loc + scale),
        "Laplace": lambda: D.Laplace(loc, scale),
        "Exponential": lambda: D.Exponential(scale),
        "Geometric": lambda: D.Geometric(logits=loc),
        "MultivariateNormal": lambda: D.MultivariateNormal(loc[:3], scale_tril=scale[:3].diag()),
        "Independent": lambda: D.Independent(D.Normal(loc, scale), 1),
        "TanhNormal": lambda: D.TransformedDistribution(
            D.Normal(loc, scale), [D.transforms.TanhTransform(cache_size=1)]
        ),
    }[name]()


@pytest.mark.parametrize(
    "name",
    [
        "Categorical",
        "Categorical_probs",
        "OneHotCategorical",
        "Normal",
        "Bernoulli",
        "Uniform",
        "Laplace",
        "Exponential",
        "Geometric",
        "MultivariateNormal",
        "Independent",
        "TanhNormal",
    ],
)
def test_distribution_log_prob_of_its_samples_matches_eager_without_fallback(name):
    lazy_torch.manual_seed(0)
    lazy = _build(name, "lazy")
    sample = lazy.sample((4,))
    log_prob = lazy.log_prob(sample)
    eager = _build(name, "cpu")
    # A sample is valid for eager's own support check, and eager gives it the same log-prob.
    expected = eager.log_prob(sample.cpu())
    torch.testing.assert_close(log_prob.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert sample.shape == eager.sample((4,)).shape
    assert _fallbacks() == {}


class _Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh())
        self.action = torch.nn.Linear(32, 3)  # Categorical logits
        self.mu = torch.nn.Linear(32, 2)  # Normal mean; scale from a free parameter
        self.log_sigma = torch.nn.Parameter(torch.full((2,), -0.5))
        self.gate = torch.nn.Linear(32, 1)  # Bernoulli logits

    def forward(self, state):
        h = self.body(state)
        return self.action(h), self.mu(h), self.log_sigma.exp(), self.gate(h).squeeze(-1)


def _step_loss(policy, state, drawn=None):
    """One policy step; ``drawn`` (eager) replays the lazy run's draws, else they are drawn.

    Returns the loss, the draws (action, Normal noise, Bernoulli gate) and the parts compared.
    """
    logits, mu, sigma, gate_logits = policy(state)
    pick = D.Categorical(logits=logits)
    normal = D.Normal(mu, sigma)
    gate = D.Bernoulli(logits=gate_logits)
    if drawn is None:
        action = pick.sample()
        x = normal.rsample()
        noise = ((x - mu) / sigma).detach()
        g = gate.sample()
    else:
        action, noise, g = drawn
        x = mu + sigma * noise  # what rsample computes from its noise
    parts = (pick.log_prob(action), pick.entropy(), normal.log_prob(x).sum(), gate.log_prob(g))
    loss = -(parts[0] + 0.01 * parts[1] + parts[2] + parts[3] + x.pow(2).sum())
    return loss, (action, noise, g), parts


def test_policy_gradient_loop_matches_eager_without_fallback():
    torch.manual_seed(0)
    eager_policy = _Policy()
    lazy_policy = copy.deepcopy(eager_policy).to("lazy")
    eager_opt = torch.optim.SGD(eager_policy.parameters(), lr=0.05)
    lazy_opt = torch.optim.SGD(lazy_policy.parameters(), lr=0.05)
    states = torch.randn(3, 5, 4)
    lazy_torch.manual_seed(0)
    actions = []
    for episode in states:
        for opt in (eager_opt, lazy_opt):
            opt.zero_grad()
        for state in episode:
            loss, drawn, parts = _step_loss(lazy_policy, state.to("lazy"))
            action = drawn[0].item()  # the environment observes the action every step
            assert action in (0, 1, 2) and drawn[2].item() in (0.0, 1.0)
            actions.append(action)
            loss.backward()
            eager_drawn = tuple(d.cpu() for d in drawn)
            eager_loss, _, eager_parts = _step_loss(eager_policy, state, eager_drawn)
            eager_loss.backward()
            for got, expected in zip(parts, eager_parts):
                torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(loss.cpu(), eager_loss, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(lazy_policy.named_parameters(), eager_policy.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
        lazy_opt.step()
        eager_opt.step()
        lazy_torch.mark_step()
    for p, q in zip(lazy_policy.parameters(), eager_policy.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)
    assert len(set(actions)) > 1  # the draws are fresh, not one value baked in
    assert _fallbacks() == {}


def _bad_arguments(dev: str) -> dict:
    return {
        "Categorical negative probs": lambda: D.Categorical(
            probs=torch.tensor([-1.0, 2.0], device=dev)
        ),
        "Normal negative scale": lambda: D.Normal(
            torch.zeros(2, device=dev), torch.tensor([1.0, -1.0], device=dev)
        ),
        "Normal NaN scale": lambda: D.Normal(
            torch.zeros(2, device=dev), torch.tensor([1.0, float("nan")], device=dev)
        ),
        "Bernoulli probs above 1": lambda: D.Bernoulli(probs=torch.tensor([0.5, 1.5], device=dev)),
        "Categorical value out of support": lambda: D.Categorical(
            logits=torch.zeros(3, device=dev)
        ).log_prob(torch.tensor(5, device=dev)),
        "Normal value NaN": lambda: D.Normal(
            torch.zeros(2, device=dev), torch.ones(2, device=dev)
        ).log_prob(torch.tensor([0.0, float("nan")], device=dev)),
    }


@pytest.mark.parametrize("case", list(_bad_arguments("cpu")))
def test_bad_arguments_raise_eagers_error(case):
    with pytest.raises(Exception) as eager:
        _bad_arguments("cpu")[case]()
    with pytest.raises(type(eager.value)) as lazy:
        _bad_arguments("lazy")[case]()
    # The message's first line names the parameter and the constraint; it says "LazyTensor of
    # shape" where eager says "Tensor of shape" (type(value).__name__ of the subclass).
    first_line = str(lazy.value).splitlines()[0].replace("LazyTensor", "Tensor")
    assert first_line == str(eager.value).splitlines()[0]
    assert _fallbacks() == {}
