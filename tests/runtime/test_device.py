"""Devices of the platform (runtime/device.py): how many there are, and ``lazy:N`` on each. Each
case runs in a process of its own, since JAX fixes its devices at their first use."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_ENV = {k: v for k, v in os.environ.items() if k not in ("LAZY_CPU_DEVICES", "XLA_FLAGS")}


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], env={**_ENV, "LAZY_PLATFORM": "cpu", **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


_COUNT_AND_USE_THE_LAST = """
import torch, lazy_torch
n = lazy_torch.device_count()
assert torch.lazy.device_count() == n
x = torch.arange(4.0, device=f"lazy:{n - 1}")
y = (x * 2 + 1).sum()
assert y.device == torch.device("lazy", n - 1) and y.item() == 16.0
try:
    x + torch.ones(4, device="lazy:0")
except RuntimeError as e:
    assert "Expected all tensors to be on the same device" in str(e), e
else:
    raise AssertionError("a mixed-device op did not raise")
print(n)
"""


@pytest.mark.parametrize(
    "env, count",
    [
        ({"LAZY_CPU_DEVICES": "3"}, "3"),
        ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, "2"),
    ],
    ids=["LAZY_CPU_DEVICES", "XLA_FLAGS"],
)
def test_the_cpu_platform_has_the_devices_asked_for(env, count):
    done = _run(_COUNT_AND_USE_THE_LAST, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [count]


_PAST_THE_LAST = """
import torch, lazy_torch
print(lazy_torch.device_count())
for make in (lambda: torch.ones(2, device="lazy:1"), lambda: torch.arange(3, device="lazy:1"),
             lambda: torch.tensor([1.0]).to("lazy:1")):
    try:
        make()
    except RuntimeError as e:
        assert "lazy device index 1 out of range: 1 device(s)" in str(e), e
    else:
        raise AssertionError("a tensor on a device past the last was made")
"""


def test_one_device_by_default_and_an_index_past_the_last_is_refused_at_the_call():
    done = _run(_PAST_THE_LAST)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_lazy_cpu_devices_after_jax_started_its_devices_is_a_clear_error():
    code = "import jax; jax.devices(); import torch, lazy_torch; torch.ones(2, device='lazy')"
    # (the factory asks for its device at once)
    done = _run(code, LAZY_CPU_DEVICES="2")
    assert done.returncode != 0
    assert "LAZY_CPU_DEVICES=2 must take effect before JAX first uses a device" in done.stderr
