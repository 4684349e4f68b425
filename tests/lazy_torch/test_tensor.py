"""Lazy tensors against eager CPU: creation, sync points, printing, errors, fallback."""

import copy
import io
import re

import pytest
import torch

import lazy_torch
import runtime
from lazy_torch import LazyTensor


def test_factories_and_transfers_match_eager():
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = cpu.to("lazy")
    assert isinstance(x, lazy_torch.LazyTensor) and x.device == torch.device("lazy", 0)
    assert torch.equal(x.cpu(), cpu)
    for make in (torch.zeros, torch.ones):
        got = make(2, 3, dtype=torch.int64, device="lazy")
        assert torch.equal(got.cpu(), make(2, 3, dtype=torch.int64))
    full = torch.full((2, 2), 2.5, device="lazy", dtype=torch.float64)
    assert full.dtype == torch.float64 and torch.equal(
        full.cpu(), torch.full((2, 2), 2.5, dtype=torch.float64)
    )
    assert torch.equal(torch.arange(5, device="lazy").cpu(), torch.arange(5))


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16]
)
def test_dtypes_are_preserved_exactly(dtype):
    cpu = (torch.arange(6) - 2).to(dtype).reshape(2, 3)
    got = (cpu.to("lazy") * 1).cpu() if dtype != torch.bool else cpu.to("lazy").clone().cpu()
    assert got.dtype == dtype
    assert torch.equal(got, cpu * 1 if dtype != torch.bool else cpu)
    big = torch.tensor([2**62 + 1], dtype=torch.int64)
    assert (big.to("lazy") + 1).item() == 2**62 + 2


def test_sync_points_return_eager_values_and_tensor_stays_usable():
    cpu = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    x = cpu.to("lazy") * 2
    assert x.sum().item() == (cpu * 2).sum().item()
    assert x.tolist() == (cpu * 2).tolist()
    assert bool((x > 0).any()) is True
    assert (x.numpy() == (cpu * 2).numpy()).all()
    assert torch.equal(x.to("cpu"), cpu * 2)
    assert torch.equal((x + 1).cpu(), cpu * 2 + 1)


def test_print_matches_eager_with_device_suffix():
    cpu = torch.tensor([[1.0, 2.5], [-3.0, 4.0]], requires_grad=True)
    lazy = cpu.detach().to("lazy").requires_grad_()
    expected = repr(cpu).replace("requires_grad=True", "device='lazy:0', requires_grad=True")
    assert repr(lazy) == expected
    y = lazy * 2
    assert str(y) == str(cpu * 2).replace("grad_fn", "device='lazy:0', grad_fn")
    assert str(torch.arange(3, device="lazy")) == "tensor([0, 1, 2], device='lazy:0')"


def test_strides_reported_like_eager():
    cpu = torch.randn(3, 4, 5)
    lazy = cpu.to("lazy")
    for f in (
        lambda t: t.transpose(0, 2),
        lambda t: t.permute(2, 0, 1),
        lambda t: t[:, 1:3],
        lambda t: t.transpose(0, 1).contiguous(),
        lambda t: t.expand(2, 3, 4, 5),
    ):
        e, g = f(cpu), f(lazy)
        assert (g.shape, g.stride(), g.is_contiguous()) == (e.shape, e.stride(), e.is_contiguous())
        assert torch.equal(g.cpu(), e)


def test_shape_error_raised_at_the_op_with_pytorchs_message():
    a, b = torch.ones(2, 3), torch.ones(4, 5)
    with pytest.raises(RuntimeError) as eager:
        a @ b
    with pytest.raises(RuntimeError) as lazy:
        a.to("lazy") @ b.to("lazy")
    assert str(lazy.value) == str(eager.value)


