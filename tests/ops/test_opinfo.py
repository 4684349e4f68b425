"""PyTorch's OpInfo database on device='lazy' against eager CPU.

Two passes over the same samples: ``test_matches_eager`` allows the CPU fallback and fails on any
wrong result; ``test_lowered`` fails when a sample ran an op on the fallback. Expected fallbacks
and known failures live in expectations.py (generated, each with its reason); an entry that stops
falling back or failing simply passes (regenerate the lists to tighten them).
"""

import pytest
import torch

from tests.ops.expectations import FAILING, FALLBACK
from tests.ops.harness import OPS, dtypes_of, run_op

CASES = [
    pytest.param(
        name,
        dtype,
        id=f"{name}-{str(dtype).removeprefix('torch.')}",
        marks=[pytest.mark.slow, pytest.mark.xdist_group(name)],
    )
    for name in sorted(OPS)
    for dtype in dtypes_of(name)
]
_outcomes: dict = {}


def _outcome(name, dtype):
    key = (name, dtype)
    if key not in _outcomes:
        grads = dtype == torch.float32 and OPS[name].supports_autograd
        _outcomes[key] = run_op(OPS[name], dtype, grads=grads)
    outcome = _outcomes[key]
    if outcome.status == "skipped":
        pytest.skip(outcome.detail)
    return outcome


@pytest.mark.parametrize("name, dtype", CASES)
def test_matches_eager(name, dtype):
    outcome = _outcome(name, dtype)
    known = FAILING.get(f"{name}|{dtype}")
    if known is not None and outcome.status == "failing":
        pytest.xfail(known)
    assert outcome.status in ("lowered", "fallback"), outcome.detail


@pytest.mark.parametrize("name, dtype", CASES)
def test_lowered(name, dtype):
    outcome = _outcome(name, dtype)
    if outcome.status == "failing":
        pytest.skip("wrong results are test_matches_eager's failure")
    if name in FALLBACK and outcome.status == "fallback":
        pytest.xfail(FALLBACK[name])
    assert outcome.status == "lowered", f"ran on the CPU fallback: {outcome.fallbacks}"
