"""lazy_torch/fallback.py: an op without a lowering runs in eager CPU PyTorch on materialized
inputs. Its results are lazy tensors with eager's values, mutated arguments are written back, its
errors are eager's, a non-scalar CPU operand is a device mismatch, and every call is counted per op
with the user's call site."""

import pytest
import torch

import lazy_torch
from lazy_torch import LazyTensor, fallback

aten = torch.ops.aten


# Ops of this file's own library: PyTorch has CPU kernels for them, the lowering table nothing.
@torch.library.custom_op("lazy_fallback_test::twice_cumsum", mutates_args=())
def twice_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    if x.dtype == torch.bool:
        raise ValueError("twice_cumsum: no bool input")
    return torch.cumsum(x, dim) * 2


@torch.library.custom_op("lazy_fallback_test::scaled", mutates_args=())
def scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@torch.library.custom_op("lazy_fallback_test::halve_", mutates_args=("x",))
def halve_(x: torch.Tensor) -> None:
    x.div_(2)


@torch.library.custom_op("lazy_fallback_test::split_signs", mutates_args=())
def split_signs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x[x > 0].clone(), x[x <= 0].to(torch.int64)


_TWICE_CUMSUM = "fallback::lazy_fallback_test.twice_cumsum.default"
_CPU = torch.tensor([[1.0, -2.0, 0.5], [3.0, 4.0, -1.5]])


def _sites(kind):
    return lazy_torch.metrics.sites()[kind]


def test_an_op_without_a_lowering_runs_on_the_cpu_with_eagers_values():
    x = _CPU.to("lazy") * 1  # pending: the fallback materializes it
    got = twice_cumsum(x, 1)
    want = twice_cumsum(_CPU, 1)
    assert type(got) is LazyTensor and got.device == torch.device("lazy:0")
    assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride())
    assert not got._lazy.storage.pending  # device data: the CPU result, uploaded
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close((got + 1).cpu(), want + 1)  # and recorded ops go on from it
    counters = lazy_torch.metrics.counters()
    assert counters[_TWICE_CUMSUM] == 1 and counters["syncs::fallback"] == 1
    (site,) = _sites(_TWICE_CUMSUM)
    assert site.startswith(__file__ + ":")


def test_each_call_is_counted_at_its_call_site():
    x = _CPU.to("lazy")
    for _ in range(3):
        twice_cumsum(x, 0)
    twice_cumsum(x, 1)
    assert lazy_torch.metrics.counters()[_TWICE_CUMSUM] == 4
    assert sorted(_sites(_TWICE_CUMSUM).values()) == [1, 3]
    assert f"{__file__}:" in lazy_torch.metrics.report()


def test_errors_of_the_op_are_eagers():
    with pytest.raises(ValueError) as eager:
        twice_cumsum(torch.ones(2, dtype=torch.bool), 0)
    with pytest.raises(ValueError) as lazy:
        twice_cumsum(torch.ones(2, dtype=torch.bool, device="lazy"), 0)
    assert str(lazy.value) == str(eager.value) == "twice_cumsum: no bool input"
    with pytest.raises(RuntimeError) as eager:
        scaled(torch.ones(2, 3), torch.ones(4))
    with pytest.raises(RuntimeError) as lazy:
        scaled(torch.ones(2, 3, device="lazy"), torch.ones(4, device="lazy"))
    assert str(lazy.value) == str(eager.value)


def test_a_cpu_operand_is_a_device_mismatch_unless_it_is_a_0_dim_scalar():
    x = _CPU.to("lazy")
    with pytest.raises(RuntimeError) as error:
        scaled(x, torch.ones(3))
    assert str(error.value) == (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "lazy:0 and cpu!"
    )
    got = scaled(x, torch.tensor(2.5))
    torch.testing.assert_close(got.cpu(), _CPU * 2.5)


def test_a_mutated_argument_gets_the_result_and_its_views_see_it():
    x = _CPU.to("lazy")
    row = x[1]
    assert halve_(x) is None
    torch.testing.assert_close(x.cpu(), _CPU / 2)
    torch.testing.assert_close(row.cpu(), _CPU[1] / 2)


def test_an_op_that_returns_its_mutated_argument_returns_the_lazy_tensor():
    x, y = _CPU.to("lazy"), _CPU.to("lazy") * 3
    out = fallback.run(aten.add_.Tensor, (x, y), {"alpha": 2})
    assert out is x
    torch.testing.assert_close(x.cpu(), _CPU + 2 * (_CPU * 3))
    assert lazy_torch.metrics.counters()["fallback::aten.add_.Tensor"] == 1


def test_every_output_becomes_a_lazy_tensor():
    positive, rest = split_signs(_CPU.to("lazy"))
    want_positive, want_rest = split_signs(_CPU)
    for got, want in ((positive, want_positive), (rest, want_rest)):
        assert type(got) is LazyTensor and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)


def test_a_factory_on_the_fallback_makes_its_tensor_on_the_device_asked_for():
    kwargs = {"dtype": torch.float64, "device": torch.device("lazy:0")}
    got = fallback.run(aten.arange.start_step, (2, 11, 3), kwargs)
    assert type(got) is LazyTensor and got.device == torch.device("lazy:0")
    torch.testing.assert_close(got.cpu(), torch.arange(2, 11, 3, dtype=torch.float64))


def test_writes_into_windows_that_share_memory_run_on_one_cpu_copy_of_it():
    # Eager writes overlapping unfold windows element by element, each reading earlier writes.
    def program(device):
        base = torch.zeros(5, device=device)
        torch.cumsum(torch.arange(8.0, device=device).view(4, 2), 1, out=base.unfold(0, 2, 1))
        return base

    torch.testing.assert_close(program("lazy").cpu(), program("cpu"))
    assert lazy_torch.metrics.counters()["fallback::aten.cumsum.out"] == 1
