"""Graph dumps and metrics of the public API."""

import torch

import lazy_torch


def test_ir_text_and_stablehlo_text_describe_the_pending_graph():
    x = torch.ones(2, 3, device="lazy")
    y = (x * 2.5).sum(dim=1)
    text = lazy_torch.debug.ir_text(y)
    lines = text.splitlines()
    assert lines[0] == "IR {" and lines[-1] == "}"
    assert any("float32[2] aten.sum.dim_IntList" in line for line in lines)
    assert any("float64[] scalar(2.5)" in line for line in lines)
    hlo = lazy_torch.debug.stablehlo_text(y)
    assert "stablehlo.multiply" in hlo and "stablehlo.reduce" in hlo
    assert lazy_torch.metrics.counters().get("compiles", 0) == 0  # dumps compile nothing


def test_counters_use_the_contract_names():
    x = torch.ones(3).to("lazy")
    lazy_torch.mark_step()
    (x + 2).sum().item()
    lazy_torch.mark_step()
    counters = lazy_torch.metrics.counters()
    for key in (
        "compiles",
        "executions",
        "mark_steps",
        "transfers_to_device",
        "transfers_from_device",
    ):
        assert counters.get(key, 0) >= 1, key
    assert "compiles" in lazy_torch.metrics.report()
    lazy_torch.metrics.reset()
    assert lazy_torch.metrics.counters() == {}
