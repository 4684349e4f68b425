"""Op-by-op execution (runtime/interpret.py): graphs that keep changing at one call site run node
by node on executables shared across graphs, with the values, errors and random draws of whole
graphs."""

import pytest
import torch

import lazy_torch
from runtime import config, executor
from tests.lazy_torch import lockstep
from tests.lazy_torch.test_differential import KNOWN_FAILURES


def _counter(name: str) -> int:
    return lazy_torch.metrics.counters().get(name, 0)


@pytest.fixture
def always(monkeypatch):
    """Every graph new to the cache runs op by op, however often it comes back and however many
    of its ops are new."""
    monkeypatch.setattr(executor, "_interprets", lambda key, site: True)
    monkeypatch.setattr(executor, "_FEW_NEW_OPS", 1 << 30)


@pytest.mark.parametrize("chunk", range(2))
def test_random_programs_match_eager_op_by_op(always, chunk):
    counts = lockstep.run_programs(range(500 + 12 * chunk, 512 + 12 * chunk), KNOWN_FAILURES)
    assert counts["programs"] > 0
    assert _counter("interpreted_graphs") > 0 and _counter("cache_hits") == 0


def test_a_site_whose_graphs_keep_changing_runs_them_op_by_op(monkeypatch):
    monkeypatch.setattr(config, "INTERPRET_AFTER", 4)
    x = torch.randn(16)
    a = x.to("lazy")

    def chain(k):  # a graph one link longer each time, of the same ops
        y, e = a, x
        for _ in range(k):
            y, e = y * 2 + 1, e * 2 + 1
        torch.testing.assert_close(torch.tensor(y.sum().item()), e.sum())

    for k in range(1, 5):
        chain(k)
    assert _counter("interpreted_graphs") == 0  # four graphs compiled whole for the site
    compiles = _counter("compiles")
    for k in range(5, 12):
        chain(k)
    assert _counter("interpreted_graphs") == 7
    later = _counter("compiles")
    assert later - compiles <= 4  # the op executables: mul, add, sum and the scalar-free forms
    chain(13)
    assert _counter("compiles") == later  # every op of a new length is compiled already
    chain(7)  # back again: compiled whole this time, then a cache hit
    assert _counter("compiles") == later + 1 and _counter("interpreted_graphs") == 8
    chain(7)
    assert _counter("compiles") == later + 1 and _counter("interpreted_graphs") == 8


def test_a_site_that_settles_on_a_steady_graph_compiles_a_new_shape_sets_graphs_whole(monkeypatch):
    # transformers' stopping check: a prefill, a first step and a steady step per batch size; a
    # second batch size's graphs are few and come back, so they compile whole (op by op, they
    # cost op executables, and in bfloat16 round apart from the whole graph's).
    monkeypatch.setattr(config, "INTERPRET_AFTER", 3)
    executor.drop_cache()  # other tests' graphs of these ops

    def step(x, k):  # a graph per (shape, k), read at one line
        y = x
        for _ in range(k):
            y = y * 2 + 1
        return y.sum().item()

    for n in (4, 8, 16):  # three shape sets, each: two one-off graphs, then a steady one
        x = torch.randn(n).to("lazy")
        for k in (1, 2, 3, 3, 3):
            step(x, k)
    assert _counter("interpreted_graphs") == 0 and _counter("compiles") == 9


def test_a_graph_of_mostly_new_ops_is_compiled_whole(monkeypatch):
    monkeypatch.setattr(config, "INTERPRET_AFTER", 1)
    for n in (3, 4, 5):  # a new shape each time: every op executable would be new
        x = torch.randn(n, n)
        y = x.to("lazy")
        for _ in range(12):  # every link of new shapes
            y, x = torch.cat([y, y[:1] * 2]).tanh(), torch.cat([x, x[:1] * 2]).tanh()
        torch.testing.assert_close(y.cpu(), x)
    assert _counter("interpreted_graphs") == 0 and _counter("compiles") == 3


def test_runtime_checks_raise_eagers_error_op_by_op(always):
    a = torch.arange(6.0, device="lazy")
    y = a * 2
    with pytest.raises(IndexError, match="out of bounds"):
        a[torch.tensor([7], device="lazy")].sum().item()
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert a[torch.tensor([5, -6], device="lazy")].tolist() == [5.0, 0.0]


def test_random_draws_op_by_op_are_the_whole_graphs(monkeypatch):
    def draws():
        lazy_torch.manual_seed(3)
        x = torch.rand(5, device="lazy")
        y = torch.randn(2, 3, device="lazy") + x[:3]
        return torch.cat([x, y.flatten()]).tolist()

    whole = draws()
    monkeypatch.setattr(executor, "_interprets", lambda key, site: True)
    monkeypatch.setattr(executor, "_FEW_NEW_OPS", 1 << 30)
    executor.drop_cache()
    # The same draws; XLA may round a fused transform differently from its op-by-op steps.
    torch.testing.assert_close(torch.tensor(draws()), torch.tensor(whole))
    assert _counter("interpreted_graphs") >= 1


def test_windows_at_every_offset_share_one_executable(always):
    x = torch.randn(5, 7, 3)
    a = x.to("lazy")
    reads = [
        lambda t: t[2], lambda t: t[-1], lambda t: t[:, 3], lambda t: t[:, -2:],
        lambda t: t[1:4], lambda t: t[:, :, 1:], lambda t: t[-3:-1], lambda t: t[10:],
        lambda t: t[::2], lambda t: t.narrow(1, 2, 3), lambda t: t.select(2, -3),
        lambda t: t[4:2],
    ]  # fmt: skip
    for read in reads:
        got, expected = (read(a) * 2).cpu(), read(x) * 2
        assert got.shape == expected.shape and torch.equal(got, expected)
    compiles = _counter("compiles")
    for i in range(5):  # every row: the row read's executable and the product's
        assert torch.equal((a[i] * 2).cpu(), x[i] * 2)
    assert _counter("compiles") == compiles
