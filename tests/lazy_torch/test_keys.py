"""Executable and memo keys are exact: programs that differ only in values Python's hash() or ==
conflate (-1/-2, 8/8.0, True/1, 0.0/-0.0) never share an executable or a shape-memo entry, in
whichever order they run in one process."""

import itertools

import pytest
import torch

import lazy_torch
from lazy_torch import recording
from runtime import executor


def _base():
    return torch.arange(8.0).view(2, 2, 2)


# Each program maps a tensor (lazy or eager) to a result; pairs differ in a conflated argument.
_DIM_OPS = {
    "sum": lambda t, d: t.sum(d),
    "softmax": lambda t, d: t.softmax(d),
    "amax": lambda t, d: t.amax(d),
    "cumsum": lambda t, d: t.cumsum(d),
    "flip": lambda t, d: t.flip(d),
    "roll": lambda t, d: t.roll(1, d),
    "select": lambda t, d: t.select(d, 1),
}


@pytest.mark.parametrize("name", sorted(_DIM_OPS))
@pytest.mark.parametrize("dims", [(-2, -1), (-1, -2)])
def test_ops_on_dims_minus_one_and_minus_two_never_share_a_graph(name, dims):
    op = _DIM_OPS[name]
    x = _base().to("lazy")
    for d in dims:
        got = op(x, d).cpu()
        torch.testing.assert_close(got, op(_base(), d))


def _factories():
    return {
        "arange int": lambda dev: torch.arange(8, device=dev),
        "arange float": lambda dev: torch.arange(8.0, device=dev),
        "full int": lambda dev: torch.full((3,), 1, device=dev),
        "full bool": lambda dev: torch.full((3,), True, device=dev),
        "full float": lambda dev: torch.full((3,), 1.0, device=dev),
        "full zero": lambda dev: 1 / torch.full((3,), 0.0, device=dev),
        "full negative zero": lambda dev: 1 / torch.full((3,), -0.0, device=dev),
        "full complex": lambda dev: torch.full((2,), 1 + 0j, device=dev),
        "linspace int": lambda dev: torch.linspace(0, 8, 5, device=dev),
        "linspace float": lambda dev: torch.linspace(0.0, 8.0, 5, device=dev),
        # -0.0 is a graph scalar, 0.0 a constant. (Device data, not a constant tensor: XLA
        # simplifies x + 0 to x, which keeps a -0.0 that IEEE addition would make 0.0.)
        "scalar add -0.0": lambda dev: 1 / (torch.tensor([0.0, -0.0]).to(dev) + -0.0),
        "scalar mul 0.0": lambda dev: 1 / (torch.tensor([1.0, -1.0]).to(dev) * 0.0),
        "scalar mul -0.0": lambda dev: 1 / (torch.tensor([1.0, -1.0]).to(dev) * -0.0),
    }


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_factories_and_scalars_with_conflated_values_keep_their_dtypes_and_values(order):
    programs = list(_factories().items())
    if order == "backward":
        programs.reverse()
    elif order == "shuffled":
        programs = programs[1::2] + programs[::2]
    for _, program in itertools.chain(programs, programs):  # twice: memo and cache hits too
        got, want = program("lazy").cpu(), program("cpu")
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        # Signs of zeros and infinities matter: compare bits, NaNs included.
        if got.is_complex():
            got, want = torch.view_as_real(got), torch.view_as_real(want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))
        torch.testing.assert_close(got, want, equal_nan=True)


def test_conflated_programs_compile_their_own_executables():
    x = torch.arange(8, dtype=torch.float64).view(2, 2, 2).to("lazy")  # graphs new to the process
    x.sum(-2).cpu()
    before = executor.cache_size()
    x.sum(-1).cpu()  # must not hit sum(-2)'s executable
    assert executor.cache_size() == before + 1
    x.sum(-2).cpu()
    x.sum(-1).cpu()
    assert executor.cache_size() == before + 1


def test_memo_entries_are_not_shared_between_int_float_and_bool():
    keys = set()
    for end in (8, 8.0, True, 1):
        torch.arange(end, device="lazy")
        keys.add(recording.memo_key(torch.ops.aten.arange.default, (end,), {}))
    assert len(keys) == 4
    assert torch.arange(True, device="lazy").dtype == torch.arange(True).dtype
    assert torch.arange(1, device="lazy").dtype == torch.int64


def test_a_changing_scalar_still_never_recompiles():
    # Exact keys must not cost the scalar-parameter rule: 0.1 and 0.2 are one graph.
    x = torch.ones(4, device="lazy")
    (x * 0.1).cpu()
    lazy_torch.metrics.reset()
    for v in (0.2, 0.3, -0.5, 7.0):
        torch.testing.assert_close((x * v).cpu(), torch.ones(4) * v)
    assert lazy_torch.metrics.counters().get("compiles", 0) == 0
