"""Index tensors and masks on the CPU, as eager CUDA takes them: advanced indexing moves them to
the device (counted as transfers); ops that eager CUDA refuses them for keep raising the device
mismatch, as ordinary ops mixing devices do. Arguments PyTorch wants on the CPU (packed sequences'
lengths, ctc_loss's lengths, tensor_split's indices) work with lazy tensors, with eager's values
and gradients."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import lazy_torch

MISMATCH = "Expected all tensors to be on the same device"


def _counter(name: str) -> int:
    return lazy_torch.metrics.counters().get(name, 0)


def _moved() -> int:
    """Host-to-device copies made or staged (a small one travels when a program takes it)."""
    return _counter("transfers_to_device") + _counter("staged_to_device")


def _x():
    return torch.arange(12.0).reshape(4, 3)


INDEXING = {
    "index": lambda x: x[torch.tensor([0, 2, 2])],
    "index_two": lambda x: x[torch.tensor([0, 3]), torch.tensor([2, 1])],
    "index_second_dim": lambda x: x[:, torch.tensor([2, 0])],
    "mask": lambda x: x[torch.tensor([True, False, True, True])],
    "mask_2d": lambda x: x[x.cpu() > 4 if x.device.type == "lazy" else x > 4],
    "int32": lambda x: x[torch.tensor([1, -1], dtype=torch.int32)],
    "zero_dim": lambda x: x[torch.tensor(1)],
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_with_cpu_indices_matches_eager(name):
    fn = INDEXING[name]
    before = _moved()
    lazy = fn(_x().to("lazy"))
    assert _moved() > before  # the input (and index) moved
    torch.testing.assert_close(lazy.cpu(), fn(_x()))


def _setitem_mask(x):
    x[torch.tensor([True, False, True, False])] = 0
    return x


def _setitem_mask_values(x):
    x[torch.tensor([True, False, True, False])] = torch.tensor([7.0, 8.0, 9.0]).to(x.device)
    return x


def _index_put_(x):
    return x.index_put_((torch.tensor([3, 1]),), torch.tensor(5.0).to(x.device))


def _index_put_accumulate(x):
    index = (torch.tensor([0, 0, 2]), torch.tensor([1, 1, 2]))
    return x.index_put_(index, torch.tensor([1.0, 2.0, 3.0]).to(x.device), accumulate=True)


def _iadd(x):
    x[torch.tensor([0, 2])] += 1
    return x


def _iadd_mask(x):
    x[torch.tensor([[True, False, False]] * 4)] += torch.tensor(2.0).to(x.device)
    return x


def _setitem_through_view(x):
    x[1:][torch.tensor([0, 2])] = -1.0
    return x


WRITES = {
    f.__name__[1:]: f
    for f in (
        _setitem_mask,
        _setitem_mask_values,
        _index_put_,
        _index_put_accumulate,
        _iadd,
        _iadd_mask,
        _setitem_through_view,
    )
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_writes_with_cpu_indices_match_eager(name):
    fn = WRITES[name]
    x = _x().to("lazy")
    assert fn(x) is x
    torch.testing.assert_close(x.cpu(), fn(_x()))


def test_a_cpu_mask_needs_no_sync_and_one_transfer():
    x = _x().to("lazy")
    mask = _x() % 3 == 1
    syncs = sum(v for k, v in lazy_torch.metrics.counters().items() if k.startswith("syncs::"))
    moved = _moved()
    y = x[mask]
    after = sum(v for k, v in lazy_torch.metrics.counters().items() if k.startswith("syncs::"))
    assert after == syncs  # its indices are found on the CPU, where it lies
    assert _moved() == moved + 1  # both dims' indices at once
    torch.testing.assert_close(y.cpu(), _x()[mask])


def test_gradient_through_cpu_indices_matches_eager():
    index, mask = torch.tensor([0, 2, 0]), torch.tensor([True, False, True, True])
    grads = []
    for device in ("cpu", "lazy"):
        x = _x().to(device).requires_grad_()
        (x[index] * 2).sum().backward()
        (x[mask] ** 2).sum().backward()
        grads.append(x.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


# Eager CUDA refuses CPU index tensors for these (a device check in the op's wrapper or kernel).
REFUSED = {
    "index_select": lambda x, i, m: x.index_select(0, i),
    "gather": lambda x, i, m: x.gather(0, i.reshape(1, 2).expand(2, 2)),
    "scatter": lambda x, i, m: x.scatter(0, i.reshape(1, 2), 1.0),
    "scatter_add_": lambda x, i, m: x.scatter_add_(0, i.reshape(1, 2), x[:1, :2]),
    "index_add_": lambda x, i, m: x.index_add_(0, i, x[:2]),
    "index_copy_": lambda x, i, m: x.index_copy_(0, i, x[:2]),
    "index_fill_": lambda x, i, m: x.index_fill_(0, i, 1.0),
    "masked_fill_": lambda x, i, m: x.masked_fill_(m, 1.0),
    "masked_scatter": lambda x, i, m: x.masked_scatter(m, x),
    "take": lambda x, i, m: torch.take(x, i),
    "add": lambda x, i, m: x + torch.ones(4, 3),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_ops_refuse_cpu_tensors(name):
    i, m = torch.tensor([0, 2]), torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=MISMATCH):
        REFUSED[name](_x().to("lazy"), i, m)
    lazy_torch.mark_step(wait=True)


def test_tensor_split_takes_cpu_indices_and_refuses_device_ones():
    x = torch.arange(10.0)
    for sections in (torch.tensor([1, 3]), torch.tensor(3)):
        got = torch.tensor_split(x.to("lazy"), sections)
        for a, b in zip(got, torch.tensor_split(x, sections), strict=True):
            torch.testing.assert_close(a.cpu(), b)
    message = "tensor_split expected tensor_indices_or_sections to be on cpu, but it's on lazy:0"
    with pytest.raises(RuntimeError, match=message):
        torch.tensor_split(x.to("lazy"), torch.tensor([1, 3], device="lazy"))


# ------------------------------------------------------------------------------------------------
# Recurrent layers on packed sequences: lengths on the CPU, as PyTorch requires.


@pytest.mark.parametrize(
    "kind,batch_first,enforce_sorted",
    [("LSTM", True, False), ("LSTM", False, True), ("GRU", False, False), ("GRU", True, True)],
)
def test_packed_sequence_training_matches_eager(kind, batch_first, enforce_sorted):
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(4, 5, bidirectional=True, batch_first=batch_first)
    head = torch.nn.Linear(10, 1)
    lengths = torch.tensor([6, 4, 4, 1]) if enforce_sorted else torch.tensor([4, 6, 1, 4])
    padded = torch.randn(4, 6, 4) if batch_first else torch.randn(6, 4, 4)
    results = []
    for device in ("cpu", "lazy"):
        torch.manual_seed(1)
        rnn = getattr(torch.nn, kind)(4, 5, bidirectional=True)
        rnn.batch_first = batch_first
        rnn.load_state_dict(layer.state_dict())
        lin = torch.nn.Linear(10, 1)
        lin.load_state_dict(head.state_dict())
        rnn.to(device), lin.to(device)
        opt = torch.optim.SGD([*rnn.parameters(), *lin.parameters()], lr=0.1)
        losses = []
        for _ in range(2):
            x = padded.detach().to(device).requires_grad_()
            packed = pack_padded_sequence(x, lengths, batch_first, enforce_sorted)
            out, _ = rnn(packed)
            out, out_lengths = pad_packed_sequence(out, batch_first)
            loss = lin(out).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if device == "lazy":
                lazy_torch.mark_step()
        assert torch.equal(out_lengths, lengths)
        results.append(
            ([t.cpu() for t in losses], x.grad.cpu(), [p.cpu() for p in rnn.parameters()])
        )
    (eager_losses, eager_grad, eager_params), (losses, grad, params) = results
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(params, eager_params, rtol=1e-5, atol=1e-6)


def test_pack_padded_sequence_raises_eagers_errors():
    x = torch.randn(3, 2, 4)
    cases = [
        (torch.tensor([2, 3]), "`lengths` array must be sorted in decreasing order"),
        (torch.tensor([3, 2, 1]), "Expected `len(lengths)` to be equal to batch_size"),
        (torch.tensor([3, 0]), "Length of all samples has to be greater than 0"),
    ]
    for lengths, message in cases:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            pack_padded_sequence(x, lengths)
        with pytest.raises(RuntimeError, match=re.escape(message)):
            pack_padded_sequence(x.to("lazy"), lengths)
    with pytest.raises(RuntimeError, match="should be a 1D CPU int64 tensor, but got 1D lazy:0"):
        torch._VF._pack_padded_sequence(x.to("lazy"), torch.tensor([3, 2], device="lazy"), False)


# ------------------------------------------------------------------------------------------------
# ctc_loss with lengths as tensors (on the CPU, or on the device: read with one sync).


@pytest.mark.parametrize("lengths_device", ["cpu", "lazy"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ctc_loss_with_tensor_lengths_matches_eager(reduction, lengths_device):
    torch.manual_seed(0)
    logits = torch.randn(8, 3, 5)
    targets = torch.tensor([[1, 2, 2], [3, 1, 0], [4, 4, 1]])
    input_lengths, target_lengths = torch.tensor([8, 6, 7]), torch.tensor([3, 2, 3])
    results = []
    for device in ("cpu", "lazy"):
        x = logits.detach().to(device).requires_grad_()
        lens = (input_lengths, target_lengths)
        if device == "lazy":
            lens = tuple(t.to(lengths_device) for t in lens)
        loss = F.ctc_loss(x.log_softmax(2), targets, *lens, reduction=reduction)
        loss.sum().backward()
        results.append((loss.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)


def test_ctc_loss_refuses_float_lengths_as_eager():
    log_probs = torch.randn(4, 1, 3).log_softmax(2)
    args = (torch.tensor([[1, 2]]), torch.tensor([4.0]), torch.tensor([2]))
    with pytest.raises(RuntimeError, match="input_lengths must be integral"):
        F.ctc_loss(log_probs, *args)
    with pytest.raises(RuntimeError, match="input_lengths must be integral"):
        F.ctc_loss(log_probs.to("lazy"), *args)
