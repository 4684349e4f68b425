"""Dtypes eager's CPU kernels refuse (lazy_torch/dtype_checks.py): lazy raises eager's error at
the call, not a compile error at the next barrier nor a result, and a later barrier still works."""

import pytest
import torch

import lazy_torch


def _b(dev):
    return torch.tensor([True, False], device=dev)


def _f(dev):
    return torch.tensor([1.5, -2.0], device=dev)


def _l(dev):
    return torch.tensor([1, 3], device=dev)


UNSUPPORTED = {
    "float_or_int": lambda d: _f(d) | 2,
    "float_or_float": lambda d: _f(d) | _f(d),
    "float_or_": lambda d: _f(d).bitwise_or_(2),
    "empty_float_or_int": lambda d: torch.ones(0, device=d) | 2,
    "bool_lerp": lambda d: _b(d).lerp(_b(d), 0.5),
    "long_log_softmax": lambda d: _l(d).log_softmax(0),
    "bool_clamp_min": lambda d: _b(d).clamp(min=False),
    "bool_remainder": lambda d: _b(d) % _b(d),
    "bool_remainder_cpu_scalar": lambda d: _b(d) % torch.tensor(True),
    "float_lshift": lambda d: _f(d) << 1,
}


def _outcome(fn, dev):
    try:
        out = fn(dev)
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return type(e), str(e)
    return out.cpu()


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_dtype_raises_eagers_error_at_the_call(name):
    expected = _outcome(UNSUPPORTED[name], "cpu")
    assert isinstance(expected, tuple) and expected[0] is NotImplementedError
    assert _outcome(UNSUPPORTED[name], "lazy") == expected
    assert lazy_torch.metrics.counters().get(f"fallback::{name}", 0) == 0
    x = _f("lazy") + 1
    lazy_torch.mark_step(wait=True)  # nothing left that fails to compile
    assert x.cpu().tolist() == [2.5, -1.0]


def test_supported_dtypes_still_record_without_fallback():
    x, i = _f("lazy"), _l("lazy")
    outs = [x.log_softmax(0), i | 2, i.clamp(min=2), x.lerp(x * 2, 0.5), i % 2]
    eager = [_f("cpu").log_softmax(0), _l("cpu") | 2, _l("cpu").clamp(min=2)]
    eager += [_f("cpu").lerp(_f("cpu") * 2, 0.5), _l("cpu") % 2]
    for got, want in zip(outs, eager):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want)
    assert not [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]


# RuntimeErrors eager's kernels raise for dtypes and the types of Scalar arguments alone.
DTYPE_ERRORS = {
    "bool_alpha_on_floats": lambda d: _f(d).add(_f(d), alpha=True),
    "float_alpha_on_bools": lambda d: _b(d).add(_b(d), alpha=8.0),
    "float_alpha_on_longs": lambda d: _l(d).sub(_l(d), alpha=0.5),
    "bool_minus_float": lambda d: _b(d) - 2.0,
    "false_minus_bool": lambda d: False - _b(d),
    "bool_minus_bool_": lambda d: _b(d).sub_(_b(d)),
    "bool_minus_cpu_scalar": lambda d: _b(d) - torch.tensor(True),
    "long_std": lambda d: _l(d).std(0),
    "long_var": lambda d: torch.var(_l(d)),
    "bool_argmin": lambda d: _b(d).argmin(0),
    "bool_argmax": lambda d: _b(d).argmax(),
    "bool_relu": lambda d: _b(d).relu(),
}


@pytest.mark.parametrize("name", sorted(DTYPE_ERRORS))
def test_dtype_error_raises_eagers_error_at_the_call(name):
    expected = _outcome(DTYPE_ERRORS[name], "cpu")
    assert isinstance(expected, tuple) and expected[0] is RuntimeError
    assert _outcome(DTYPE_ERRORS[name], "lazy") == expected
    assert _outcome(DTYPE_ERRORS[name], "lazy") == expected  # memo misses only: raised again


def test_values_do_not_decide_a_checked_call():
    # The shape memo is keyed on dtypes and Scalar types, so an accepted call's twin with other
    # values is accepted too; eager agrees.
    for alpha in (2, -3):
        got = _l("lazy").add(_l("lazy"), alpha=alpha)
        assert got.cpu().tolist() == _l("cpu").add(_l("cpu"), alpha=alpha).tolist()
    assert _f("lazy").add(_f("lazy"), alpha=0.5).cpu().tolist() == [2.25, -3.0]


def test_large_pointwise_call_is_checked_on_small_standins():
    x = torch.ones(300, 300, device="lazy")  # past the size replayed at full shape
    with pytest.raises(NotImplementedError, match="\"bitwise_or_cpu\" not implemented for 'Float'"):
        x | 2
    assert (x + 1).sum().item() == 180000.0