def test_fallback_op_runs_on_cpu_and_is_counted(monkeypatch):
    # Any op can take the fallback path: route cumsum there, whatever the lowering table holds.
    from lazy_torch import dispatch, fallback

    monkeypatch.setitem(dispatch._handlers, id(torch.ops.aten.cumsum.default), fallback.run)
    cpu = torch.tensor([3.0, -1.0, 0.0, 2.0])
    x = cpu.to("lazy") * 2
    got = torch.cumsum(x, 0)
    assert isinstance(got, lazy_torch.LazyTensor)
    assert torch.equal(got.cpu(), torch.cumsum(cpu * 2, 0))
    counters = lazy_torch.metrics.counters()
    assert counters["fallback::aten.cumsum.default"] == 1
    assert counters["syncs::fallback"] >= 1
    assert "test_tensor.py" in lazy_torch.metrics.report()


def test_mark_step_is_asynchronous_and_wait_device_ops_blocks():
    x = torch.randn(256, 256, device="lazy")
    for _ in range(5):
        x = x @ x / 256
    lazy_torch.mark_step()
    lazy_torch.wait_device_ops()
    assert x.isfinite().all().item()


def test_device_api():
    assert lazy_torch.device() == torch.device("lazy:0")
    assert lazy_torch.device(1) == torch.device("lazy:1")
    assert lazy_torch.device_count() == len(runtime.devices()) >= 1


def test_boolean_mask_indexing_matches_eager():
    cpu = torch.randn(4, 5)
    x = cpu.to("lazy")
    expected, got = cpu.clone(), x.clone()
    expected[cpu > 0] = 0.0
    got[x > 0] = 0.0  # a select: no sync
    assert torch.equal(got.cpu(), expected)
    assert "fallback::aten.nonzero.default" not in lazy_torch.metrics.counters()
    assert torch.equal(x[x > 0].cpu(), cpu[cpu > 0])  # data-dependent shape: syncs, stays correct
    rows = (cpu[:, 0] > 0).to("lazy")
    expected, got = cpu.clone(), x.clone()
    expected[rows.cpu()] = torch.ones(5)
    got[rows] = torch.ones(5, device="lazy")
    assert torch.equal(got.cpu(), expected)


def test_graphs_reading_different_same_shaped_inputs_do_not_share_an_executable():
    # d/da sqrt(a*b) and d/db sqrt(a*b) differ only in which input the last multiply reads.
    a, b = torch.tensor([0.5, 2.0, 3.0]), torch.tensor([4.0, 0.25, 1.5])
    la, lb = a.to("lazy").requires_grad_(), b.to("lazy").requires_grad_()
    ga, gb = torch.autograd.grad((la * lb).sqrt().sum(), (la, lb))
    assert ga.cpu().tolist() == pytest.approx((0.5 * (b / a).sqrt()).tolist())
    assert gb.cpu().tolist() == pytest.approx((0.5 * (a / b).sqrt()).tolist())


def test_module_to_lazy_keeps_tied_parameters_one_object():
    # Tied embeddings (GPT-2's wte/lm_head, T5's shared): eager sums both uses' gradients into
    # one parameter; a copy per module would train them apart.
    def tied():
        torch.manual_seed(0)
        emb, head = torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False)
        head.weight = emb.weight
        return torch.nn.Sequential(emb, head)

    cpu, lazy = tied(), tied()
    weight = lazy[0].weight
    lazy.to("lazy")
    assert lazy[0].weight is weight and lazy[1].weight is weight
    assert isinstance(weight, torch.nn.Parameter) and weight.device.type == "lazy"
    assert len(list(lazy.parameters())) == 1
    ids = torch.tensor([[0, 3, 4]])
    for model, x in ((cpu, ids), (lazy, ids.to("lazy"))):
        torch.optim.SGD(model.parameters(), lr=0.1).zero_grad()
        model(x).square().sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    torch.testing.assert_close(lazy[1].weight.cpu(), cpu[1].weight)
    torch.testing.assert_close(lazy[0].weight.grad.cpu(), cpu[0].weight.grad)


