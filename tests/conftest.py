"""Shared fixtures: every test starts from zeroed metrics on the XLA CPU platform by default,
which has 4 devices (tests/distributed lays values out over them; lazy:0 is the default)."""

import os

import pytest

os.environ.setdefault("LAZY_CPU_DEVICES", "4")
# Small reads would run on the host by eager PyTorch (lazy_torch/host_reads.py), not through the
# lowerings the tests test; tests/lazy_torch/test_host_reads.py turns it back on. (Also in the
# environment of the scripts tests run in processes of their own; LAZY_HOST_READS=1 runs the
# suite through that path instead.)
os.environ.setdefault("LAZY_HOST_READS", "0")

import lazy_torch
import runtime.config


@pytest.fixture(autouse=True)
def _fresh_metrics(monkeypatch):
    # Test files run hundreds of graphs from one line (a harness's .cpu()), which would otherwise
    # run op by op after the fourth (runtime/interpret.py): whole graphs are what they test.
    # tests/runtime/test_interpret.py turns it back on.
    monkeypatch.setattr(runtime.config, "INTERPRET_AFTER", 0)
    lazy_torch.mark_step(wait=True)
    lazy_torch.metrics.reset()
    yield
