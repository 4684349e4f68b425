"""Loops that observe values: a partial sync settles what its graph computes, so every iteration
records the same graph (one compile, then cache hits), and values equal eager's."""

import torch
import torch.nn.functional as F

import lazy_torch
from lazy_torch.debug import ir_text


def _compiles() -> int:
    return lazy_torch.metrics.counters().get("compiles", 0)


def _nodes(t: torch.Tensor) -> int:
    return sum(" = " in line for line in ir_text(t).splitlines())


def test_a_recurrence_observed_every_iteration_records_one_graph():
    def loop(device, n):
        h = torch.zeros(8, device=device)
        x = torch.arange(8.0, device=device)
        sizes, sums = [], []
        for _ in range(n):
            h = 0.9 * h + x
            sizes.append(_nodes(h) if device == "lazy" else 0)
            sums.append(h.sum().item())
        return h, sizes, sums

    expected, _, expected_sums = loop("cpu", 12)
    lazy_torch.metrics.reset()
    h, sizes, sums = loop("lazy", 12)
    torch.testing.assert_close(torch.tensor(sums), torch.tensor(expected_sums))
    torch.testing.assert_close(h.cpu(), expected)
    # The first iteration reads the zeros constant, every later one the device data of the last.
    assert len(set(sizes[1:])) == 1 and sizes[1] <= sizes[0]
    assert _compiles() == 2


def test_a_sequence_grown_by_a_token_per_sync_costs_each_sync_its_new_nodes(monkeypatch):
    # A generation loop: each token reads the last one, joins the pending sequence and is
    # observed. The sequence stays pending (its compile would change every token); the walks
    # that settle each sync (lazy_core/rebase.py) must not go through all of it every time.
    import lazy_core.rebase as rebase

    visits = [0]

    def counted_id(obj):
        visits[0] += 1
        return id(obj)

    def loop(device, n):
        w = torch.linspace(-1, 1, 32, device=device).reshape(4, 8)
        ids = torch.tensor([[1, 2]], device=device)
        stop = torch.tensor(5, device=device).unsqueeze(0)  # a view made once, read every time
        per_sync, stops = [], []
        for _ in range(n):
            logits = w[ids[:, -1] % 4] * 3.0
            nxt = logits.argmax(-1)
            ids = torch.cat([ids, nxt[:, None]], dim=-1)
            before = visits[0]
            stops.append(bool((nxt == stop).all()))
            per_sync.append(visits[0] - before)
        return ids, per_sync, stops

    expected, _, expected_stops = loop("cpu", 60)
    monkeypatch.setattr(rebase, "id", counted_id, raising=False)
    ids, per_sync, stops = loop("lazy", 60)
    assert stops == expected_stops
    assert torch.equal(ids.cpu(), expected)
    assert per_sync[10] > 0
    assert max(per_sync[40:]) <= max(per_sync[5:15]), per_sync


def test_values_that_read_a_synced_graph_read_its_results_afterwards():
    x = torch.randn(5, 3)
    a = x.to("lazy")
    y = (a * 2 + 1).exp()  # computed by the sync below
    z = (y * 3).log().sum(0)  # reads y: afterwards it reads y's buffer
    w = y[1:3].t() @ a[:2]  # a view of y, read by a matmul
    torch.testing.assert_close(torch.tensor(y.sum().item()), (x * 2 + 1).exp().sum())
    assert "aten.exp" not in ir_text(z) and "aten.exp" not in ir_text(w)
    torch.testing.assert_close(z.cpu(), ((x * 2 + 1).exp() * 3).log().sum(0))
    torch.testing.assert_close(w.cpu(), (x * 2 + 1).exp()[1:3].t() @ x[:2])
    assert not y._lazy.storage.pending


def test_an_observed_loss_is_not_computed_again_by_the_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    eager = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    eager.load_state_dict(model.state_dict())
    model.to("lazy")
    x = torch.randn(6, 4)
    loss = model(x.to("lazy")).square().mean()
    expected = eager(x).square().mean()
    # The sync computes the activations autograd saved too.
    torch.testing.assert_close(torch.tensor(loss.item()), expected.detach())
    loss.backward()
    expected.backward()
    grad = model[0].weight.grad
    assert "aten.addmm" not in ir_text(grad) and "aten.relu" not in ir_text(grad)
    torch.testing.assert_close(grad.cpu(), eager[0].weight.grad)


def test_parameter_free_values_stay_pending_and_keep_graphs_stable():
    # (A shape of its own: test_tensor.py counts the compiles of this program on ones(4).)
    x = torch.ones(6, device="lazy")  # a constant: recomputing it costs nothing
    lazy_torch.metrics.reset()
    for lr in (0.1, 0.2, 0.3):
        got = torch.tensor((x * lr + lr).sum().item())
        torch.testing.assert_close(got, (torch.ones(6) * lr + lr).sum())
    assert x._lazy.storage.pending and _compiles() == 1


