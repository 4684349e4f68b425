"""Bool and 0/1 integer operands of arithmetic on device 'lazy' against eager CPU PyTorch.

XLA's algebraic simplifier rewrites ``multiply(convert(pred), y)`` into ``select(pred, y, 0)``, and
``convert(pred) / scalar`` into such a product, so a bool converted to floating by an XLA convert
gives ``False * inf == 0`` where eager gives NaN (lowerings/dtypes.py converts through a select).
Every case puts each of inf, -inf and nan beside both True and False, and compares bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

import lazy_torch

INF, NAN = math.inf, math.nan
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.uint8, torch.int8, torch.int32, torch.int64]

MASK = torch.tensor([True, False] * 4)
SPECIAL = torch.tensor([INF, INF, -INF, -INF, NAN, NAN, 2.5, 2.5])
ONE_ZERO = torch.tensor([1.0, 0.0] * 4)


def _check(case, *args) -> None:
    """``case(device, *args)`` on 'lazy' equals it on 'cpu' in dtype, shape and every value."""
    expected = case("cpu", *args)
    got = case("lazy", *args)
    lazy_torch.mark_step()
    got = got.cpu()
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def _mask(device):
    return MASK.to(device)


def _special(device, dtype=torch.float32):
    return SPECIAL.to(dtype).to(device)


# --- bool tensor times a floating operand: tensor, 0-dim tensor (lazy or CPU scalar), number -----

# name -> fn(device, dtype)
MULTIPLY = {
    "bool_times_tensor": lambda d, dt: _mask(d) * _special(d, dt),
    "tensor_times_bool": lambda d, dt: _special(d, dt) * _mask(d),
    "bool_times_0dim": lambda d, dt: _mask(d) * torch.tensor(INF, dtype=dt).to(d),
    "0dim_times_bool": lambda d, dt: torch.tensor(NAN, dtype=dt).to(d) * _mask(d),
    "bool_times_cpu_0dim": lambda d, dt: _mask(d) * torch.tensor(INF, dtype=dt),
    "cpu_0dim_times_bool": lambda d, dt: torch.tensor(-INF, dtype=dt) * _mask(d),
    "bool_0dim_times_tensor": lambda d, dt: torch.tensor(False).to(d) * _special(d, dt),
    "cpu_bool_0dim_times_tensor": lambda d, dt: torch.tensor(False) * _special(d, dt),
    "converted_bool_times_tensor": lambda d, dt: _mask(d).to(dt) * _special(d, dt),
    "converted_bool_times_number": lambda d, dt: _mask(d).to(dt) * INF,
    "torch_mul": lambda d, dt: torch.mul(_mask(d), _special(d, dt)),
    "mul_method": lambda d, dt: _special(d, dt).mul(_mask(d)),
    "addcmul": lambda d, dt: torch.addcmul(
        torch.zeros(8, dtype=dt, device=d), _mask(d).to(dt), _special(d, dt)
    ),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", MULTIPLY)
def test_bool_times_float(name, dtype):
    _check(lambda d: MULTIPLY[name](d, dtype))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_mul_inplace(dtype):
    def case(d):
        x = _special(d, dtype)
        x.mul_(_mask(d))
        return x

    _check(case)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_imul(dtype):
    def case(d):
        x = _special(d, dtype)
        x *= _mask(d)
        return x

    _check(case)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_mul_out(dtype):
    def case(d):
        out = torch.empty(8, dtype=dtype, device=d)
        torch.mul(_mask(d), _special(d, dtype), out=out)
        return out

    _check(case)


@pytest.mark.parametrize("value", [INF, -INF, NAN], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("bool_first", [True, False], ids=["bool_first", "number_first"])
def test_bool_times_number(value, bool_first):
    _check(lambda d: _mask(d) * value if bool_first else value * _mask(d))


@pytest.mark.parametrize("value", [False, True], ids=["False", "True"])
def test_python_bool_times_tensor(value):
    _check(lambda d: value * _special(d))
    _check(lambda d: _special(d) * value)


def test_bool_times_complex():
    _check(lambda d: _mask(d) * _special(d, torch.complex64))


# --- bool tensor divided by zero (the simplifier turns the division into a product first) -------

# name -> fn(device)
DIVIDE = {
    "by_int_zero": lambda d: _mask(d) / 0,
    "by_float_zero": lambda d: _mask(d) / 0.0,
    "by_cpu_0dim_zero": lambda d: _mask(d) / torch.tensor(0.0),
    "by_0dim_zero": lambda d: _mask(d) / torch.tensor(0.0).to(d),
    "by_zeros": lambda d: _mask(d) / torch.zeros(8, device=d),
    "by_nan_parameter": lambda d: _mask(d) / NAN,
    "by_inf_parameter": lambda d: _mask(d) / INF,
    "true_divide": lambda d: torch.true_divide(_mask(d), 0.0),
    "converted_bool": lambda d: _mask(d).float() / 0,
    "bool_by_bool": lambda d: _mask(d) / _mask(d),
}


@pytest.mark.parametrize("name", DIVIDE)
def test_bool_divided(name):
    _check(DIVIDE[name])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_div_out(dtype):
    def case(d):
        out = torch.empty(8, dtype=dtype, device=d)
        torch.div(_mask(d), 0, out=out)
        return out

    _check(case)


def test_div_inplace():
    def case(d):
        x = _mask(d).float()
        x.div_(0)
        return x

    _check(case)


# --- 0/1 integer tensors, given or converted from bool on the device -------------------------------


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_int_zero_one_times_inf(dtype):
    _check(lambda d: MASK.to(dtype).to(d) * INF)
    _check(lambda d: MASK.to(dtype).to(d) * _special(d))
    _check(lambda d: MASK.to(dtype).to(d) / 0)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_bool_converted_to_int_times_inf(dtype):
    _check(lambda d: _mask(d).to(dtype) * INF)
    _check(lambda d: _mask(d).to(dtype).float() * _special(d))


# --- other producers of 0/1 floats from a bool --------------------------------------------------


def test_bernoulli_of_zero_one_times_special():
    # p in {0, 1} makes the draw deterministic: eager and lazy both give ONE_ZERO.
    _check(lambda d: torch.bernoulli(ONE_ZERO.to(d)) * _special(d))
    _check(lambda d: torch.empty(8, device=d).bernoulli_(0.0) * _special(d))
    _check(lambda d: torch.empty(8, device=d).bernoulli_(ONE_ZERO.to(d)) * _special(d))


def test_cat_and_stack_of_bool_with_float():
    _check(lambda d: torch.cat([_mask(d), torch.zeros(2, device=d)]) * INF)
    _check(lambda d: torch.stack([_mask(d), torch.zeros(8, device=d)]) * _special(d))


def test_copy_of_bool_into_float():
    def case(d):
        x = torch.zeros(8, device=d)
        x.copy_(_mask(d))
        return x * _special(d)

    _check(case)


def test_where_of_bool_times_special():
    _check(lambda d: torch.where(_mask(d), 1.0, 0.0) * _special(d))


# --- dropout: eager multiplies by its mask, so a dropped inf or nan is nan -------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("p", [0.0, 1.0])
def test_native_dropout_of_certain_mask(p, dtype):
    _check(lambda d: torch.native_dropout(_special(d, dtype), p, True)[0])
    _check(lambda d: torch.native_dropout(_special(d, dtype), p, True)[1])
    _check(lambda d: torch.nn.functional.dropout(_special(d, dtype), p, training=True))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_native_dropout_of_special_values(dtype):
    x = SPECIAL.repeat(16).to(dtype)
    out, mask = torch.native_dropout(x.to("lazy"), 0.5, True)
    lazy_torch.mark_step()
    out, mask = out.cpu(), mask.cpu()
    assert mask.any() and not mask.all()
    # The draw differs from eager's; the values are eager's for the draw made.
    torch.testing.assert_close(out, x * mask.to(dtype) * 2.0, rtol=0, atol=0, equal_nan=True)
