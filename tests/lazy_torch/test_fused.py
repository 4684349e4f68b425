"""``fused=True`` optimizers on lazy parameters (lazy_torch/fused.py), against eager CPU's fused
kernels: parameters, optimizer state and gradients after each step."""

import pytest
import torch

import lazy_torch

CONFIGS = {
    "adamw": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01}),
    "adam_amsgrad_maximize": (
        torch.optim.Adam,
        {"lr": 0.05, "amsgrad": True, "maximize": True, "weight_decay": 0.1},
    ),
    "adam_tensor_lr": (torch.optim.Adam, {"lr": torch.tensor(0.02), "betas": (0.8, 0.9)}),
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.2}),
    "sgd_nesterov": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05, "maximize": True},
    ),
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v.cpu() for s in opt.state.values() for _, v in sorted(s.items())]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_optimizer_steps_match_eager(name):
    cls, kwargs = CONFIGS[name]
    eager, lazy = _model(), _model().to("lazy")
    x, y = torch.randn(6, 5), torch.randn(6, 2)
    opts = [cls(m.parameters(), fused=True, **kwargs) for m in (eager, lazy)]
    for _ in range(3):
        for model, opt, inputs in ((eager, opts[0], (x, y)), (lazy, opts[1], (x, y))):
            if model is lazy:
                inputs = tuple(t.to("lazy") for t in inputs)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(inputs[0]), inputs[1]).backward()
            opt.step()
        lazy_torch.mark_step()
        for p, q in zip(eager.parameters(), lazy.parameters()):
            torch.testing.assert_close(q.cpu(), p)
        for a, b in zip(_state(opts[0]), _state(opts[1])):
            torch.testing.assert_close(b, a)
    counters = lazy_torch.metrics.counters()
    assert not [k for k in counters if k.startswith("fallback::")]


def _tensors(seed: int, device: str) -> list[list[torch.Tensor]]:
    torch.manual_seed(seed)
    lists = [[torch.randn(3, 2), torch.randn(4)] for _ in range(5)]
    lists[3:] = [[t.abs() for t in ts] for ts in lists[3:]]  # second moments
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    return [[t.to(device) for t in ts] for ts in (*lists, steps)]


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
@pytest.mark.parametrize("op", ["_fused_adam_", "_fused_adamw_"])
def test_a_grad_scale_unscales_the_grads_and_found_inf_skips_the_step(op, found_inf):
    kwargs = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1, "eps": 1e-8}
    results = []
    for device in ("cpu", "lazy"):
        lists = _tensors(0, device)
        scale, inf = torch.tensor(4.0).to(device), torch.tensor(found_inf).to(device)
        getattr(torch, op)(
            *lists, **kwargs, amsgrad=True, maximize=False, grad_scale=scale, found_inf=inf
        )
        results.append([t.cpu() for ts in lists for t in ts])
    before = [t for ts in _tensors(0, "cpu") for t in ts]
    for got, expected, old in zip(results[1], results[0], before):
        torch.testing.assert_close(got, expected)
        if found_inf:
            torch.testing.assert_close(got, old)


@pytest.mark.parametrize("fused", [True, None], ids=["fused", "default"])
def test_changing_the_learning_rate_does_not_recompile(fused):
    model = _model().to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    x = torch.randn(6, 5, device="lazy")
    compiles = []
    for step in range(5):
        for group in opt.param_groups:
            group["lr"] = 0.1 / (step + 1)
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        lazy_torch.mark_step()
        compiles.append(lazy_torch.metrics.counters().get("compiles", 0))
    # the first step also makes the moments; the second and later steps run one graph
    assert compiles[-1] == compiles[1]


