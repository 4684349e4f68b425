"""Observability: LAZY_DEBUG lines and recompile causes, the metrics report, node call sites,
graph dumps, the persistent executable cache and debug.explain."""

import json
import os
import subprocess
import sys
import textwrap

import torch

import lazy_torch
import runtime
from runtime import executor, timer


def _run(tmp_path, body: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``body`` as a script file in a fresh process with extra environment variables."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    full_env = {**os.environ, **env}
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done


def _here(marker: str) -> str:
    """``file:line`` of the line of this file that contains ``marker``."""
    with open(__file__) as f:
        lines = f.read().splitlines()
    return f"{__file__}:{next(i + 1 for i, s in enumerate(lines) if marker in s)}"


def _line_of(tmp_path, marker: str) -> str:
    lines = (tmp_path / "script.py").read_text().splitlines()
    return f"{tmp_path / 'script.py'}:{next(i + 1 for i, s in enumerate(lines) if marker in s)}"


SHAPE_LOOP = """
    import torch, lazy_torch
    x = torch.randn(4, 8, device="lazy")
    lazy_torch.mark_step()
    for step in range(3):
        y = x[:, : step + 2].relu()  # the slice width is a Python int baked into the graph
        z = (y * 2).sum()
        lazy_torch.mark_step()
"""


def test_lazy_debug_names_the_node_and_line_that_changed_the_graph(tmp_path):
    err = _run(tmp_path, SHAPE_LOOP, LAZY_DEBUG="1").stderr.splitlines()
    compiles = [line for line in err if line.startswith("[lazy] compile")]
    executes = [line for line in err if line.startswith("[lazy] execute")]
    assert len(compiles) == 4 and len(executes) == 4, err
    step_line = _line_of(tmp_path, "    lazy_torch.mark_step()")
    for line in compiles[1:]:
        assert f"cause=mark_step at {step_line}" in line
        assert "nodes)" in line and " ms" in line
    # The first loop step is the site's first compile; the next two are recompiles.
    assert "recompile" not in compiles[1]
    slice_line = _line_of(tmp_path, "baked into the graph")
    for width, line in ((3, compiles[2]), (4, compiles[3])):
        assert "recompile: differs from graph" in line
        assert f"aten.slice.Tensor float32[4,{width}] (was float32[4,{width - 1}]" in line
        assert f"argument 3: {width} was {width - 1}" in line
        assert f"created at {slice_line}" in line
    assert all("cause=mark_step" in line and "new executable" in line for line in executes)


def test_cache_hits_print_one_execute_line_each(tmp_path):
    body = """
        import torch, lazy_torch
        x = torch.ones(3, device="lazy")
        for _ in range(3):
            x = x * 2
            lazy_torch.mark_step()
        print(x.sum().item())
    """
    done = _run(tmp_path, body, LAZY_DEBUG="1")
    err = [line for line in done.stderr.splitlines() if line.startswith("[lazy]")]
    # The first two steps differ (ones() is a factory node, then x is a device input).
    assert [line.split()[1] for line in err] == [
        *("compile", "execute", "compile", "execute", "execute"),
        *("compile", "execute"),
    ]
    assert "cache hit, dispatched in" in err[4] and err[4].endswith(" ms")
    assert f"cause=item at {_line_of(tmp_path, 'item()')}" in err[-1]
    assert done.stdout.strip() == "24.0"


def test_item_in_a_loop_is_reported_with_its_call_site():
    x = torch.ones(4, device="lazy")
    for _ in range(3):
        x = x + 1
        x.sum().item()  # the sync
        lazy_torch.mark_step()
    here = _here("# the sync")
    assert lazy_torch.metrics.sites()["syncs::item"] == {here: 3}
    report = lazy_torch.metrics.report()
    syncs = report[report.index("Syncs") :]
    assert "syncs::item: 3" in syncs and f"     3  {here}" in syncs
    assert lazy_torch.metrics.counters()["syncs::item"] == 3


def test_report_has_percentiles_of_timings_and_graph_sizes(monkeypatch):
    monkeypatch.setattr(runtime.config, "TIME_EXECUTIONS", 1)  # time every execution
    x = torch.ones(8, device="lazy")
    for _ in range(4):
        x = (x * 1.5).relu()
        lazy_torch.mark_step()
    x.cpu()
    lazy_torch.wait_device_ops()
    timer.TIMER.stop()  # let the execution timer drain its queue
    timings = lazy_torch.metrics.timings()
    for name in ("compile_time", "lowering_time", "dispatch_time", "trace_time", "step_time"):
        assert timings[name], name
    assert len(timings["execute_time"]) == 4
    assert all(t > 0 for t in timings["execute_time"])
    nodes = lazy_torch.metrics.sizes()["graph_nodes"]
    assert len(nodes) == 4 and nodes[1:] == [4, 4, 4]  # data, scalar, mul, relu
    report = lazy_torch.metrics.report()
    for name in ("execute_time", "trace_time", "transfer_from_device_time", "graph_nodes"):
        line = next(s for s in report.splitlines() if s.strip().startswith(name + ":"))
        assert all(p in line for p in ("median=", "p90=", "p99=", "max=")), line


def test_timings_keep_recent_samples_and_count_all(monkeypatch):
    # A long run keeps memory bounded: the last SAMPLES values of each timing and size, with the
    # count and total of all of them.
    monkeypatch.setattr(runtime.metrics, "SAMPLES", 3)
    lazy_torch.metrics.reset()
    for ms in range(1, 6):
        runtime.metrics.time("step_time", ms / 1e3)
        runtime.metrics.size("graph_nodes", ms)
    assert lazy_torch.metrics.timings()["step_time"] == [0.003, 0.004, 0.005]
    assert lazy_torch.metrics.sizes()["graph_nodes"] == [3, 4, 5]
    report = lazy_torch.metrics.report()
    line = next(s for s in report.splitlines() if s.strip().startswith("step_time:"))
    assert "n=5 total=15.000ms (percentiles of the last 3) median=4.000ms" in line, line
    line = next(s for s in report.splitlines() if s.strip().startswith("graph_nodes:"))
    assert "n=5 total=15 (percentiles of the last 3) median=4 " in line, line
    lazy_torch.metrics.reset()


def _executions(n: int, synced: bool) -> list[float]:
    """execute_time of ``n`` executions of one graph, waited for one by one or back to back."""
    x = torch.ones(8, device="lazy")
    lazy_torch.mark_step(wait=True)
    lazy_torch.metrics.reset()
    for _ in range(n):
        x = (x * 1.5).relu()
        lazy_torch.mark_step(wait=synced)
    lazy_torch.wait_device_ops()
    assert lazy_torch.metrics.counters()["executions"] == n
    return lazy_torch.metrics.timings().get("execute_time", [])


def test_execute_time_samples_pairs_of_executions(monkeypatch):
    monkeypatch.setattr(runtime.config, "TIME_EXECUTIONS", 4)
    # Waited for one by one, every execution of the sampled pairs has a known start: 2 in 4.
    times = _executions(12, synced=True)
    assert len(times) == 6 and all(t > 0 for t in times)
    # Back to back, the first of a pair may start behind an untimed one: then only the second.
    times = _executions(12, synced=False)
    assert 3 <= len(times) <= 6 and all(t > 0 for t in times)


def test_execute_time_times_every_execution_while_listened_to(monkeypatch):
    monkeypatch.setattr(runtime.config, "TIME_EXECUTIONS", 1000)
    stop = runtime.metrics.listen(lambda event: None)
    try:
        times = _executions(5, synced=False)
    finally:
        stop()
    assert len(times) == 5 and all(t > 0 for t in times)


def test_nodes_remember_their_user_line_when_recording(monkeypatch):
    previous = lazy_torch.debug.record_sites(True)
    try:
        w = torch.randn(3, 3, device="lazy", requires_grad=True)
        first = __import__("inspect").currentframe().f_lineno
        loss = (w @ w).tanh().sum()
        loss.backward()
    finally:
        lazy_torch.debug.record_sites(previous)
    text = lazy_torch.debug.ir_text(loss, w.grad)
    mm = next(line for line in text.splitlines() if "aten.mm.default" in line)
    assert mm.endswith(f"  # {__file__}:{first + 1}")
    # Backward nodes belong to the line that called backward().
    tanh_bw = next(line for line in text.splitlines() if "aten.tanh_backward" in line)
    assert tanh_bw.endswith(f"  # {__file__}:{first + 2}")
    assert f'tooltip="{__file__}:{first + 1}"' in lazy_torch.debug.ir_dot(loss)
    # Off, nodes carry no site.
    assert "#" not in lazy_torch.debug.ir_text(torch.ones(2, device="lazy") * 2)


def test_dump_dir_writes_ir_and_stablehlo_of_each_new_graph(tmp_path):
    dump = tmp_path / "dump"
    _run(tmp_path, SHAPE_LOOP, LAZY_DUMP_DIR=str(dump))
    files = sorted(os.listdir(dump))
    irs = [f for f in files if f.endswith(".ir.txt")]
    hlos = [f for f in files if f.endswith(".stablehlo.mlir")]
    assert len(irs) == len(hlos) == 4
    assert [f.split(".")[0] for f in irs] == [f.split(".")[0] for f in hlos]
    last = (dump / irs[-1]).read_text()
    assert last.startswith("# [lazy] compile graph " + irs[-1].split("-")[1].split(".")[0])
    assert "aten.slice.Tensor" in last and "float32[4,4]" in last
    assert f"# {_line_of(tmp_path, 'baked into the graph')}" in last  # dumps record sites
    assert "stablehlo" in (dump / hlos[-1]).read_text()


CACHED_STEP = """
    import json, time, torch, lazy_torch
    start = time.perf_counter()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    torch.manual_seed(0)
    model = model.to("lazy")
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(8, 16).to("lazy")
    for _ in range(2):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        lazy_torch.mark_step()
    lazy_torch.wait_device_ops()
    print(json.dumps(lazy_torch.metrics.counters()))
"""


def test_a_second_process_loads_executables_from_the_persistent_cache(tmp_path):
    cache = str(tmp_path / "cache")
    first = json.loads(_run(tmp_path, CACHED_STEP, LAZY_CACHE_DIR=cache).stdout)
    assert first["compiles"] >= 2 and first.get("persistent_cache_hits", 0) == 0
    second = json.loads(_run(tmp_path, CACHED_STEP, LAZY_CACHE_DIR=cache).stdout)
    assert second.get("compiles", 0) == 0
    assert second["persistent_cache_hits"] == first["compiles"]


def test_set_cache_dir_serves_executables_this_process_forgot(tmp_path):
    lazy_torch.set_cache_dir(tmp_path / "cache")
    try:
        x = torch.arange(5.0).to("lazy")
        assert ((x + 3) * 7).tolist() == [21.0, 28.0, 35.0, 42.0, 49.0]
        executor.drop_cache()
        assert ((x + 3) * 7).tolist() == [21.0, 28.0, 35.0, 42.0, 49.0]
    finally:
        lazy_torch.set_cache_dir(None)
    counters = lazy_torch.metrics.counters()
    assert counters["compiles"] == 1 and counters["persistent_cache_hits"] == 1
    executor.drop_cache()
    x.sum().item()
    assert lazy_torch.metrics.counters()["compiles"] == 2  # off again: XLA compiles


def test_explain_reports_compiles_syncs_and_fallbacks_of_one_call(monkeypatch):
    from lazy_torch import dispatch, fallback

    monkeypatch.setitem(dispatch._handlers, id(torch.ops.aten.cumsum.default), fallback.run)
    model = torch.nn.Linear(4, 2).to("lazy")
    x = torch.randn(3, 4, device="lazy")
    lazy_torch.mark_step()

    def step(scale):
        model.zero_grad()
        out = model(x).cumsum(0) * scale  # forward fallback
        loss = out.sum()
        loss.backward()  # cumsum's backward is a cumsum too
        # The backward's fallback computed ``loss`` already (its graph held it), so the sync is
        # of the gradient.
        return model.weight.grad.sum().item()  # the sync

    first = lazy_torch.debug.explain(step, 2.0)
    assert isinstance(first.result, float)
    assert first.compiles and first.counters["compiles"] == len(first.compiles)
    assert first.fallbacks == {
        "aten.cumsum.default": {_here("# forward fallback"): 1, _here("# cumsum's backward"): 1}
    }
    assert first.syncs["item"] == {_here("return model.weight.grad.sum().item()  # the sync"): 1}
    text = str(first)
    assert text.startswith("step: ") and "Fallbacks:" in text and "aten.cumsum.default" in text
    second = lazy_torch.debug.explain(step, 3.0)  # a new scale is a graph parameter
    assert second.compiles == [] and second.counters.get("compiles", 0) == 0
    assert len(second.executions) == len(first.executions)
    assert " 0 compiles" in str(second)
    assert not lazy_torch.sites.recording  # explain restores the setting


def test_recompile_of_an_input_shape_names_the_input_and_its_user(tmp_path):
    body = """
        import torch, lazy_torch
        w = torch.randn(8, 2, device="lazy")
        lazy_torch.mark_step()
        for n in (4, 5):
            x = torch.randn(n, 8).to("lazy")
            lazy_torch.mark_step()
            y = x @ w  # the user of the new input
            lazy_torch.mark_step()
    """
    err = _run(tmp_path, body, LAZY_DEBUG="1").stderr
    reason = next(line for line in err.splitlines() if "recompile:" in line)
    assert "input float32[5,8] (was float32[4,8])" in reason
    # The input was created by the transfer on the loop's first line.
    assert f"created at {_line_of(tmp_path, 'torch.randn(n, 8)')}" in reason
