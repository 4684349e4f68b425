"""torch.cond, while_loop, scan and map on lazy tensors (lazy_torch/control_flow.py) against their
eager definitions on CPU: values, no syncs, one compile across predicate values and trip counts,
writes of enclosing tensors (through views too), runtime checks inside bodies, and clear errors."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from torch._higher_order_ops.map import map as map_
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop

import lazy_torch
from lazy_torch import control_flow


def _count(name: str) -> int:
    return lazy_torch.metrics.counters().get(name, 0)


def _syncs() -> int:
    counters = lazy_torch.metrics.counters()
    return sum(
        v for k, v in counters.items() if k.startswith("syncs::") and k != "syncs::mark_step"
    )


# What the operators mean (their eager definitions), run on CPU tensors.
def _cond(pred, true_fn, false_fn, operands):
    return true_fn(*operands) if pred else false_fn(*operands)


def _while(cond_fn, body_fn, carried):
    while cond_fn(*carried):
        carried = body_fn(*carried)
    return carried


def _scan(combine_fn, init, xs):
    ys = []
    for x in xs:
        init, y = combine_fn(init, x)
        ys.append(y)
    return init, torch.stack(ys)


OPS = {"lazy": (torch.cond, while_loop, scan), "cpu": (_cond, _while, _scan)}


def _program(device: str, threshold: float, trips: int) -> list[torch.Tensor]:
    """cond, while_loop and scan with writes into enclosing tensors, a view among them."""
    cond, loop, scan_ = OPS[device]
    w = torch.arange(4.0, device=device) * 2
    x = torch.linspace(-1, 1, 4, device=device)
    seen = torch.zeros(2, 4, device=device)
    row = seen[1]  # a view: writes through it reach ``seen``

    def yes(a):
        row.add_(a)  # a write into the enclosing scope, through a view
        return a * w + 1

    def no(a):
        return a - w

    out = [cond(x.sum() + threshold > 0, yes, no, (x,)), seen.clone()]
    b = torch.zeros(6, device=device)

    def body(i, acc):
        b[i] = b[i] + i  # b, of the enclosing scope, is carried from one iteration to the next
        return i + 1, acc * 2 + b.sum()

    start = torch.tensor(0, device=device)
    out += [*loop(lambda i, acc: i < trips, body, (start, torch.ones(3, device=device))), b]
    xs = torch.arange(12.0, device=device).reshape(4, 3) - trips
    carry, ys = scan_(lambda c, v: (c + v.relu(), c * v), torch.zeros(3, device=device), xs)
    return [*out, carry, ys]


@torch.no_grad()
def test_cond_while_and_scan_match_eager_without_syncs_and_compile_once():
    lazy_torch.mark_step()
    compiles, syncs = _count("compiles"), _syncs()
    for threshold, trips in ((2.0, 3), (-2.0, 5), (2.0, 6)):  # both branches, three trip counts
        got = _program("lazy", threshold, trips)
        lazy_torch.mark_step()
        for g, e in zip(got, _program("cpu", threshold, trips)):
            assert g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g.cpu(), e, rtol=1e-6, atol=1e-6)
    assert _count("compiles") - compiles == 1
    assert _syncs() == syncs  # the reads above come after each barrier


@torch.no_grad()
def test_cond_writes_into_its_operand_and_keeps_other_operands():
    def run(device):
        cond = OPS[device][0]
        x = torch.ones(3, device=device)
        y = torch.full((3,), 5.0, device=device)

        def grow(a, b):
            a.mul_(3)
            return a + b

        return [cond(torch.tensor(True, device=device), grow, lambda a, b: a - b, (x, y)), x, y]

    for g, e in zip(run("lazy"), run("cpu")):
        assert torch.equal(g.cpu(), e)


@torch.no_grad()
def test_a_cpu_predicate_is_taken_as_cuda_takes_it():
    x = torch.arange(3.0, device="lazy")
    out = torch.cond(torch.tensor(False), lambda a: a + 1, lambda a: a - 1, (x,))
    assert out.cpu().tolist() == [-1.0, 0.0, 1.0]


@torch.no_grad()
def test_an_index_out_of_range_inside_a_loop_body_raises_as_eager():
    b = torch.zeros(3, device="lazy")

    def body(i):
        b[i] = b[i] + 1
        return (i + 1,)

    while_loop(lambda i: i < 4, body, (torch.tensor(0, device="lazy"),))
    with pytest.raises(IndexError, match="out of bounds"):
        lazy_torch.mark_step()
        b.cpu()
    lazy_torch.mark_step()


@torch.no_grad()
def test_scan_of_index_reads_inside_the_body():
    table = torch.arange(20.0).reshape(5, 4)
    picks = torch.tensor([4, 0, 2])

    def step(c, i):
        return c + table_[i], table_[i].sum(0, keepdim=True)

    table_ = table
    expected = _scan(step, torch.zeros(4), picks)
    table_ = table.to("lazy")
    got = scan(step, torch.zeros(4, device="lazy"), picks.to("lazy"))
    for g, e in zip(got, expected):
        assert torch.equal(g.cpu(), e)


def test_loop_bodies_draw_anew_each_iteration_reproducibly_without_syncs():
    def run(trips):
        lazy_torch.manual_seed(3)
        rows = torch.zeros(4, 3, device="lazy")
        before = torch.rand(3, device="lazy")

        def body(i, total):
            rows[i] = torch.rand(3, device="lazy")  # the RNG state is carried like rows
            return i + 1, total + torch.randn((), device="lazy")

        with torch.no_grad():
            start = (torch.tensor(0, device="lazy"), torch.zeros((), device="lazy"))
            _, total = while_loop(lambda i, t: i < trips, body, start)
            after = torch.rand(3, device="lazy")
            zeros = torch.zeros(3, 2, device="lazy")
            _, ys = scan(lambda c, x: (c + 1, torch.rand(2, device="lazy") + x), zeros[0, 0], zeros)
        syncs = _syncs()
        lazy_torch.mark_step()
        assert _syncs() == syncs  # nothing was read while recording
        return [t.cpu() for t in (before, rows, total, after, ys)]

    trips = torch.tensor(4, device="lazy")
    lazy_torch.mark_step()  # device data, as every later trip count
    compiles = _count("compiles")
    first, again = run(trips), run(trips)
    assert _count("compiles") - compiles == 1  # one graph, replayed
    for a, b in zip(first, again):
        assert torch.equal(a, b)  # the seed decides every draw
    before, rows, _, after, ys = first
    values = torch.cat([before, rows.flatten(), after, ys.flatten()])
    assert len(set(values.tolist())) == len(values) and 0 <= values.min() and values.max() < 1
    trips = torch.tensor(2, device="lazy")
    lazy_torch.mark_step()
    fewer = run(trips)
    assert torch.equal(fewer[1][:2], rows[:2]) and not fewer[1][2:].any()
    assert _count("compiles") - compiles == 1  # the trip count is data


class _Doubling(torch.nn.Module):
    def __init__(self, noise: bool) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((3,), 2.0))
        self.noise = noise

    def forward(self, x, trips):
        def body(i, acc):
            acc = acc * self.scale
            if self.noise:
                acc = acc + torch.rand(3, device=x.device)
            return i + 1, acc

        start = torch.zeros((), dtype=torch.long, device=x.device)
        return while_loop(lambda i, acc: i < trips, body, (start, x))[1]


def test_a_compiled_module_with_a_loop_runs_it_op_by_op_and_draws_anew_each_call():
    # Its bodies are traced with the capture's host-tensor watch off (a CPU tensor one read
    # would be frozen into a replay), so the call is not captured: one warning, right values.
    x, trips = torch.ones(3), torch.tensor(3)
    expected = _Doubling(False)(x, trips)
    with torch.no_grad():
        plain = lazy_torch.compile(_Doubling(False).to("lazy"))
        with pytest.warns(UserWarning, match="it runs while_loop, whose bodies a capture"):
            got = [plain(x.to("lazy"), trips.to("lazy")).cpu() for _ in range(3)]
        assert all(torch.equal(g, expected) for g in got)
        runs = []
        for _ in range(2):
            lazy_torch.manual_seed(5)
            noisy = lazy_torch.compile(_Doubling(True).to("lazy"))
            with pytest.warns(UserWarning, match="whose bodies a capture cannot watch"):
                runs.append([noisy(x.to("lazy"), trips.to("lazy")).cpu() for _ in range(3)])
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # the seed decides every draw
    first = runs[0]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert all(((8 <= v) & (v < 15)).all() for v in first)  # 8 + noise of 4 + 2 + 1 draws < 1


def test_bodies_that_sync_or_need_grad_raise_clear_errors():
    x = torch.ones(3, device="lazy")
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=r"pure tensor program.*syncs \(item\)"):
            torch.cond(x.sum() > 0, lambda a: a * a.sum().item(), lambda a: a, (x,))
        with pytest.raises(RuntimeError, match="cond_fn writes a tensor in place or draws"):
            while_loop(lambda i: i < torch.rand((), device="lazy") * 3, lambda i: (i + 1,),
                       (torch.tensor(0, device="lazy"),))  # fmt: skip
        with pytest.raises(NotImplementedError, match=r"writes in place into b\[i\]"):
            while_loop(lambda i: i < 2, lambda i: (x[i].add_(1), i + 1)[1:],
                       (torch.tensor(0, device="lazy"),))  # fmt: skip
        with pytest.raises(RuntimeError, match="must match"):
            torch.cond(x.sum() > 0, lambda a: a, lambda a: a[:2], (x,))
    w = torch.ones(3, device="lazy", requires_grad=True)
    with pytest.raises(NotImplementedError, match="records no autograd graph"):
        while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2),
                   (torch.tensor(0, device="lazy"), w))  # fmt: skip
    with pytest.raises(NotImplementedError, match="enclosing scope that requires grad"):
        torch.cond(x.sum() > 0, lambda a: a * w, lambda a: a, (x,))  # w's gradient: lost
    with pytest.raises(NotImplementedError, match="enclosing scope that requires grad"):
        scan(lambda c, v: (c + v * w, c.clone()), torch.zeros(3, device="lazy"), x.reshape(3, 1))
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]  # nothing lost


def test_gradients_through_cond_match_eager():
    def run(device, threshold):
        w = torch.tensor([0.5, -1.0, 2.0], device=device, requires_grad=True)
        x = torch.arange(3.0, device=device)
        cond = OPS[device][0]
        out = cond(
            x.sum() > threshold,
            lambda a, b: ((a + 1) * b).sin(),
            lambda a, b: a + b * b,
            (x, w),
        )
        (out * torch.arange(1.0, 4.0, device=device)).sum().backward()
        return [out.detach(), w.grad]

    for threshold in (1.0, 10.0):
        for g, e in zip(run("lazy", threshold), run("cpu", threshold)):
            torch.testing.assert_close(g.cpu(), e)


def test_the_patched_compile_route_is_still_pytorchs_for_other_tensors():
    from torch._higher_order_ops import utils

    route = getattr(utils, "_hop_compile_and_call", None)  # torch 2.11: setup_compilation_env
    route = route if route is not None else utils.setup_compilation_env
    assert getattr(route, "_lazy_patch", False)
    assert route.__wrapped__.__name__ in ("_hop_compile_and_call", "setup_compilation_env")
    x = torch.arange(3.0)
    out = torch.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, (x,))
    assert out.tolist() == [1.0, 2.0, 3.0]
    assert control_flow.COND == "lazy.cond"


def test_torch_2_11s_route_calls_the_operator_with_lazy_tensors_and_compiles_others():
    # torch 2.11's operators call torch.compile themselves inside setup_compilation_env.
    @contextlib.contextmanager
    def setup_compilation_env():
        yield "eager"

    utils = types.SimpleNamespace(setup_compilation_env=setup_compilation_env)
    control_flow._install_compile_env(utils)
    seen = []

    def operator(x):
        seen.append(torch.compiler.is_compiling())
        return x + 1

    compile_ = torch.compile
    with utils.setup_compilation_env() as backend:
        on_lazy = torch.compile(operator, backend=backend)(torch.ones(2, device="lazy"))
        on_cpu = torch.compile(operator, backend=backend)(torch.ones(2))
    assert torch.compile is compile_
    assert on_lazy.cpu().tolist() == on_cpu.tolist() == [2.0, 2.0]
    assert seen == [False, True]  # called itself; traced by TorchDynamo


@torch.no_grad()
def test_map_matches_eager_with_extra_arguments():
    w = torch.arange(3.0)
    xs = torch.arange(12.0).reshape(4, 3)

    def f(x, y):
        return {"sum": (x * y + 1).sum(0, keepdim=True), "max": torch.maximum(x, y)}

    expected = [f(x, w) for x in xs]
    got = map_(f, xs.to("lazy"), w.to("lazy"))
    for key in ("sum", "max"):
        assert torch.equal(got[key].cpu(), torch.stack([e[key] for e in expected]))