def test_a_bool_fill_flag_that_changes_keeps_its_graph():
    # transformers' stopping criteria fill torch.full((batch,), is_done) every token; the token
    # where is_done turns True must not compile a graph of its own (a fill's bool is a graph
    # parameter; its 0 and 1 stay constants, as torch.zeros and torch.ones keep theirs).
    x = torch.arange(5.0, device="lazy") * 3 - 7
    lazy_torch.mark_step()
    lazy_torch.metrics.reset()
    for flag in (False, True, False, True):
        done = torch.full((5,), flag, dtype=torch.bool, device="lazy")
        got = torch.where(done, x, x.square()).sum().item()
        expected = torch.where(torch.full((5,), flag), x.cpu(), x.cpu().square()).sum().item()
        assert got == expected, (flag, got, expected)
    assert _compiles() == 1


def test_a_failed_sync_leaves_the_values_that_read_it_intact():
    a = torch.arange(6.0, device="lazy")
    y = a * 2
    z = y + 1  # reads y
    bad = a[torch.tensor([7], device="lazy")]  # out of range: raises at the sync
    try:
        (bad + y).sum().item()
    except IndexError:
        pass
    else:
        raise AssertionError("an out-of-range index must raise")
    assert z.tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_sampling_loops_compile_a_bounded_number_of_graphs():
    p = torch.tensor([0.1, 0.2, 0.7], device="lazy")
    counts = []
    for _ in range(8):
        assert torch.multinomial(p, 1).item() in (0, 1, 2)
        counts.append(_compiles())
    assert counts[2:] == [counts[1]] * 6

    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 3).to("lazy")
    counts = []
    for _ in range(8):
        dist = torch.distributions.Categorical(logits=policy(torch.ones(4, device="lazy")))
        action = dist.sample()
        (-dist.log_prob(action)).backward()
        assert action.item() in (0, 1, 2)
        counts.append(_compiles())
    assert counts[2:] == [counts[1]] * 6
    assert not any(k.startswith("fallback::") for k in lazy_torch.metrics.counters())


def _episodes(device, lengths):
    """REINFORCE with a greedy policy (deterministic, so eager is the oracle): one ``.item()`` per
    step, the log-probs kept for the episode's loss; an episode of each length in ``lengths``."""
    torch.manual_seed(0)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    policy.to(device)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    losses, compiles = [], []
    for length in lengths:
        saved, state = [], torch.randn(1, 4, generator=gen)
        for _ in range(length):
            probs = F.softmax(policy(state.to(device)), dim=1)
            action = probs.argmax(1)
            saved.append(torch.log(probs.gather(1, action[:, None])))
            state = state.roll(1, 1) + (0.1 if action.item() else -0.1)
        returns = torch.linspace(1.0, 0.5, length).to(device)
        loss = -(torch.cat(saved).squeeze(1) * returns).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if device == "lazy":
            lazy_torch.mark_step()
            compiles.append(_compiles())
    return losses, compiles


def test_a_policy_gradient_loop_stops_compiling_after_its_first_episodes():
    expected, _ = _episodes("cpu", [6] * 5)
    losses, compiles = _episodes("lazy", [6] * 5)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected))
    assert compiles[2:] == [compiles[1]] * 3


def test_episodes_of_changing_lengths_run_op_by_op_until_a_length_comes_back(monkeypatch):
    from runtime import config, executor

    monkeypatch.setattr(config, "INTERPRET_AFTER", 2)
    executor.drop_cache()  # another test's graph there would count as one coming back
    lengths = [4, 5, 6, 7, 8, 9] * 4
    expected, _ = _episodes("cpu", lengths)
    losses, compiles = _episodes("lazy", lengths)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected))
    # A graph new to a line that had two already runs op by op, is compiled when it comes back,
    # then hits the cache: the graphs of a cycle of lengths are all cached by its third round.
    assert lazy_torch.metrics.counters()["interpreted_graphs"] >= 4
    assert compiles[18:] == [compiles[17]] * 6


def _lbfgs(device, steps, sync_in_closure):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model.double().to(device)
    x = torch.linspace(-1, 1, 30, dtype=torch.float64).reshape(10, 3).to(device)
    y = x.sum(1, keepdim=True).sin()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)
    losses, compiles, largest = [], [], []
    for _ in range(steps):
        lazy_torch.metrics.reset()

        def closure():
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            if sync_in_closure and device == "lazy":
                lazy_torch.mark_step()
            return loss

        losses.append(opt.step(closure).item())
        if device == "lazy":
            lazy_torch.mark_step()
            compiles.append(_compiles())
            largest.append(max(lazy_torch.metrics.sizes()["graph_nodes"]))
    return losses, compiles, largest


def test_lbfgs_with_several_iterations_a_step_matches_eager_and_stops_compiling():
    for sync_in_closure in (False, True):
        expected, _, _ = _lbfgs("cpu", 8, sync_in_closure)
        losses, compiles, largest = _lbfgs("lazy", 8, sync_in_closure)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected))
        assert sum(compiles[3:]) == 0
        # No sync computes the forward and backward again: the largest graph of a step is at
        # most the first step's (its first closure call's graph); left pending, the optimizer's
        # syncs would each recompute the closure's graph, ten times larger by the eighth step.
        assert max(largest[1:]) <= largest[0]
