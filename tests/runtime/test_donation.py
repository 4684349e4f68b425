"""runtime/donation.py: which buffers an executable takes over. At a mark_step a buffer read for
the last time is donated to the new value of the tensor that held it; one that a live tensor still
holds, or any buffer of a partial sync, is not. Which donated buffers an executable keeps, and the
order it returns its roots in, so that JAX's donation pairing (each output takes the first unused
donated argument of its shape and dtype) gives each buffer to its partner root."""

import torch

import lazy_torch
import runtime
from lazy_core import Node, Operand, cut_graph, data_leaf
from runtime.donation import pairing as _pairing


def _donated():
    return lazy_torch.metrics.counters().get("donated_buffers", 0)


def _buffer(t):
    """The address of the device buffer holding ``t``'s value."""
    return runtime.resolve(t._lazy.node.payload).unsafe_buffer_pointer()


def test_an_in_place_update_at_mark_step_writes_into_the_donated_buffer():
    cpu = torch.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]])
    p = cpu.to("lazy")
    # An upload's buffer may be the host copy itself (JAX aliases a 64-byte aligned host array
    # on the CPU platform), which XLA cannot write into: the first step may allocate, so the
    # buffer followed is the one the first step wrote.
    p.mul_(0.5).add_(1.0)
    cpu.mul_(0.5).add_(1.0)
    lazy_torch.mark_step(wait=True)
    address = _buffer(p)
    for _ in range(3):
        p.mul_(0.5).add_(1.0)
        cpu.mul_(0.5).add_(1.0)
        lazy_torch.mark_step(wait=True)
        assert _buffer(p) == address
    assert _donated() == 4
    torch.testing.assert_close(p.cpu(), cpu)


def test_a_value_read_from_a_donated_buffer_in_the_same_step_is_eagers():
    cpu = torch.tensor([1.0, 2.0, 3.0])
    p = cpu.to("lazy")
    lazy_torch.mark_step(wait=True)
    snapshot, total = p.clone(), p.sum()  # computed by the step that overwrites p's buffer
    p.mul_(-3.0)
    lazy_torch.mark_step(wait=True)
    assert _donated() == 1
    assert snapshot.tolist() == [1.0, 2.0, 3.0] and total.item() == 6.0
    assert p.tolist() == [-3.0, -6.0, -9.0]


def test_a_buffer_another_tensor_still_holds_is_not_donated():
    a = torch.tensor([1.0, 2.0, 3.0]).to("lazy") * 1
    b = torch.empty(3, device="lazy").copy_(a)  # b's value is a's: after the step, one buffer
    lazy_torch.mark_step(wait=True)
    assert a._lazy.node.payload is b._lazy.node.payload
    lazy_torch.metrics.reset()
    a.mul_(2)
    lazy_torch.mark_step(wait=True)
    assert _donated() == 0
    assert b.tolist() == [1.0, 2.0, 3.0] and a.tolist() == [2.0, 4.0, 6.0]


def test_an_input_the_step_leaves_unchanged_is_not_donated():
    x = torch.tensor([1.0, 2.0]).to("lazy")
    y = x * 2
    lazy_torch.mark_step(wait=True)
    assert _donated() == 0
    assert x.tolist() == [1.0, 2.0] and y.tolist() == [2.0, 4.0]


def test_without_donation_values_are_the_same(monkeypatch):
    monkeypatch.setattr(runtime.config, "DONATE", False)
    p = torch.tensor([1.0, 2.0]).to("lazy")
    lazy_torch.mark_step(wait=True)
    for _ in range(2):
        p.add_(1.5)
        lazy_torch.mark_step(wait=True)
    assert _donated() == 0 and p.tolist() == [4.0, 5.0]


def test_an_optimizer_step_updates_each_tensor_in_its_own_donated_buffer():
    # Layers of one shape: every parameter and moment could take any other's buffer, and a
    # buffer given to another tensor's new value makes XLA copy both values (two kernels each).
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)]).to("lazy")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8, device="lazy")

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        lazy_torch.mark_step(wait=True)

    def buffers():
        tensors = [*model.parameters()] + [
            s[k] for s in opt.state.values() for k in s if k != "step"
        ]
        return [runtime.resolve(t._lazy.node.payload).unsafe_buffer_pointer() for t in tensors]

    step()
    step()
    before = buffers()
    step()
    assert buffers() == before and len(before) == 24


def test_donation_at_mark_step_never_on_partial_syncs():
    model = torch.nn.Linear(64, 64).to("lazy")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 64).to("lazy")
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        lazy_torch.mark_step()
    donated = lazy_torch.metrics.counters().get("donated_buffers", 0)
    assert donated >= 2 * 2  # weight and bias from the second step on
    before = lazy_torch.metrics.counters()["donated_buffers"]
    with torch.no_grad():
        model.weight.add_(1)
    model.weight.sum().item()  # partial sync
    assert lazy_torch.metrics.counters()["donated_buffers"] == before
    # Inputs stay readable. (A sum of 512 normals can lie near 0, where an exact relative bound
    # failed on the two sums' rounding; float32's default tolerances hold.)
    torch.testing.assert_close(x.sum().cpu(), x.cpu().sum())


def _add(a, b):
    return Node("aten.add.Tensor", (a, b), ((Operand(0), Operand(1)), ()), "float32", (3,))


def _jax_pairs(graph, donate, order):
    """Parameter -> root, as JAX pairs donated arguments with the outputs in ``order``."""
    outputs = order or range(len(graph.roots))
    free = list(donate)  # one shape and dtype here: first unused donated argument
    return {free.pop(0): k for k in outputs if free}


def test_each_donated_buffer_goes_to_its_partner_root():
    x, y, w = (data_leaf(object(), "float32", (3,)) for _ in range(3))
    graph = cut_graph([_add(_add(x, y), w), _add(w, w)])  # parameters x, y, w
    donate, order = _pairing(graph, (0, 1, 2), {0: 1, 2: 0})
    assert _jax_pairs(graph, donate, order) == {0: 1, 2: 0}
    # y has no partner and no root is left for it: donating it would take w's partner.
    assert donate == (0, 2)


def test_a_root_claimed_by_two_parameters_goes_to_the_first():
    x, y, w = (data_leaf(object(), "float32", (3,)) for _ in range(3))
    graph = cut_graph([_add(_add(x, y), w), _add(w, w)])
    donate, order = _pairing(graph, (0, 1, 2), {0: 0, 1: 0, 2: 1})
    assert _jax_pairs(graph, donate, order) == {0: 0, 2: 1}
    assert order is None or sorted(order) == [0, 1]


def test_spares_follow_the_parameters_and_go_to_their_partner_roots():
    x, y = (data_leaf(object(), "float32", (3,)) for _ in range(2))
    graph = cut_graph([_add(x, y), _add(y, y), _add(x, x)])  # parameters x, y; three roots
    slot = ((3,), "float32")
    # x donated with partner root 2; spares 2 and 3 (after the two parameters) were roots 0 and 1.
    donate, order = _pairing(graph, (0, 2, 3), {0: 2, 2: 0, 3: 1}, (slot, slot))
    assert donate == (0, 2, 3)
    assert _jax_pairs(graph, donate, order) == {0: 2, 2: 0, 3: 1}
    # A spare of a shape no root has is left out.
    donate, order = _pairing(graph, (2,), {}, (((4,), "float32"),))
    assert donate == () and order is None