def test_to_the_current_lazy_device_returns_the_tensor_itself_as_eager_does():
    # As t.to("cpu") in eager, and t.to("cuda") on the current CUDA device: no copy, so a write
    # through the result is a write to the tensor, and model.to("lazy") again leaves nothing
    # pending (a pending copy of a weight made the next graph differ from later ones).
    import lazy_core

    cpu = torch.zeros(3)
    assert cpu.to("cpu") is cpu
    t = torch.zeros(3, device="lazy")
    model = torch.nn.Linear(2, 2).to("lazy")
    lazy_torch.mark_step()
    for same in ("lazy", torch.device("lazy"), "lazy:0", t.device, torch.float32):
        assert t.to(same) is t
    assert t.to(device="lazy") is t and t.to("lazy", torch.float32) is t
    assert t.to("lazy", torch.float64).dtype == torch.float64
    t.to("lazy").add_(1)
    assert t.tolist() == [1.0, 1.0, 1.0]
    model.to("lazy")
    assert not lazy_core.pending_storages(0)


def test_matmul_of_mixed_dtypes_gives_eagers_error():
    a, b = torch.ones(2, 3), torch.ones(3, 2, dtype=torch.bfloat16)
    for fn in (torch.mm, torch.matmul, lambda x, y: torch.nn.functional.linear(x, y.T)):
        with pytest.raises(RuntimeError) as eager:
            fn(a, b)
        with pytest.raises(RuntimeError) as lazy:
            fn(a.to("lazy"), b.to("lazy"))
        assert str(lazy.value) == str(eager.value)


def test_a_transfer_copies_so_later_writes_to_the_cpu_source_do_not_leak():
    cpu = torch.arange(4.0)
    moved = cpu.to("lazy")
    batch = torch.zeros(1000)
    moved_batch = batch.to("lazy")
    cpu.add_(10)  # a reused host buffer, as a data loader's
    batch.fill_(5)
    assert moved.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert moved_batch.sum().item() == 0.0


def test_deepcopy_copies_values_not_the_graph():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    model = copy.deepcopy(cpu).to("lazy")
    model(torch.randn(4, 3, device="lazy")).sum().backward()  # pending grads
    clone = copy.deepcopy(model)
    for p, q in zip(model.parameters(), clone.parameters()):
        assert type(q) is type(p) and q.requires_grad and q._is_param
        torch.testing.assert_close(q.grad.cpu(), p.grad.cpu())
    with torch.no_grad():
        model[0].weight.add_(1)  # the copy has its own value
    torch.testing.assert_close(clone[0].weight.cpu(), cpu[0].weight)
    view = (torch.randn(4, 4, device="lazy") * 2).t()
    copied = copy.deepcopy(view)
    assert copied.stride() == view.stride()
    torch.testing.assert_close(copied.cpu(), view.cpu())


def _saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def test_save_and_load_of_tensors_and_state_dicts_follow_eagers_devices():
    # Eager reloads a CUDA tensor onto its device, or where map_location says.
    model = torch.nn.Linear(3, 2).to("lazy")
    t = torch.arange(6.0).reshape(2, 3).t().to("lazy")  # strided
    saved = {"t": t, "i": t.to(torch.int64), "zero": torch.tensor(0.5, device="lazy")}
    saved["model"] = model.state_dict()
    for weights_only in (True, False):
        loaded = torch.load(_saved(saved), weights_only=weights_only)
        on_cpu = torch.load(_saved(saved), weights_only=weights_only, map_location="cpu")
        mapped = torch.load(_saved(saved), map_location={"lazy:0": "cpu"})
        for key in ("t", "i", "zero"):
            assert type(loaded[key]) is LazyTensor and loaded[key].device == t.device
            assert type(on_cpu[key]) is torch.Tensor and on_cpu[key].device.type == "cpu"
            assert mapped[key].device.type == "cpu"
            assert loaded[key].dtype == on_cpu[key].dtype == saved[key].dtype
            assert torch.equal(loaded[key].cpu(), saved[key].cpu())
            assert torch.equal(on_cpu[key], saved[key].cpu())
        for name, value in model.state_dict().items():
            assert loaded["model"][name].device == t.device
            assert on_cpu["model"][name].device.type == "cpu"
            assert torch.equal(loaded["model"][name].cpu(), value.cpu())


