"""SPMD over 4 devices (tests/conftest.py gives the CPU platform 4): data-parallel and FSDP
training equal to one device, layouts kept step after step, the collectives XLA inserted, the
layout in executable keys, gathers on reads, and bad input."""

from __future__ import annotations

import copy
import io
import re

import pytest
import torch
from torch import nn

import lazy_torch
import runtime
from lazy_torch.distributed import (
    DeviceLoader,
    Mesh,
    clear_sharding,
    fsdp,
    get_sharding,
    mark_sharding,
)
from runtime import executor

N = 4
pytestmark = pytest.mark.skipif(
    lazy_torch.device_count() < N and runtime.device(0).platform != "cpu",
    reason="needs 4 devices",
)

STEPS = 10


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 6), nn.LayerNorm(6))


def _batches(steps: int = STEPS, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 16, generator=g), torch.randn(batch, 6, generator=g))
            for _ in range(steps)]  # fmt: skip


def _mse(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def _train(model, batches, loss_fn, layout=None, spec=None, mesh=None):
    """AdamW on lazy: one device (``layout`` None), or ``layout(model)`` on a mesh with batches
    split as ``spec``. Returns losses, final state, compiles per step and the parameters'
    layouts after each step."""
    model = copy.deepcopy(model).to("lazy")
    if layout is not None:
        layout(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
    loader = (
        DeviceLoader(batches)
        if mesh is None
        else DeviceLoader(batches, mesh=mesh, partition_spec=spec)
    )
    losses, compiles, layouts = [], [], []
    for batch in loader:
        before = lazy_torch.metrics.counters().get("compiles", 0)
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lazy_torch.mark_step()
        losses.append(loss.detach())
        compiles.append(lazy_torch.metrics.counters().get("compiles", 0) - before)
        layouts.append([get_sharding(p) for p in model.parameters()])
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return [float(x) for x in losses], state, compiles, layouts, model, opt


def _collectives(text: str) -> set[str]:
    return set(re.findall(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all)\b", text))


def _assert_same_run(run, reference):
    """Losses, and each tensor of the final state, within 1e-5 relative (of each loss, of each
    tensor's norm: a partitioned program sums in another order); nothing compiles after the
    first 2 steps."""
    torch.testing.assert_close(run[0], reference[0], rtol=1e-5, atol=0)
    assert run[1].keys() == reference[1].keys()
    for name, value in reference[1].items():
        assert run[1][name].shape == value.shape and run[1][name].dtype == value.dtype, name
        error = float((run[1][name] - value).norm() / max(float(value.norm()), 1e-30))
        assert error <= 1e-5, (name, error)
    assert run[2][2:] == [0] * (len(run[2]) - 2), run[2]


def test_the_cpu_platform_has_four_devices_for_these_tests():
    assert lazy_torch.device_count() >= N


def test_data_parallel_training_equals_one_device_and_all_reduces_the_gradients():
    model, batches = _mlp(), _batches()
    one = _train(model, batches, _mse)
    mesh = Mesh(range(N), (N,), ("data",))
    executor.drop_cache()
    dp = _train(model, batches, _mse, spec=("data", None), mesh=mesh)
    _assert_same_run(dp, one)
    for layouts in dp[3]:  # parameters stay whole on every device
        assert all(s == (mesh, (None,) * len(p.shape)) for s, p in zip(layouts, model.parameters()))
    steady = executor.executable_texts()[-1]
    assert "all-reduce" in _collectives(steady)


@pytest.mark.parametrize("launch_thread", [False, True], ids=["called", "launch-thread"])
def test_fsdp_training_equals_one_device_with_parameters_and_optimizer_state_sharded(
    launch_thread, monkeypatch
):
    # With a launch thread (the GPU's default) a step's outputs are Deferred until read.
    monkeypatch.setattr(executor._launcher, "threaded", launch_thread)
    model, batches = _mlp(), _batches()
    one = _train(model, batches, _mse)
    mesh = Mesh(range(N), (N,), ("fsdp",))
    executor.drop_cache()
    run = _train(model, batches, _mse, lambda m: fsdp(m, mesh), ("fsdp", None), mesh)
    _assert_same_run(run, one)
    # The first dimension that divides over 4, else whole: (6, 32) splits its second, (6,) none.
    expected = [("fsdp", None), ("fsdp",), (None, "fsdp"), (None,), (None,), (None,)]
    for layouts in run[3]:
        assert [s[1] for s in layouts] == expected
    model_, opt = run[4], run[5]
    # The storages keep their layouts (what the next step constrains their new values to).
    assert [p._lazy.storage.placement[1] for p in model_.parameters()] == expected
    for p in model_.parameters():
        for name in ("exp_avg", "exp_avg_sq"):
            assert get_sharding(opt.state[p][name]) == get_sharding(p), name
    # Each device holds a quarter of a sharded weight.
    weight = runtime.resolve(model_[0].weight._lazy.node.payload)
    assert {s.data.shape for s in weight.addressable_shards} == {(8, 16)}
    assert "all-gather" in _collectives(executor.executable_texts()[-1])


def _gpt2(vocab: int, length: int, width: int, heads: int, steps: int) -> tuple[nn.Module, list]:
    """A 2-layer GPT-2 without dropout, and ``steps`` batches of 8 sequences of ``length``."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=length, n_embd=width, n_layer=2, n_head=heads,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, vocab, (8, length), generator=g) for _ in range(steps)]
    return transformers.GPT2LMHeadModel(config), batches


@pytest.mark.slow
def test_gpt2_trains_data_parallel_and_fsdp_as_on_one_device():
    model, batches = _gpt2(vocab=64, length=16, width=32, heads=2, steps=STEPS)

    def loss_fn(m, ids):
        return m(input_ids=ids, labels=ids).loss

    one = _train(model, batches, loss_fn)
    mesh = Mesh(range(N), (2, 2), ("data", "fsdp"))
    executor.drop_cache()
    dp = _train(model, batches, loss_fn, spec=(("data", "fsdp"), None), mesh=mesh)
    _assert_same_run(dp, one)
    executor.drop_cache()
    sharded = _train(model, batches, loss_fn, lambda m: fsdp(m, mesh, "fsdp"), ("data", None), mesh)
    _assert_same_run(sharded, one)
    wte = sharded[4].transformer.wte.weight
    assert get_sharding(wte) == (mesh, ("fsdp", None))
    assert all(layouts == sharded[3][0] for layouts in sharded[3])


@pytest.mark.slow
def test_fsdp_computes_with_gathered_parameters_and_needs_no_more_memory_than_data_parallel():
    # Its vocabulary (1001) does not divide, so the embedding splits along its width: without
    # gathering, XLA's partitioner split the computation that way and moved activations between
    # devices (all-to-all), and the step's temporaries were 2.7 times data parallelism's.
    model, batches = _gpt2(vocab=1001, length=64, width=64, heads=4, steps=3)
    mesh = Mesh(range(N), (N,), ("data",))
    temporaries, losses = {}, {}
    for mode in ("dp", "fsdp"):
        executor.drop_cache()
        m = copy.deepcopy(model).to("lazy")
        if mode == "fsdp":
            fsdp(m, mesh, "data")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses[mode] = []
        for ids in DeviceLoader(batches, mesh=mesh, partition_spec=("data", None)):
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            if mode == "fsdp":  # each gradient is laid out as its parameter
                assert all(get_sharding(p.grad) == get_sharding(p) for p in m.parameters())
            opt.step()
            opt.zero_grad()
            lazy_torch.mark_step()
            losses[mode].append(float(loss.detach()))
        # After each forward the module's own attributes are its parameters again.
        for mod in m.modules():
            assert not set(vars(mod)) & set(mod._parameters), mod
        temporaries[mode] = executor.executable_memory()[-1]["temporaries"]
    torch.testing.assert_close(losses["fsdp"], losses["dp"], rtol=1e-5, atol=0)
    assert temporaries["fsdp"] <= 1.2 * temporaries["dp"], temporaries


def test_views_in_place_updates_and_reads_keep_or_gather_the_layout():
    mesh = Mesh(range(N), (2, 2), ("a", "b"))
    cpu = torch.arange(32.0).reshape(8, 4)
    x = mark_sharding(cpu.to("lazy"), mesh, ("a", "b"))
    payload = runtime.resolve(x._lazy.node.payload)
    assert {s.data.shape for s in payload.addressable_shards} == {(4, 2)}
    x[1:3].mul_(-1)  # a write through a view
    cpu[1:3].mul_(-1)
    x.add_(1)
    cpu.add_(1)
    lazy_torch.mark_step()
    assert get_sharding(x) == (mesh, ("a", "b"))
    assert get_sharding(x[2:]) == (mesh, ("a", "b"))  # a view reads its storage's layout
    assert torch.equal(x.cpu(), cpu)
    assert torch.equal(x[2:, 1].cpu(), cpu[2:, 1])
    assert repr(x) == repr(cpu)[:-1] + ", device='lazy:0')"  # print gathers too
    buffer = io.BytesIO()
    torch.save({"x": x}, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer)["x"].cpu(), cpu)


def test_pending_values_are_constrained_and_reads_match_eager():
    mesh = Mesh(range(N), (N,), ("d",))
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    y = torch.mm(a.to("lazy"), b.to("lazy"))
    mark_sharding(y, mesh, ("d", None))  # pending: recorded as a constraint
    z = (y * 2).sum(0)
    lazy_torch.mark_step()
    assert get_sharding(y) == (mesh, ("d", None))
    torch.testing.assert_close(y.cpu(), a @ b)
    torch.testing.assert_close(z.cpu(), (a @ b * 2).sum(0))


def test_load_state_dict_into_a_sharded_model_reshards_and_state_dict_gathers():
    mesh = Mesh(range(N), (N,), ("fsdp",))
    model = fsdp(_mlp().to("lazy"), mesh)
    other = _mlp()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(3)
    model.load_state_dict(other.state_dict())
    assert get_sharding(model[0].weight) == (mesh, ("fsdp", None))
    weight = runtime.resolve(model[0].weight._lazy.node.payload)
    assert {s.data.shape for s in weight.addressable_shards} == {(8, 16)}
    for name, value in model.state_dict().items():
        assert torch.equal(value.cpu(), other.state_dict()[name]), name


def test_the_layout_is_part_of_the_executable_key():
    """The same program on differently laid out inputs, in varied orders: every result right."""
    m1 = Mesh(range(N), (N,), ("d",))
    m2 = Mesh(range(N), (2, 2), ("r", "c"))
    cpu = torch.randn(8, 8)
    expected = (cpu @ cpu.T).tanh()
    layouts = [None, (m1, ("d", None)), (m1, (None, "d")), (m2, ("r", "c")), (m2, ("c", "r"))]
    for order in (layouts, layouts[::-1], layouts[1::2] + layouts[::2]):
        for layout in order:
            x = cpu.to("lazy")
            if layout is not None:
                mark_sharding(x, *layout)
            y = (x @ x.T).tanh()
            lazy_torch.mark_step()
            torch.testing.assert_close(y.cpu(), expected)


def test_values_on_two_meshes_in_one_graph_are_refused_at_the_barrier():
    m1 = Mesh(range(N), (N,), ("d",))
    m2 = Mesh(range(2), (2,), ("d",))
    x = mark_sharding(torch.ones(4, 2).to("lazy"), m1, ("d", None))
    y = mark_sharding(torch.ones(4, 2).to("lazy"), m2, ("d", None))
    z = x + y
    with pytest.raises(ValueError, match="different meshes"):
        lazy_torch.mark_step()
    with pytest.raises(ValueError, match="different meshes"):
        z.cpu()
    del z  # a value that cannot be computed; its operands keep theirs
    assert torch.equal(x.cpu(), torch.ones(4, 2)) and torch.equal(y.cpu(), torch.ones(4, 2))
    mark_sharding(y, m1, ("d", None))
    assert torch.equal((x + y).cpu(), torch.full((4, 2), 2.0))


@pytest.mark.parametrize(
    "spec, error, match",
    [
        (("d", None, None), ValueError, "3 entries for a tensor of 2 dimensions"),
        (("x", None), ValueError, "unknown mesh axis 'x'"),
        ((None, "d"), ValueError, "does not divide over mesh axis 'd' of 4 devices"),
        (("d", "d"), ValueError, "used twice"),
        ((1.0, None), TypeError, "partition spec entry"),
    ],
)
def test_a_bad_partition_spec_raises_at_the_call_and_the_tensor_keeps_its_value(spec, error, match):
    mesh = Mesh(range(N), (N,), ("d",))
    cpu = torch.randn(8, 3)
    data, pending = cpu.to("lazy"), cpu.to("lazy") * 2
    for t, value in ((data, cpu), (pending, cpu * 2)):
        with pytest.raises(error, match=match):
            mark_sharding(t, mesh, spec)
        assert get_sharding(t) is None
        assert torch.equal(t.cpu(), value)


def test_a_bad_mesh_raises():
    with pytest.raises(ValueError, match="needs device"):
        Mesh(range(lazy_torch.device_count() + 1), (lazy_torch.device_count() + 1,), ("d",))
    with pytest.raises(ValueError, match="holds 4 devices"):
        Mesh(range(3), (2, 2), ("a", "b"))
    with pytest.raises(ValueError, match="distinct"):
        Mesh(range(4), (2, 2), ("a", "a"))
    with pytest.raises(TypeError, match="device id"):
        Mesh([True, False], (2,), ("a",))
    with pytest.raises(ValueError, match="not a view"):
        mark_sharding(torch.ones(8, 2, device="lazy")[:4], Mesh(range(N), (N,), ("d",)), ("d",))
    with pytest.raises(TypeError, match="lazy tensor"):
        mark_sharding(torch.ones(8), Mesh(range(N), (N,), ("d",)), ("d",))


def test_clear_sharding_lets_the_next_value_take_the_layout_xla_gives_it():
    mesh = Mesh(range(N), (N,), ("d",))
    x = mark_sharding(torch.ones(8, 4).to("lazy"), mesh, ("d", None))
    clear_sharding(x)
    assert x._lazy.storage.placement is None
    x.mul_(2)
    lazy_torch.mark_step()
    assert get_sharding(x) is not None  # on the mesh still, as XLA laid it out
    assert torch.equal(x.cpu(), torch.full((8, 4), 2.0))


def test_a_constraint_inside_a_compiled_region_lays_out_its_graph():
    """Nothing else of the graph is on the mesh: the runtime finds it in the captured region."""
    mesh = Mesh(range(N), (N,), ("d",))
    w = torch.randn(6, 6)
    on_device = w.to("lazy")

    def f(x):
        y = x @ on_device
        mark_sharding(y, mesh, ("d", None))
        return y.tanh() * 2

    compiled = lazy_torch.compile(f)
    for _ in range(3):
        x = torch.randn(8, 6)
        out = compiled(x.to("lazy"))
        lazy_torch.mark_step()
        torch.testing.assert_close(out.cpu(), (x @ w).tanh() * 2)
        assert get_sharding(out) == (mesh, ("d", None))
