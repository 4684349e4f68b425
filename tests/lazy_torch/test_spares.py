"""Spare buffers (runtime/donation.py): a mark_step writes its outputs into the outputs of the
previous one that no tensor holds any more, and never into a buffer something still reads."""

import pytest
import torch

import lazy_torch
import runtime
from runtime import donation, executor


@pytest.fixture
def recycle(monkeypatch):
    monkeypatch.setattr(runtime.config, "RECYCLE", True)


def _pointer(t: torch.Tensor) -> int:
    storage = getattr(t._lazy, "storage", t._lazy)  # a view's storage, or the storage itself
    return runtime.resolve(storage.node.payload).unsafe_buffer_pointer()


def _train(device: str, steps: int, on_step=None, width: int = 8, optimizer=torch.optim.AdamW):
    """Train a small model; returns it and its losses (detached)."""
    torch.manual_seed(width)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, width), torch.nn.Tanh(), torch.nn.Linear(width, 3)
    )
    model = model.to(device)
    opt = optimizer(model.parameters(), lr=1e-2)
    x = torch.randn(5, 6).to(device)
    losses = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if device == "lazy":
            lazy_torch.mark_step()
        losses.append(loss.detach())
        if on_step:
            on_step(i, model)
    return model, losses


def test_gradients_set_to_none_come_back_in_the_buffers_they_had(recycle):
    pointers = []
    _train("lazy", 5, lambda i, m: pointers.append([_pointer(p.grad) for p in m.parameters()]))
    assert pointers[3] == pointers[4] and len(pointers[4]) == 4
    counters = lazy_torch.metrics.counters()
    assert counters["spare_buffers"] >= 3 * 4  # every gradient of the steady steps


def test_training_with_spares_matches_eager_and_stops_compiling(recycle):
    compiles = []
    lazy, lazy_losses = _train(
        "lazy", 6, lambda i, m: compiles.append(lazy_torch.metrics.counters().get("compiles", 0))
    )
    eager, eager_losses = _train("cpu", 6)
    torch.testing.assert_close(torch.stack(lazy_losses).cpu(), torch.stack(eager_losses))
    for p, q in zip(lazy.parameters(), eager.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)
    assert compiles[2] == compiles[-1]  # steady from the third step


def test_a_value_still_held_is_never_a_spare(recycle):
    kept = {}

    def keep(i, model):
        if i == 1:
            kept["grads"] = [p.grad for p in model.parameters()]

    _train("lazy", 4, keep)
    expected = {}
    _train("cpu", 4, lambda i, m: expected.setdefault(i, [p.grad.clone() for p in m.parameters()]))
    for got, want in zip(kept["grads"], expected[1]):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_a_buffer_the_next_graph_reads_is_not_a_spare(recycle):
    x = torch.arange(6.0, device="lazy")
    y = x * 2
    lazy_torch.mark_step()
    y.add_(1)  # y's storage now reads the buffer it held: an operand, donated as such
    z = x + 5
    lazy_torch.mark_step()
    assert y.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert z.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0, 10.0]


def test_spares_of_another_graph_go_to_outputs_of_their_shape(recycle):
    # Shapes of this test's own, so no graph an earlier test compiled is reused.
    x = torch.arange(13.0, device="lazy")
    y, w = x * 2, torch.ones(11, device="lazy") * 7
    lazy_torch.mark_step()
    del y, w  # two dead outputs: float32 (13,) and (11,)
    z = x.exp2() - 1  # only a (13,) output to write
    lazy_torch.metrics.reset()
    lazy_torch.mark_step()
    assert lazy_torch.metrics.counters()["spare_buffers"] == 1
    torch.testing.assert_close(z.cpu(), torch.arange(13.0).exp2() - 1)
    assert x.tolist() == list(range(13))


def test_spares_are_on_by_default_for_gpus_only(monkeypatch):
    monkeypatch.setattr(runtime.config, "RECYCLE", None)
    on = runtime.device(0).platform not in ("cpu", "tpu")
    assert executor._recycles(0) is on
    _train("lazy", 4)
    assert ("spare_buffers" in lazy_torch.metrics.counters()) is on


def test_a_loop_whose_first_step_is_its_steady_one_compiles_once(recycle):
    # Spares change the executable: a graph compiled without them keeps running without them.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("lazy")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4, device="lazy")
    lazy_torch.mark_step()
    lazy_torch.metrics.reset()
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        lazy_torch.mark_step()
    counters = lazy_torch.metrics.counters()
    assert counters["compiles"] == 1 and "spare_buffers" not in counters


def test_a_root_whose_output_is_now_kept_gets_a_new_buffer(recycle, monkeypatch):
    # Loop two's first compile gives its loss root a dead scalar of loop one; its later steps
    # keep their losses, so that root's spare is a new buffer, and nothing compiles again.
    blanks = []
    blank = donation.blank
    monkeypatch.setattr(donation, "blank", lambda *a: blanks.append(a) or blank(*a))
    _train("lazy", 3, width=2, optimizer=torch.optim.SGD)  # its losses die with it
    compiled = lazy_torch.metrics.counters()["compiles"]
    _, kept = _train("lazy", 4, width=5, optimizer=torch.optim.SGD)
    assert lazy_torch.metrics.counters()["compiles"] == compiled + 1
    assert lazy_torch.metrics.counters()["spare_buffers"] > 0
    assert blanks and all(slot == ((), "float32") for slot, _ in blanks)  # the loss's
    _, expected = _train("cpu", 4, width=5, optimizer=torch.optim.SGD)
    for got, want in zip(kept, expected):
        torch.testing.assert_close(got.cpu(), want)
