"""Lowerings run in JAX's 64-bit mode, which the runtime switches on for its own calls only
(runtime.device.x64): tests that call them directly get it too."""

import pytest

from runtime.device import x64


@pytest.fixture(autouse=True)
def _x64():
    with x64():
        yield
