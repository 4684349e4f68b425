"""Settings that must be in place before JAX creates its clients."""

import os
import subprocess
import sys

import pytest

_PROBE = "import runtime, os; print(os.environ.get('XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT'))"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "None"),  # JAX's default client, called from the launch thread
        ({"LAZY_GPU_ASYNC_LAUNCH": "1"}, "1"),  # the TFRT client launches on a thread of its own
        # the user's choice stays
        ({"XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT": "0", "LAZY_GPU_ASYNC_LAUNCH": "1"}, "0"),
    ],
)
def test_gpu_launch_thread_setting(env, expected):
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT", "LAZY_GPU_ASYNC_LAUNCH")
    }
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env={**base, **env}, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert out.stdout.strip() == expected
