"""lazy_torch/sync.py: barriers. mark_step computes every pending value in one graph per device
and leaves device data; a partial sync (an observed value) computes what it reads, counted by cause
and call site; a failed sync leaves every value pending; what a sync observes, later reads see."""

import doctest

import pytest
import torch

import lazy_torch
import runtime
from lazy_core import pending_storages
from lazy_torch import sync
from lowerings import LOWERINGS
from runtime import executor


def _counters():
    return lazy_torch.metrics.counters()


def _is_pending(t):
    storage = t._lazy.storage
    return storage.pending, any(s is storage for s in pending_storages())


def test_mark_step_computes_every_pending_value_in_one_graph():
    cpu = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    x = cpu.to("lazy")
    y, total = x * 2, x.sum(0)
    x.add_(1)
    assert _is_pending(y) == _is_pending(total) == _is_pending(x) == (True, True)
    lazy_torch.mark_step(wait=True)
    assert _is_pending(y) == _is_pending(total) == _is_pending(x) == (False, False)
    counters = _counters()
    assert (counters["mark_steps"], counters["syncs::mark_step"], counters["executions"]) == (
        1,
        1,
        1,
    )
    (site,) = lazy_torch.metrics.sites()["syncs::mark_step"]
    assert site.startswith(__file__ + ":")
    torch.testing.assert_close(y.cpu(), cpu * 2)
    torch.testing.assert_close(total.cpu(), cpu.sum(0))
    torch.testing.assert_close(x.cpu(), cpu + 1)


def test_the_same_ops_on_storages_made_in_another_order_are_the_same_graph():
    # mark_step's roots follow the order their values were recorded in, not the storages'
    # creation order (the RNG state made at a program's first draw, say).
    def run(p_first: bool) -> list:
        made = [torch.full((2,), 5.0, device="lazy"), torch.zeros(2, device="lazy")]
        p, q = made if p_first else made[::-1]
        p.fill_(5.0)
        q.zero_()
        lazy_torch.mark_step()  # p made before q, or after
        before = _counters().get("compiles", 0)
        q.add_(1)
        p.mul_(2)
        lazy_torch.mark_step()
        return [_counters().get("compiles", 0) - before, p.cpu().tolist(), q.cpu().tolist()]

    executor.drop_cache()
    first, second = run(True), run(False)
    assert first[0] == 1 and second[0] == 0, (first, second)
    assert first[1:] == second[1:] == [[10.0, 10.0], [1.0, 1.0]]


def test_mark_step_with_nothing_pending_runs_nothing():
    x = torch.ones(2, device="lazy")
    lazy_torch.mark_step(wait=True)
    lazy_torch.metrics.reset()
    lazy_torch.mark_step(wait=True)
    assert _counters() == {"mark_steps": 1}
    assert x.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "observe, cause",
    [
        (lambda t: t.sum().item(), "item"),
        (lambda t: t.tolist(), "tolist"),
        (lambda t: t.cpu(), "cpu"),
        (lambda t: t.numpy(), "numpy"),
        (lambda t: str(t), "print"),
    ],
    ids=["item", "tolist", "cpu", "numpy", "print"],
)
def test_an_observed_value_syncs_what_it_reads_and_counts_its_cause(observe, cause):
    x = torch.tensor([1.0, 2.0, 3.0]).to("lazy")
    y, other = x * 2, x - 1
    observe(y)
    assert _counters()[f"syncs::{cause}"] == 1 and "syncs::mark_step" not in _counters()
    (site,) = lazy_torch.metrics.sites()[f"syncs::{cause}"]
    assert site.startswith(__file__ + ":")
    assert not y._lazy.storage.pending
    assert other._lazy.storage.pending  # no part of what was read
    assert other.tolist() == [0.0, 1.0, 2.0] and y.tolist() == [2.0, 4.0, 6.0]


def test_sync_of_storages_makes_them_device_data():
    x = torch.tensor([1.0, 2.0]).to("lazy")
    y, z = x * 3, x + 3
    sync.sync([y._lazy.storage, z._lazy.storage], cause="test")
    assert not y._lazy.storage.pending and not z._lazy.storage.pending
    assert _counters()["syncs::test"] == 1 and _counters()["executions"] == 1
    assert y.tolist() == [3.0, 6.0] and z.tolist() == [4.0, 5.0]
    sync.sync([y._lazy.storage], cause="test")  # nothing pending: nothing runs
    assert _counters()["syncs::test"] == 1 and _counters()["executions"] == 1


def test_a_sync_that_fails_to_compile_leaves_every_value_pending(monkeypatch):
    x = torch.tensor([1.0, 2.0]).to("lazy")
    y, z = x * 3, x + 3

    def broken(ctx, *args):
        raise ValueError("no such lowering today")

    monkeypatch.setitem(LOWERINGS, "aten.mul.Tensor", broken)
    executor.drop_cache()  # the graph compiles now, not from an executable of an earlier test
    with pytest.raises(runtime.GraphError, match="no such lowering today"):
        sync.sync([y._lazy.storage, z._lazy.storage], cause="test")
    assert y._lazy.storage.pending and z._lazy.storage.pending
    monkeypatch.undo()
    assert y.tolist() == [3.0, 6.0] and z.tolist() == [4.0, 5.0]


