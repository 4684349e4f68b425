"""The launch thread: calls in order, Deferred results, errors where results are read; and lazy
training, observation and failures with launches on that thread (the CPU platform calls in place
by default)."""

import os
import threading

import pytest
import torch

import lazy_torch
import runtime
from runtime import executables, executor
from runtime.launcher import Deferred, Launcher, is_ready, resolve


def test_launches_run_in_order_on_their_own_thread_and_results_wait_for_them():
    launcher = Launcher()
    launcher.threaded = True
    gate, seen = threading.Event(), []

    def first():
        seen.append(("first", threading.current_thread().name))
        gate.wait()
        return ("a", "b")

    one, (a, b) = launcher.submit(first, 2)
    # submit returns once the call has begun (the GIL hand-off), not once it has returned
    assert seen == [("first", "lazy-launch")]
    assert type(a) is Deferred and not is_ready(a) and not one.done()
    queued: list = []
    second = threading.Thread(
        target=lambda: queued.append(launcher.submit(lambda: seen.append("second") or ("c",), 1))
    )
    second.start()
    second.join(0.2)
    assert second.is_alive() and seen == [("first", "lazy-launch")]  # waits for its turn
    gate.set()
    second.join()
    (two, (c,)) = queued[0]
    assert resolve(c) == "c" and (resolve(a), resolve(b)) == ("a", "b")
    assert seen == [("first", "lazy-launch"), "second"] and one.done() and two.done()
    launcher.stop()


def test_a_failed_launch_raises_where_its_results_are_read():
    launcher = Launcher()
    launcher.threaded = True

    def boom():
        raise ValueError("boom")

    launch, (out,) = launcher.submit(boom, 1)
    launcher.drain()
    assert launch.done() and is_ready(out)
    for _ in range(2):
        with pytest.raises(ValueError, match="boom"):
            resolve(out)
    _, (later,) = launcher.submit(lambda: (resolve(out) + 1,), 1)  # reads the failed result
    with pytest.raises(ValueError, match="boom"):
        resolve(later)
    launcher.stop()


def test_unthreaded_launches_are_the_calls_themselves():
    launcher = Launcher()
    launcher.threaded = False
    launch, outputs = launcher.submit(lambda: (1, 2), 2)
    assert launch.done() and outputs == [1, 2]
    with pytest.raises(ValueError, match="boom"):
        launcher.submit(lambda: (_ for _ in ()).throw(ValueError("boom")), 1)


