"""Settings that must be in place before JAX creates its clients."""

import os
import subprocess
import sys

import pytest

_PROBE = "import runtime, os; print(os.environ.get('XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT'))"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "1"),  # JAX's CUDA client launches kernels on a thread of its own
        ({"XLA_PYTHON_CLIENT_USE_TFRT_GPU_CLIENT": "0"}, "0"),  # the user's choice stays
        ({"LAZY_GPU_ASYNC_LAUNCH": "0"}, "None"),  # JAX's default
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
