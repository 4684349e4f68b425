"""lazy_torch/dispatch.py: how an aten op is resolved to a handler."""

import pytest
import torch

import lazy_torch

aten = torch.ops.aten

_SIGNED = torch.tensor([-100, -1, 0, 1, 5, 100])
_SHIFTS = torch.tensor([-1, 0, 1, 3, 64, 63])  # negative and too-wide shifts follow eager's rules


def _in_place_right(x, y):
    x >>= y
    return x


def _in_place_left(x, y):
    x <<= y
    return x


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
@pytest.mark.parametrize(
    "call",
    [
        lambda x, y: x >> 2,
        lambda x, y: x << 3,
        lambda x, y: x >> y,
        lambda x, y: x << y,
        _in_place_right,
        _in_place_left,
        lambda x, y: aten.__rshift__.Scalar_out(x, 1, out=torch.empty_like(x)),
        lambda x, y: aten.__lshift__.Tensor_out(
            x, y, out=torch.empty(0, dtype=x.dtype, device=x.device)
        ),
    ],
    ids=[
        "rshift",
        "lshift",
        "rshift_tensor",
        "lshift_tensor",
        "irshift",
        "ilshift",
        "rshift_out",
        "lshift_out_resized",
    ],
)
def test_shift_operators_run_as_the_named_shift_ops_without_falling_back(call, dtype):
    x = _SIGNED.abs().to(dtype) if dtype == torch.uint8 else _SIGNED.to(dtype)
    y = _SHIFTS.clamp(min=0).to(dtype) if dtype == torch.uint8 else _SHIFTS.to(dtype)
    want = call(x.clone(), y)
    got = call(x.to("lazy"), y.to("lazy"))
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    fallbacks = [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]
    assert fallbacks == []