def test_mismatched_lists_raise_at_the_call():
    params = [torch.zeros(3, device="lazy")]
    grads = [torch.zeros(4, device="lazy")]
    with pytest.raises(RuntimeError, match=r"grads holds a tensor of shape \(4,\)"):
        torch._fused_sgd_(
            params, grads, [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0,
            nesterov=False, maximize=False, is_first_step=True,
        )  # fmt: skip


def test_a_tensor_on_another_device_raises_pytorchs_device_mismatch():
    params = [torch.zeros(3, device="lazy")]
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch._fused_sgd_(
            params, [torch.zeros(3)], [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0,
            nesterov=False, maximize=False, is_first_step=True,
        )  # fmt: skip


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_amp_unscale_matches_eager(bad):
    results = []
    for device in ("cpu", "lazy"):
        torch.manual_seed(0)
        grads = [torch.randn(3, 2), torch.randn(5).to(torch.float16)]
        if bad is not None:
            grads[1][2] = bad
        found_inf, inv_scale = torch.tensor(0.0), torch.tensor(0.25)
        tensors = [t.to(device) for t in (*grads, found_inf, inv_scale)]
        torch._amp_foreach_non_finite_check_and_unscale_(tensors[:2], tensors[2], tensors[3])
        results.append([t.cpu() for t in tensors])
    for got, expected in zip(*reversed(results)):
        torch.testing.assert_close(got, expected, equal_nan=True)


@pytest.mark.parametrize(
    ("scale", "tracker", "found_inf"),
    [(8.0, 0, 0.0), (8.0, 2, 0.0), (8.0, 2, 1.0), (3e38, 2, 0.0)],  # the last would overflow
)
def test_amp_update_scale_matches_eager(scale, tracker, found_inf):
    results = []
    for device in ("cpu", "lazy"):
        s, t = torch.tensor(scale).to(device), torch.tensor(tracker, dtype=torch.int32).to(device)
        out = torch._amp_update_scale_(s, t, torch.tensor(found_inf).to(device), 2.0, 0.5, 3)
        assert out is s
        results.append((s.cpu(), t.cpu()))
    for got, expected in zip(*results[::-1]):
        torch.testing.assert_close(got, expected)


def test_grad_scaler_with_a_fused_optimizer_stays_on_the_device():
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    runs = []
    for device in ("cpu", "lazy"):
        model = _model().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
        scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_interval=2)
        scales = []
        for step in range(6):
            opt.zero_grad()
            loss = model(x.to(device)).square().mean() * (float("inf") if step == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)  # skipped where the gradients are not finite
            scaler.update()
            if device == "lazy":
                lazy_torch.mark_step()
            scales.append(scaler.get_scale())
        runs.append((scales, [p.detach().cpu() for p in model.parameters()]))
    assert runs[1][0] == runs[0][0] == [1024.0, 512.0, 512.0, 1024.0, 1024.0, 2048.0]
    for got, expected in zip(runs[1][1], runs[0][1]):
        torch.testing.assert_close(got, expected)
    counters = lazy_torch.metrics.counters()
    assert not [k for k in counters if k.startswith("fallback::")]
    assert [k for k in counters if k.startswith("syncs::")] == ["syncs::mark_step"]


def test_fused_adamw_on_bfloat16_parameters_matches_eager():
    # Both compute in float32 and store bfloat16. (Eager CPU's fused SGD left bfloat16 matrices
    # unchanged in torch 2.13, so SGD is compared in float32 only.)
    eager, lazy = _model().to(torch.bfloat16), _model().to(torch.bfloat16).to("lazy")
    x = torch.randn(6, 5, dtype=torch.bfloat16)
    opts = [torch.optim.AdamW(m.parameters(), lr=0.05, fused=True) for m in (eager, lazy)]
    for _ in range(3):
        for model, opt, inputs in ((eager, opts[0], x), (lazy, opts[1], x.to("lazy"))):
            opt.zero_grad()
            model(inputs).float().square().mean().backward()
            opt.step()
        lazy_torch.mark_step()
    for p, q in zip(eager.parameters(), lazy.parameters()):
        assert q.dtype == torch.bfloat16
        # One bfloat16 step apart at most: a GPU's bfloat16 matmuls round unlike the CPU's.
        torch.testing.assert_close(q.cpu(), p, atol=4e-3, rtol=1.6e-2)


# PyTorch's default (foreach) Adam, AdamW and SGD on lazy parameters run as the fused step.
ROUTED = {
    "adamw": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.01}),
    "adam_amsgrad_maximize": (
        torch.optim.Adam,
        {"lr": 0.05, "amsgrad": True, "maximize": True, "weight_decay": 0.1},
    ),
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    # momentum and dampening one number object: still two graph scalars
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.5}),
    "sgd_nesterov": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.05, "maximize": True},
    ),
}


def _pending_ops() -> list[str]:
    from lazy_core import cut_graph, pending_storages

    return [n.op for n in cut_graph([s.node for s in pending_storages()]).nodes]


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_default_optimizers_record_their_fused_step_and_match_eager(name):
    cls, kwargs = ROUTED[name]
    eager, lazy = _model(), _model().to("lazy")
    x, y = torch.randn(6, 5), torch.randn(6, 2)
    opts = [cls(m.parameters(), **kwargs) for m in (eager, lazy)]  # foreach chosen by PyTorch
    for _ in range(3):
        for model, opt, device in ((eager, opts[0], "cpu"), (lazy, opts[1], "lazy")):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
        ops = _pending_ops()
        assert ops.count("lazy.fused_sgd" if cls is torch.optim.SGD else "lazy.fused_adam") == 1
        assert "lazy.foreach" not in ops
        lazy_torch.mark_step()
        for p, q in zip(eager.parameters(), lazy.parameters()):
            torch.testing.assert_close(q.cpu(), p)
        for a, b in zip(_state(opts[0]), _state(opts[1])):
            torch.testing.assert_close(b, a)


