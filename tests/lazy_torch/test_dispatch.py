"""lazy_torch/dispatch.py: how an aten op is resolved to a handler (recorded, derived, decomposed or\nrun on the CPU fallback)."""

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
        lambda x, y: torch.bitwise_right_shift(x, 1, out=torch.empty_like(x)),
        lambda x, y: torch.bitwise_left_shift(
            x, y, out=torch.empty(0, dtype=x.dtype, device=x.device)
        ),
        lambda x, y: torch.bitwise_right_shift(7, y),
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
        "scalar_rshift_tensor",
    ],
)
def test_shift_operators_are_recorded_without_falling_back(call, dtype):
    x = _SIGNED.abs().to(dtype) if dtype == torch.uint8 else _SIGNED.to(dtype)
    y = _SHIFTS.clamp(min=0).to(dtype) if dtype == torch.uint8 else _SHIFTS.to(dtype)
    want = call(x.clone(), y)
    got = call(x.to("lazy"), y.to("lazy"))
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    fallbacks = [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]
    assert fallbacks == []


@pytest.mark.parametrize("shift", [lambda x: x << 1, lambda x: torch.bitwise_right_shift(x, 1)])
def test_a_float_shift_raises_eagers_error_at_the_call(shift):
    with pytest.raises(RuntimeError, match="not implemented for 'Float'") as eager:
        shift(torch.ones(2))
    with pytest.raises(type(eager.value), match="not implemented for 'Float'"):
        shift(torch.ones(2, device="lazy"))
    lazy_torch.mark_step()  # nothing was recorded that could not compile
