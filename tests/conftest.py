"""Shared fixtures: every test starts from zeroed metrics on the XLA CPU platform by default."""

import pytest

import lazy_torch


@pytest.fixture(autouse=True)
def _fresh_metrics():
    lazy_torch.mark_step(wait=True)
    lazy_torch.metrics.reset()
    yield