def test_save_and_load_of_a_whole_module():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).to("lazy")
    model[0].weight.requires_grad_(False)
    x = torch.randn(4, 3)
    loaded = torch.load(_saved(model), weights_only=False)
    on_cpu = torch.load(_saved(model), weights_only=False, map_location="cpu")
    for copy_, device in ((loaded, "lazy"), (on_cpu, "cpu")):
        params = dict(copy_.named_parameters(remove_duplicate=False))
        assert params.keys() == dict(model.named_parameters()).keys()
        for name, p in params.items():
            original = dict(model.named_parameters())[name]
            assert isinstance(p, torch.nn.Parameter) and p.device.type == device
            assert p.requires_grad == original.requires_grad
            assert torch.equal(p.detach().cpu(), original.detach().cpu())
        out = copy_(x.to(device))
        torch.testing.assert_close(out.detach().cpu(), model(x.to("lazy")).detach().cpu())
    # The reloaded lazy module trains.
    loaded(x.to("lazy")).sum().backward()
    assert loaded[0].bias.grad.device.type == "lazy"


def test_format_matches_eager():
    for value in (torch.tensor(0.5), torch.tensor(3), torch.tensor(True), torch.ones(2)):
        lazy = value.to("lazy")
        if value.dim() == 0:  # formats as its Python number
            for spec in (">8", ".3f", "", "^10"):
                if value.dtype == torch.bool and spec == ".3f":
                    continue
                assert format(lazy, spec) == format(value, spec)
            assert f"{lazy}" == f"{value}" and f"{lazy:>8}" == f"{value:>8}"
        else:  # as its text, with the device as CUDA's
            assert f"{lazy}" == format(lazy, "") == str(lazy) == "tensor([1., 1.], device='lazy:0')"
            with pytest.raises(TypeError) as eager:
                format(value, ">8")
            with pytest.raises(TypeError, match=re.escape(str(eager.value))):
                format(lazy, ">8")


def test_small_host_values_travel_when_a_program_takes_them():
    # A small copy to the device is staged: it is uploaded at the first program that takes it,
    # and read back from the host copy; in-place writes and donated buffers keep the values.
    counters = runtime.metrics.counters
    up, down = counters().get("transfers_to_device", 0), counters().get("transfers_from_device", 0)
    x = torch.tensor([1.0, 2.0, 3.0], device="lazy")
    flag = torch.tensor(True).to("lazy")
    assert x.cpu().tolist() == [1.0, 2.0, 3.0] and flag.cpu().item() is True
    assert counters().get("transfers_to_device", 0) == up  # made and read on the host only
    assert counters().get("transfers_from_device", 0) == down
    y = x * 2
    x.add_(1)
    lazy_torch.mark_step()
    assert counters().get("transfers_to_device", 0) == up + 1  # the step took x
    count = torch.tensor(0, device="lazy")
    for _ in range(3):  # written in place each step: its buffer is donated to the next
        count.add_(1)
        lazy_torch.mark_step()
    assert y.tolist() == [2.0, 4.0, 6.0] and x.tolist() == [2.0, 3.0, 4.0]
    assert int(count) == 3
    big = torch.arange(1000.0).to("lazy")  # larger values start their copy at once
    assert counters().get("transfers_to_device", 0) >= up + 3
    assert torch.equal(big.cpu(), torch.arange(1000.0))


def test_empty_host_tensors_reach_the_device_without_a_transfer():
    # transformers' DynamicCache makes torch.tensor([], device=...) twice per layer per step.
    def moved() -> int:  # host-to-device copies, made or staged for a program to take
        counters = runtime.metrics.counters()
        return counters.get("transfers_to_device", 0) + counters.get("staged_to_device", 0)

    before = moved()
    made = [
        torch.tensor([], device="lazy"),
        torch.tensor([], dtype=torch.bfloat16, device="lazy"),
        torch.empty(0, 3, dtype=torch.int64).to("lazy"),
        torch.ones(2, 0, device="lazy").copy_(torch.ones(0)),
    ]
    lazy_torch.mark_step()
    assert moved() == before
    expected = [torch.tensor([]), torch.tensor([], dtype=torch.bfloat16),
                torch.empty(0, 3, dtype=torch.int64), torch.ones(2, 0)]  # fmt: skip
    for got, want in zip(made, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(torch.cat([got.cpu(), want]), torch.cat([want, want]))