def test_a_value_observed_before_the_barrier_is_the_value_it_leaves():
    lazy_torch.manual_seed(0)
    r = torch.rand(4, device="lazy")
    scaled = r * 10
    seen = r.tolist()  # a partial sync: the random draw is computed once, not again at the step
    lazy_torch.mark_step(wait=True)
    assert r.tolist() == seen
    torch.testing.assert_close(scaled.cpu(), torch.tensor(seen) * 10)
    assert torch.rand(4, device="lazy").tolist() != seen  # the next step draws afresh


def test_mark_step_records_the_steps_timings():
    x = torch.ones(2, device="lazy")
    for _ in range(2):
        x.add_(1)
        lazy_torch.mark_step()
    timings = lazy_torch.metrics.timings()
    for name in ("mark_step_time", "trace_time", "step_time"):
        assert len(timings[name]) == 2 and min(timings[name]) >= 0.0, name
    assert x.tolist() == [3.0, 3.0]


def test_the_mark_step_example_runs():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner()
    for test in finder.find(sync.mark_step, "mark_step", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False) == doctest.TestResults(failed=0, attempted=4)


@pytest.fixture
def cut_every():
    """Automatic cuts after a few hundred nodes (runtime.config.CUT_NODES is 20,000)."""

    def configure(every: int) -> None:
        sync.configure_cuts(every)

    yield configure
    sync.configure_cuts(runtime.config.CUT_NODES)


def test_a_loop_that_never_reaches_a_barrier_is_cut_and_matches_eager(cut_every):
    cut_every(300)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 6, generator=g)
    lazy_w = w.to("lazy")
    total, lazy_total = torch.zeros(6), torch.zeros(6, device="lazy")
    totals, kept = [], []
    for _ in range(60):  # about 10 nodes an iteration: a cut every 30 or so
        x = torch.randn(6, generator=g)
        total = total + torch.tanh(w @ x) * 0.5
        lazy_total = lazy_total + torch.tanh(lazy_w @ x.to("lazy")) * 0.5
        totals.append(total)
        kept.append(lazy_total)  # live tensors are cut with the rest
    assert lazy_torch.metrics.counters().get("syncs::auto_cut", 0) >= 1
    for mine, eager in zip(kept, totals):
        torch.testing.assert_close(mine.cpu(), eager)


def test_a_cut_never_comes_while_a_barrier_resets_the_count(cut_every):
    cut_every(300)
    x = torch.ones(4, device="lazy")
    for _ in range(100):
        x = x * 1.5 - 0.25
        lazy_torch.mark_step()  # each step is a few nodes: the count starts again
    assert lazy_torch.metrics.counters().get("syncs::auto_cut", 0) == 0
    expected = torch.ones(4)
    for _ in range(100):
        expected = expected * 1.5 - 0.25
    torch.testing.assert_close(x.cpu(), expected)


def _evaluate(device: str, batches: list, w: torch.Tensor) -> torch.Tensor:
    correct = torch.zeros((), dtype=torch.long, device=device)
    w = w.to(device)
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = torch.relu(x @ w) - 0.5
        correct += (logits.argmax(-1) == y).sum()
    return correct


def test_cuts_fall_where_the_loop_comes_round_so_its_segments_compile_once(cut_every):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 5, generator=g)
    batches = [(torch.randn(4, 8, generator=g), torch.randint(0, 5, (4,), generator=g))
               for _ in range(300)]  # fmt: skip
    expected = _evaluate("cpu", batches, w)
    lazy_torch.mark_step()
    for every in (120, 200):  # several cuts, whatever the count at the loop's head
        cut_every(every)
        compiles = lazy_torch.metrics.counters().get("compiles", 0)
        cuts = lazy_torch.metrics.counters().get("syncs::auto_cut", 0)
        got = _evaluate("lazy", batches, w)
        assert torch.equal(got.cpu(), expected)
        assert lazy_torch.metrics.counters().get("syncs::auto_cut", 0) - cuts >= 5
        # The first segment, the steady one (every other cut reuses it), the rest at the read.
        assert lazy_torch.metrics.counters().get("compiles", 0) - compiles <= 3


def test_a_copy_of_device_data_stays_pending_so_an_earlier_read_leaves_the_next_graph_alone():
    # transformers clones the inputs it slices; one of its checks reads the clone on the first
    # generate() call only. The clone stays pending (lazy_core/rebase.py), as a view would, so
    # the graph that then reads it is the same on every call.
    x = torch.arange(12, device="lazy").view(2, 6)
    lazy_torch.mark_step()

    def graph_of_use(read: bool) -> set:
        c = x[:, 1:].clone(memory_format=torch.contiguous_format)
        if read:
            assert (c == 3).any().item()
        keys: list = []
        stop = runtime.metrics.listen(lambda e: keys.append(e.graph))
        try:
            assert (c * 3).sum().item() == 3 * (66 - 6)
        finally:
            stop()
        return set(keys)

    assert graph_of_use(True) == graph_of_use(False)