@pytest.fixture
def launch_thread(monkeypatch):
    lazy_torch.wait_device_ops()
    monkeypatch.setattr(executor._launcher, "threaded", True)
    yield
    lazy_torch.wait_device_ops()


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _losses(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> torch.Tensor:
    lazy = x.device.type == "lazy"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if lazy:
            lazy_torch.mark_step()
    return torch.stack([t.cpu() for t in losses])


def test_training_with_the_launch_thread_matches_eager(launch_thread):
    torch.manual_seed(0)
    eager, x, y = _mlp(), torch.randn(5, 6), torch.randn(5, 1)
    lazy = _mlp()
    lazy.load_state_dict(eager.state_dict())
    lazy.to("lazy")
    got = _losses(lazy, x.to("lazy"), y.to("lazy"), 4)
    torch.testing.assert_close(got, _losses(eager, x, y, 4))
    assert lazy_torch.metrics.counters()["executions"] >= 4


def test_mark_step_returns_before_the_launch_and_reads_wait_for_it(launch_thread, monkeypatch):
    x = torch.ones(3, device="lazy")
    lazy_torch.mark_step()
    gate = threading.Event()
    real = executor._execute
    monkeypatch.setattr(executor, "_execute", lambda *a: gate.wait() and real(*a))
    y = x * 4
    lazy_torch.mark_step()  # returns with the launch held at the gate
    payload = y._lazy.node.payload
    assert type(payload) is Deferred and not is_ready(payload)
    z = y + 1  # traced against the queued result
    gate.set()
    assert z.tolist() == [5.0, 5.0, 5.0] and y.tolist() == [4.0, 4.0, 4.0]
    assert is_ready(payload)


def test_a_failed_asynchronous_launch_raises_on_reads_and_once_at_the_next_barrier(
    launch_thread, monkeypatch
):
    x = torch.ones(3, device="lazy")
    lazy_torch.mark_step()
    real = executor._execute

    def failing(exe, values, graph):
        what = executables.describe(graph)
        raise runtime.GraphError(f"running {what} failed: RuntimeError: device lost")

    monkeypatch.setattr(executor, "_execute", failing)
    y = x * 4
    lazy_torch.mark_step()
    monkeypatch.setattr(executor, "_execute", real)
    w = x + 1  # x's value came from an earlier, successful launch
    executor._launcher.drain()  # a barrier does not wait for launches still queued
    with pytest.raises(runtime.GraphError, match=r"graph [0-9a-f]{16} .*device lost"):
        lazy_torch.mark_step()
    lazy_torch.mark_step()  # reported once
    assert w.tolist() == [2.0, 2.0, 2.0] and x.tolist() == [1.0, 1.0, 1.0]
    for _ in range(2):
        with pytest.raises(runtime.GraphError, match="device lost"):
            y.cpu()  # its value is lost with the launch that was to compute it


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX's; the child runs no JAX
def test_a_forked_child_starts_its_own_launch_thread():
    launcher = Launcher()
    launcher.threaded = True
    assert resolve(launcher.submit(lambda: (1,), 1)[1][0]) == 1
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its parent's thread is gone
        try:
            os.write(write, str(resolve(launcher.submit(lambda: (2,), 1)[1][0])).encode())
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 16)
    os.waitpid(pid, 0)
    assert got == b"2"
    launcher.stop()


def test_a_parameter_free_graph_whose_launch_failed_runs_again(launch_thread, monkeypatch):
    real = executor._execute

    def failing(exe, values, graph):
        what = executables.describe(graph)
        raise runtime.GraphError(f"running {what} failed: RuntimeError: device lost")

    monkeypatch.setattr(executor, "_execute", failing)
    y = torch.ones(3, device="lazy") + 1  # no parameters: its results are kept for reuse
    lazy_torch.mark_step()
    monkeypatch.setattr(executor, "_execute", real)
    executor._launcher.drain()
    with pytest.raises(runtime.GraphError, match="device lost"):
        lazy_torch.mark_step()
    del y
    z = torch.ones(3, device="lazy") + 1  # the same graph
    lazy_torch.mark_step()
    assert z.tolist() == [2.0, 2.0, 2.0]


def test_an_interrupt_while_a_launch_is_handed_over_comes_after_its_results_are_kept(
    monkeypatch,
):
    # Ctrl-C while mark_step waits for its call to begin: the call runs anyway, with the
    # parameters' buffers donated, so the step's results must reach the tensors first.
    import signal
    import time

    from runtime.launcher import Launch

    monkeypatch.setattr(executor._launcher, "threaded", True)
    w = torch.ones(3).to("lazy")  # device data the step donates (not a reused constant)
    lazy_torch.mark_step(wait=True)
    real = Launch.run

    def interrupted(self, call):
        os.kill(os.getpid(), signal.SIGINT)  # the tracing thread waits for this call to begin
        time.sleep(0.2)
        return real(self, call)

    monkeypatch.setattr(Launch, "run", interrupted)
    w.mul_(2)
    with pytest.raises(KeyboardInterrupt):
        lazy_torch.mark_step()
    monkeypatch.setattr(Launch, "run", real)
    assert lazy_torch.metrics.counters()["donated_buffers"] == 1
    assert w.tolist() == [2.0, 2.0, 2.0]
    w.add_(1)
    lazy_torch.mark_step()
    assert w.tolist() == [3.0, 3.0, 3.0]
