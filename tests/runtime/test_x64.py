"""JAX's 64-bit mode is the runtime's, not the process's: importing lazy_torch changes no setting
of JAX's, a user's own JAX code keeps its 32-bit defaults, and lazy's int64 and float64 values keep
all their bits on every thread the runtime uses."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lazy_torch
from runtime import executor


def test_importing_lazy_torch_leaves_jax_in_its_own_mode():
    code = "import jax, lazy_torch; print(jax.config.jax_enable_x64)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("launch_thread", [False, True])
def test_lazy_keeps_64_bit_values_while_the_users_jax_stays_32_bit(launch_thread, monkeypatch):
    monkeypatch.setattr(executor._launcher, "threaded", launch_thread)
    assert not jax.config.jax_enable_x64
    big = torch.tensor([2**40 + 3, -(2**35)], dtype=torch.int64)
    fine = torch.tensor([1.0 + 2**-40], dtype=torch.float64)
    x = big.to("lazy") * 3 + 2**33  # a 64-bit scalar parameter too
    y = fine.to("lazy") * 1.5
    lazy_torch.mark_step()
    assert x.dtype == torch.int64 and y.dtype == torch.float64
    assert x.cpu().tolist() == (big * 3 + 2**33).tolist()
    assert y.cpu().tolist() == (fine * 1.5).tolist()
    torch.manual_seed(2**63 + 5)  # a seed beyond 32 bits seeds lazy's RNG too
    a = torch.rand(3, device="lazy").cpu()
    torch.manual_seed(2**63 + 5)
    assert torch.equal(torch.rand(3, device="lazy").cpu(), a)
    # the user's own JAX, on this thread after all of that, is still in 32-bit mode
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(np.arange(3, dtype=np.int64)).dtype == jnp.int32
    assert jnp.asarray(np.ones(2)).dtype == jnp.float32