def test_bfloat16_parameters_keep_the_foreach_path():
    # foreach ops round each result to bfloat16; the fused step would round once
    model = _model().to(torch.bfloat16).to("lazy")
    model(torch.randn(6, 5, dtype=torch.bfloat16, device="lazy")).sum().backward()
    torch.optim.AdamW(model.parameters()).step()
    ops = _pending_ops()
    assert "lazy.foreach" in ops and "lazy.fused_adam" not in ops


def test_the_foreach_path_when_routing_is_off(monkeypatch):
    import runtime

    monkeypatch.setattr(runtime.config, "FUSE_FOREACH_STEPS", False)
    model = _model().to("lazy")
    model(torch.randn(6, 5, device="lazy")).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).step()
    ops = _pending_ops()
    assert "lazy.foreach" in ops and "lazy.fused_sgd" not in ops


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.SGD])
def test_other_tensors_keep_pytorchs_foreach_path(cls):
    # the routed foreach functions are PyTorch's for every other tensor
    results = []
    for foreach in (True, False):
        model = _model()
        opt = cls(model.parameters(), lr=0.1, foreach=foreach)
        model(torch.randn(6, 5, generator=torch.Generator().manual_seed(1))).sum().backward()
        opt.step()
        results.append([p.detach() for p in model.parameters()])
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected)


def _step_scalars() -> int:
    """The pending graph's float32 scalar parameters: Adam's step counts (its other numbers are
    float64, as are the step's own)."""
    from lazy_core import cut_graph, pending_storages
    from lazy_core.ir import SCALAR

    graph = cut_graph([s.node for s in pending_storages()])
    return sum(p.op == SCALAR and p.dtype == "float32" for p in graph.params)


def test_adam_step_counts_are_one_graph_scalar_per_distinct_count():
    # the four parameters' counts are equal: one scalar; one count apart: two, and eager's values
    eager, lazy = _model(), _model().to("lazy")
    x = torch.randn(6, 5)
    opts = [torch.optim.Adam(m.parameters(), lr=0.05) for m in (eager, lazy)]
    scalars = []
    for step in range(3):
        for model, opt, device in ((eager, opts[0], "cpu"), (lazy, opts[1], "lazy")):
            opt.zero_grad()
            model(x.to(device)).square().sum().backward()
            if step == 2:
                opt.state[next(iter(model.parameters()))]["step"] += 5
            opt.step()
        scalars.append(_step_scalars())
        lazy_torch.mark_step()
        for p, q in zip(eager.parameters(), lazy.parameters()):
            torch.testing.assert_close(q.cpu(), p)
        for a, b in zip(_state(opts[0]), _state(opts[1])):
            torch.testing.assert_close(b, a)
    assert scalars == [1, 1, 2]


def test_count_steps_adds_one_to_each_step_or_changes_nothing():
    from torch.utils._python_dispatch import TorchDispatchMode

    from lazy_torch.tensor import extension

    steps = [torch.tensor(2.0), torch.tensor(2.0**24)]  # float32: 2**24 + 1 rounds to 2**24
    versions = [s._version for s in steps]
    assert extension.count_steps(steps) == [3.0, 2.0**24]
    assert [s._version for s in steps] == [v + 1 for v in versions]
    assert extension.count_steps((torch.tensor(1.5, dtype=torch.float64),)) == [2.5]

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    plain = torch.tensor(1.0)
    declined = [
        [plain, torch.tensor(1.0, dtype=torch.float64)],  # two dtypes
        [plain, torch.tensor(1)],  # an integer count
        [plain, torch.ones(1)],  # not 0-dim
        [plain, torch.tensor(1.0, requires_grad=True)],
        [plain, torch.tensor(1.0).to("lazy")],
        [],
        iter([plain]),  # neither a list nor a tuple
    ]
    for steps in declined:
        assert extension.count_steps(steps) is None
    with Mode():
        assert extension.count_steps([plain]) is None
    assert plain.item() == 1.0 and plain._version == 0
