"""Eager's checks of the values of numbers (lazy_torch/scalar_checks.py), against eager CPU.

Each refused call runs after an accepted call of the same signature (the same op, dtypes and
number types), so its shape-memo entry exists and the C fast path may record it: the error must
come from the call itself all the same, with eager's type and message.
"""

from __future__ import annotations

import pytest
import torch

import lazy_torch
from lazy_torch import scalar_checks
from lazy_torch.tensor import _native

DEV = "lazy"


def _ones(d, dtype=torch.long, n=3):
    return torch.ones(n, dtype=dtype, device=d)


def _index(d):
    return torch.tensor([0], device=d)


def _mask(d):
    return torch.ones(3, dtype=torch.bool, device=d)


def _int8(d):
    return _ones(d, torch.int8)


def _uint8(d):
    return _ones(d, torch.uint8)


def _half(d):
    return _ones(d, torch.float16, 2)


def _float(d):
    return _ones(d, torch.float32)


def _setitem(x, index, v):
    x[index] = v
    return x


def _out(d, dtype=torch.long, n=3):
    return torch.empty(n, dtype=dtype, device=d)


# name -> (call(value) -> fn(device), a value eager accepts, one of the same type it refuses).
CASES = {
    # pow: integers to negative integer powers.
    "long ** -1": (lambda v: lambda d: _ones(d) ** v, 2, -1),
    "torch.pow": (lambda v: lambda d: torch.pow(_ones(d), v), 0, -2),
    "int32 pow": (lambda v: lambda d: _ones(d, torch.int32).pow(v), 3, -1),
    "uint8 pow": (lambda v: lambda d: _uint8(d).pow(v), 1, -3),
    "bool pow": (lambda v: lambda d: _ones(d, torch.bool) ** v, 2, -1),
    "empty pow": (lambda v: lambda d: _ones(d, n=0) ** v, 2, -1),
    "pow_": (lambda v: lambda d: _ones(d).pow_(v), 2, -1),
    "pow out": (lambda v: lambda d: torch.pow(_ones(d), v, out=_out(d)), 2, -1),
    "pow float out": (lambda v: lambda d: torch.pow(_ones(d), v, out=_out(d, torch.float)), 2, -1),
    # Integer division by a zero number.
    "//": (lambda v: lambda d: _ones(d) // v, 2, 0),
    "// bool": (lambda v: lambda d: _ones(d) // v, True, False),
    "%": (lambda v: lambda d: _ones(d) % v, 2, 0),
    "fmod": (lambda v: lambda d: torch.fmod(_ones(d), v), 2, 0),
    "remainder": (lambda v: lambda d: torch.remainder(_ones(d, torch.int32), v), 2, 0),
    "div floor": (lambda v: lambda d: torch.div(_ones(d), v, rounding_mode="floor"), 2, 0),
    "div trunc": (lambda v: lambda d: torch.div(_ones(d), v, rounding_mode="trunc"), 2, 0),
    "//=": (lambda v: lambda d: _ones(d).__ifloordiv__(v), 2, 0),
    "fmod_": (lambda v: lambda d: _ones(d).fmod_(v), 2, 0),
    "remainder_": (lambda v: lambda d: _ones(d).remainder_(v), 2, 0),
    "div_ trunc": (lambda v: lambda d: _ones(d).div_(v, rounding_mode="trunc"), 2, 0),
    "fmod out": (lambda v: lambda d: torch.fmod(_ones(d), v, out=_out(d)), 2, 0),
    "floor_divide out": (lambda v: lambda d: torch.floor_divide(_ones(d), v, out=_out(d)), 2, 0),
    "div trunc out": (
        lambda v: lambda d: torch.div(_ones(d), v, rounding_mode="trunc", out=_out(d)),
        2,
        0,
    ),
    "// CPU scalar": (lambda v: lambda d: _ones(d) // torch.tensor(v), 2, 0),
    "fmod CPU scalar": (lambda v: lambda d: torch.fmod(_ones(d), torch.tensor(v)), 2, 0),
    # Numbers converted to a dtype that cannot hold them.
    "full uint8": (lambda v: lambda d: torch.full((2,), v, dtype=torch.uint8, device=d), 255, 256),
    "full uint8 negative": (
        lambda v: lambda d: torch.full((2,), v, dtype=torch.uint8, device=d),
        -255,
        -256,
    ),
    "full uint8 float": (
        lambda v: lambda d: torch.full((2,), v, dtype=torch.uint8, device=d),
        255.0,
        -1.5,
    ),
    "full int32": (
        lambda v: lambda d: torch.full((2,), v, dtype=torch.int32, device=d),
        2**31 - 1,
        2**31,
    ),
    "full long nan": (
        lambda v: lambda d: torch.full((2,), v, dtype=torch.long, device=d),
        1.0,
        float("nan"),
    ),
    "full half": (lambda v: lambda d: torch.full((2,), v, dtype=torch.half, device=d), 1e4, 1e5),
    "full float": (lambda v: lambda d: torch.full((2,), v, device=d), float("inf"), 1e300),
    "full int8 complex": (  # (an int8 fill of 1 + 0j fails to lower)
        lambda v: lambda d: torch.full((2,), v, dtype=torch.int8, device=d),
        1,
        1 + 1j,
    ),
    "full_like": (lambda v: lambda d: torch.full_like(_uint8(d), v), 200, 300),
    "full_like dtype": (
        lambda v: lambda d: torch.full_like(_float(d), v, dtype=torch.int8),
        100,
        200,
    ),
    "new_full": (lambda v: lambda d: _int8(d).new_full((2,), v), -128, -129),
    "fill_": (lambda v: lambda d: _uint8(d).fill_(v), 200, 300),
    "fill_ view": (lambda v: lambda d: _uint8(d)[1:].fill_(v), 200, 300),
    "fill_ float": (lambda v: lambda d: _float(d).fill_(v), 1e38, 1e39),
    "setitem": (lambda v: lambda d: _setitem(_uint8(d), 0, v), 200, 300),
    "setitem slice": (lambda v: lambda d: _setitem(_uint8(d), slice(1, None), v), 200, 300),
    "where": (lambda v: lambda d: torch.where(_mask(d), _uint8(d), v), 200, 300),
    "masked_fill": (lambda v: lambda d: _uint8(d).masked_fill(_mask(d), v), 200, 300),
    "masked_fill_": (lambda v: lambda d: _uint8(d).masked_fill_(_mask(d), v), 200, 300),
    "masked_fill CPU scalar": (
        lambda v: lambda d: _uint8(d).masked_fill(_mask(d), torch.tensor(v)),
        200,
        300,
    ),
    "index_fill": (lambda v: lambda d: _uint8(d).index_fill(0, _index(d), v), 200, 300),
    "scatter value": (lambda v: lambda d: _uint8(d).scatter(0, _index(d), v), 200, 300),
    "pad": (lambda v: lambda d: torch.nn.functional.pad(_uint8(d), (1, 1), value=v), 200, 300),
    "clamp": (lambda v: lambda d: _uint8(d).clamp(max=v), 200, 300),
    "clamp min": (lambda v: lambda d: _uint8(d).clamp(v), 200, 300),
    "clamp half": (lambda v: lambda d: _half(d).clamp(max=v), 6e4, 7e4),
    "clamp_": (lambda v: lambda d: _uint8(d).clamp_(max=v), 200, 300),
    "clamp out": (
        lambda v: lambda d: torch.clamp(_uint8(d), max=v, out=_out(d, torch.uint8)),
        200,
        300,
    ),
    "clamp_min": (lambda v: lambda d: torch.clamp_min(_uint8(d), v), 200, 300),
    "clamp_max": (lambda v: lambda d: torch.clamp_max(_uint8(d), v), 200, 300),
    "hardtanh": (lambda v: lambda d: torch.nn.functional.hardtanh(_int8(d), -1, v), 100, 300),
    "threshold": (lambda v: lambda d: torch.nn.functional.threshold(_int8(d), v, 1), 100, 300),
    "threshold value": (
        lambda v: lambda d: torch.nn.functional.threshold(_int8(d), 0, v),
        100,
        300,
    ),
    "add alpha": (lambda v: lambda d: torch.add(_int8(d), _int8(d), alpha=v), 100, 300),
    "add alpha half": (lambda v: lambda d: torch.add(_half(d), _half(d), alpha=v), 0.5, 1e6),
    "add alpha float": (lambda v: lambda d: torch.add(_float(d), _float(d), alpha=v), 2.0, 1e300),
    "sub alpha number": (lambda v: lambda d: torch.sub(_int8(d), 1, alpha=v), 100, 300),
    "rsub alpha": (lambda v: lambda d: torch.rsub(_int8(d), 1, alpha=v), 100, 300),
    "add_ alpha": (lambda v: lambda d: _int8(d).add_(_int8(d), alpha=v), 100, 300),
    "add out alpha": (
        lambda v: lambda d: torch.add(_int8(d), _int8(d), alpha=v, out=_out(d, torch.int8)),
        100,
        300,
    ),
    "addcmul value": (
        lambda v: lambda d: torch.addcmul(_int8(d), _int8(d), _int8(d), value=v),
        100,
        300,
    ),
    "addmm beta": (
        lambda v: (
            lambda d: torch.addmm(*(torch.ones(2, 2, dtype=torch.int8, device=d),) * 3, beta=v)
        ),
        100,
        300,
    ),
    "baddbmm alpha": (
        lambda v: (
            lambda d: torch.baddbmm(
                *(torch.ones(1, 2, 2, dtype=torch.int8, device=d),) * 3, alpha=v
            )
        ),
        100,
        300,
    ),
    "linspace": (
        lambda v: lambda d: torch.linspace(0, v, 3, dtype=torch.uint8, device=d),
        200,
        300,
    ),
    "linspace float": (lambda v: lambda d: torch.linspace(0, v, 3, device=d), 1e38, 1e300),
    "logspace": (
        lambda v: lambda d: torch.logspace(0, v, 3, dtype=torch.uint8, device=d),
        2,
        300,
    ),
    # Random ops' arguments.
    "uniform_": (lambda v: lambda d: _float(d).uniform_(v, 1), 0.5, 2.0),
    "uniform_ bounds": (lambda v: lambda d: _float(d).uniform_(0, v), 1e38, float("inf")),
    "random_": (lambda v: lambda d: _ones(d).random_(v, 3), 2, 3),
    "random_ uint8 bound": (lambda v: lambda d: _uint8(d).random_(0, v), 256, 300),
    "random_ to": (lambda v: lambda d: _ones(d).random_(v), 1, 0),
    "randint": (lambda v: lambda d: torch.randint(v, 3, (3,), device=d), 2, 5),
    "bernoulli_": (lambda v: lambda d: _float(d).bernoulli_(v), 1.0, 1.5),
    "bernoulli p": (lambda v: lambda d: torch.bernoulli(_float(d), v), 0.0, -0.5),
    # Other ops' arguments.
    "celu": (lambda v: lambda d: torch.nn.functional.celu(_float(d), v), 1.0, 0.0),
    "celu_": (lambda v: lambda d: torch.nn.functional.celu_(_float(d), v), 1.0, 0.0),
    "renorm p": (lambda v: lambda d: torch.renorm(torch.ones(2, 2, device=d), v, 0, 1.0), 2.0, 0.0),
    "renorm maxnorm": (
        lambda v: lambda d: torch.renorm(torch.ones(2, 2, device=d), 2, 0, v),
        1.0,
        -1.0,
    ),
    "histc": (lambda v: lambda d: torch.histc(_float(d), 4, v, 2), 0.0, 3.0),
    "smooth_l1_loss": (
        lambda v: lambda d: torch.nn.functional.smooth_l1_loss(_float(d), _float(d), beta=v),
        1.0,
        -1.0,
    ),
    "mvlgamma": (lambda v: lambda d: torch.mvlgamma(_float(d) + 5, v), 1, 0),
    "mvlgamma_": (lambda v: lambda d: (_float(d) + 5).mvlgamma_(v), 2, -1),
    "mvlgamma out": (
        lambda v: lambda d: torch.mvlgamma(_float(d) + 5, v, out=_out(d, torch.float)),
        1,
        0,
    ),
    # Foreach ops: integer lists run per element, floating ones as one node.
    "foreach pow": (lambda v: lambda d: torch._foreach_pow([_ones(d)], v), 2, -1),
    "foreach pow_": (lambda v: lambda d: torch._foreach_pow_([_ones(d), _ones(d)], v), 2, -1),
    "foreach add alpha": (
        lambda v: lambda d: torch._foreach_add([_int8(d)], [_int8(d)], alpha=v),
        100,
        300,
    ),
    "foreach add_ alpha half": (
        lambda v: lambda d: torch._foreach_add_([_half(d), _half(d)], [_half(d)] * 2, alpha=v),
        0.5,
        1e6,
    ),
    "foreach clamp_min": (lambda v: lambda d: torch._foreach_clamp_min([_uint8(d)], v), 200, 300),
    "foreach clamp_max half list": (
        lambda v: lambda d: torch._foreach_clamp_max([_half(d), _half(d)], [1.0, v]),
        6e4,
        7e4,
    ),
}


def _outcome(fn, device):
    """What ``fn(device)`` gives: its outputs' (shape, dtype, CPU copy), or the error it raises at
    the call (before any value is read)."""
    try:
        out = fn(device)
    except Exception as e:  # noqa: BLE001 (the error is the result)
        return type(e), str(e)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [(tuple(t.shape), t.dtype, t.cpu()) if isinstance(t, torch.Tensor) else t for t in outs]


def _assert_same(lazy, eager, draws=False):
    """Equal errors, or equal shapes and dtypes and close values (``draws``: random values)."""
    if isinstance(eager, tuple):
        assert lazy == eager
        return
    assert isinstance(lazy, list), lazy
    assert [o[:2] for o in lazy] == [o[:2] for o in eager]
    if not draws:
        for o, e in zip(lazy, eager):
            torch.testing.assert_close(o[2], e[2], equal_nan=True)


_RANDOM = ("uniform", "random", "randint", "bernoulli")


@pytest.mark.parametrize("name", list(CASES))
def test_refused_number_raises_eager_error_at_the_call(name):
    call, accepted, refused = CASES[name]
    eager_ok = _outcome(call(accepted), "cpu")
    assert isinstance(eager_ok, list), eager_ok  # the case's accepted value is accepted
    for _ in range(2):  # the second time, from the shape memo (and the C fast path)
        _assert_same(_outcome(call(accepted), DEV), eager_ok, any(r in name for r in _RANDOM))
    eager_error = _outcome(call(refused), "cpu")
    assert isinstance(eager_error, tuple) and issubclass(eager_error[0], Exception)
    assert _outcome(call(refused), DEV) == eager_error
    lazy_torch.mark_step(wait=True)  # nothing refused was recorded: the next barrier works


# Numbers that look out of range to the cheap test but that eager accepts.
ACCEPTED = {
    "uint8 fill -1": lambda d: _uint8(d).fill_(-1),
    "uint8 full -255": lambda d: torch.full((2,), -255, dtype=torch.uint8, device=d),
    "bool fill 1e300": lambda d: _ones(d, torch.bool).fill_(1e300),
    "float fill -inf": lambda d: _float(d).fill_(float("-inf")),
    "uint8 clamp float bound": lambda d: _uint8(d).clamp(max=300.5),
    "uint8 clamp -1": lambda d: _uint8(d).clamp(min=-1),
    "int8 + float alpha": lambda d: torch.add(_int8(d), _float(d), alpha=300),
    "uint8 + 300": lambda d: _uint8(d) + 300,
    "float // 0": lambda d: _float(d) // 0,
    "long // 0.0": lambda d: _ones(d) // 0.0,
    "long fmod 0.0": lambda d: torch.fmod(_ones(d), 0.0).isnan(),
    "div by 0": lambda d: torch.div(_ones(d), 0),
    "empty long // 0": lambda d: torch.div(_ones(d, n=0), 3, rounding_mode="floor"),
    "long ** -1.0": lambda d: _ones(d) ** -1.0,
    "long ** CPU -1": lambda d: _ones(d) ** torch.tensor(-1),
    "2 ** negative long": lambda d: 2 ** -_ones(d),
    "float ** -1": lambda d: _float(d) ** -1,
    "linspace one step": lambda d: torch.linspace(0, 300, 1, dtype=torch.uint8, device=d),
    "where scalars": lambda d: torch.where(_mask(d), 300, 2),
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_numbers_eager_accepts_give_eager_values(name):
    fn = ACCEPTED[name]
    for _ in range(2):
        eager = _outcome(fn, "cpu")
        assert isinstance(eager, list), eager
        _assert_same(_outcome(fn, DEV), eager)


def test_accepted_suspect_numbers_are_replayed_once(monkeypatch):
    calls = []
    replay = scalar_checks._replay
    monkeypatch.setattr(scalar_checks, "_replay", lambda *a: calls.append(a[0]) or replay(*a))
    x = torch.ones(5, 7, dtype=torch.uint8, device=DEV)  # a layout no other test uses
    for _ in range(3):
        x.clamp(max=300.5)
    assert len(calls) == 1
    for _ in range(3):  # numbers that fit every dtype are never replayed
        x.clamp(max=3)
    assert len(calls) == 1


def test_checked_ops_stay_on_the_c_fast_path():
    x, y, m = torch.ones(4, device=DEV), torch.ones(4, device=DEV), torch.ones(2, 2, device=DEV)
    calls = [
        lambda: x.pow(2.0),
        lambda: x.pow(3),
        lambda: x.add(y),
        lambda: x.add(y, alpha=0.5),
        lambda: x.clamp(min=0.25),
        lambda: torch.addmm(m, m, m),
        lambda: torch.addmm(m, m, m, beta=0.5),
    ]
    for call in calls:
        call()  # the shape memo's entries
    before = _native.stats()
    for call in calls:
        call()
    after = _native.stats()
    assert after["python"] == before["python"]
    assert after["native"] - before["native"] == len(calls)
