"""lazy_torch/dispatch.py: how an aten op is resolved, once, to a handler (recorded, an in-place or
out= variant derived from its functional op, a view, decomposed, or run on the CPU fallback), and
its operands: lazy tensors of one device, 0-dim CPU tensors and Python numbers as graph scalars
(0 and 1 constants), a non-scalar CPU tensor a device mismatch."""

import re

import pytest
import torch

import lazy_torch
from lazy_torch import dispatch, fallback
from lazy_torch.debug import ir_text
from tests.lazy_torch.compare import assert_same_tensor

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


_BOOL_SHIFTS = {
    "mask >> 1": lambda b, i: b >> 1,
    "mask << 1": lambda b, i: b << 1,
    "mask >> ints": lambda b, i: b >> i,
    "ints >> mask": lambda b, i: i >> b,
    "1 >> mask": lambda b, i: 1 >> b,
    "bitwise_left_shift": lambda b, i: torch.bitwise_left_shift(b, 2),
    "mask >> mask": lambda b, i: b >> b,  # eager's error: no bool kernel
    "mask >>= 1": lambda b, i: b.clone().__irshift__(1),  # eager's error: int64 into bool
    "ints <<= mask": lambda b, i: i.clone().__ilshift__(b),
}


@pytest.mark.parametrize("call", _BOOL_SHIFTS.values(), ids=_BOOL_SHIFTS.keys())
def test_shifts_of_a_bool_tensor_promote_as_eagers_do(call):
    b, i = torch.tensor([True, False, True]), torch.tensor([1, 2, 3])
    try:
        expected = call(b, i)
    except Exception as e:  # noqa: BLE001 (the oracle's error)
        with pytest.raises(type(e), match=re.escape(str(e)[:40])):
            call(b.to("lazy"), i.to("lazy"))
        return
    got = call(b.to("lazy"), i.to("lazy"))
    assert got.dtype == expected.dtype == torch.int64
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("number", [1, 2.5, True, -3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_copy_of_a_python_number_fills_as_eagers_does(number, dtype):
    expected = torch.zeros(2, 3, dtype=dtype).copy_(number)
    got = torch.zeros(2, 3, dtype=dtype, device="lazy").copy_(number)
    assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("shift", [lambda x: x << 1, lambda x: torch.bitwise_right_shift(x, 1)])
def test_a_float_shift_raises_eagers_error_at_the_call(shift):
    with pytest.raises(RuntimeError, match="not implemented for 'Float'") as eager:
        shift(torch.ones(2))
    with pytest.raises(type(eager.value), match="not implemented for 'Float'"):
        shift(torch.ones(2, device="lazy"))
    lazy_torch.mark_step()  # nothing was recorded that could not compile


# ----------------------------------------------------------------------------------------------
# Resolution: each op once to one kind of handler.


@pytest.mark.parametrize(
    "func, kind",
    [
        (aten.add.Tensor, "recorded"),
        (aten.add_.Tensor, "inplace"),
        (aten.add.out, "out_variant"),
        (aten.transpose.int, "view"),
        (aten.transpose_.default, "inplace_view"),
        (aten.sinc.default, "decomposed"),
        (aten.lift_fresh_copy.default, "run"),
    ],
    ids=str,
)
def test_an_op_resolves_to_its_kind_of_handler(func, kind):
    handler = dispatch._resolve(func)
    assert handler.__qualname__.split(".")[0].lstrip("_") == kind  # the function that made it
    assert (handler is fallback.run) == (kind == "run")


@pytest.mark.parametrize(
    "call, functional",
    [
        (lambda x: x.add_(2.5), "aten.add.Tensor"),
        (lambda x: x.pow_(3), "aten.pow.Tensor_Scalar"),  # matched by schema, not by name
        (lambda x: torch.sum(x, 1, out=torch.empty(2, device=x.device)), "aten.sum.dim_IntList"),
        # An out= factory: the out tensor gives the options its functional op takes.
        (
            lambda x: torch.arange(1, 7, 2, out=torch.empty(3, device=x.device)),
            "aten.arange.start_step",
        ),
    ],
    ids=["add_", "pow_", "sum_out", "arange_out"],
)
def test_in_place_and_out_variants_record_their_functional_op(call, functional):
    out = call(torch.ones(2, 3, device="lazy"))
    ops = [line.split("] ")[1].split("(")[0] for line in ir_text(out).splitlines()[1:-2]]
    assert ops[-1] == functional


def test_an_op_is_resolved_once(monkeypatch):
    calls = []
    resolve = dispatch._resolve
    monkeypatch.setattr(dispatch, "_resolve", lambda func: calls.append(func) or resolve(func))
    monkeypatch.delitem(dispatch._handlers, id(aten.mul_.Tensor), raising=False)
    x = torch.ones(3, device="lazy")
    for _ in range(3):
        x.mul_(torch.tensor(2.0))
    assert calls.count(aten.mul_.Tensor) == 1 and len(calls) == len(set(calls))
    assert x.tolist() == [8.0, 8.0, 8.0]


def _recorded_like_eager(call, *tensors):
    """``call`` on lazy copies of ``tensors`` and on eager ones: its result (the object it returns
    when that is an argument), value, dtype, shape and strides, with no op on the fallback."""
    lazy_args = [t.to("lazy") for t in tensors]
    eager_args = [t.clone() for t in tensors]
    got, want = call(*lazy_args), call(*eager_args)
    assert [got is a for a in lazy_args] == [want is a for a in eager_args]
    assert_same_tensor(got, want)
    assert [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")] == []


_X = torch.tensor([[1.5, -2.0, 0.25], [3.0, 0.5, -1.0]])
_Y = torch.tensor([[2.0, 4.0, -1.0], [0.5, -3.0, 2.0]])


@pytest.mark.parametrize(
    "call",
    [
        lambda x, y: x.add_(y, alpha=2),
        lambda x, y: x.clamp_(min=0.4),
        lambda x, y: x.pow_(2),
        lambda x, y: x[1].mul_(y[0]),  # through a view
        lambda x, y: x.t_(),
        lambda x, y: torch.mul(x, y, out=torch.empty(0, device=x.device)),
        lambda x, y: torch.sum(x, 1, out=torch.empty(2, device=x.device)),
        lambda x, y: torch.arange(2, 11, 3, out=torch.empty(0, device=x.device)),
        lambda x, y: torch.sinc(x),
    ],
    ids=["add_", "clamp_", "pow_", "mul_view", "t_", "mul_out", "sum_out", "arange_out", "sinc"],
)
def test_derived_and_decomposed_ops_are_recorded_with_eagers_results(call):
    _recorded_like_eager(call, _X, _Y)


def test_a_decomposed_op_records_what_it_decomposes_into():
    text = lazy_torch.debug.ir_text(torch.sinc(_X.to("lazy")))
    assert "sinc" not in text and "aten.sin.default" in text


def test_an_in_place_result_that_cannot_be_cast_raises_eagers_error():
    with pytest.raises(RuntimeError) as eager:
        torch.tensor([1, 2]).add_(0.5)
    with pytest.raises(RuntimeError) as lazy:
        torch.tensor([1, 2], device="lazy").add_(0.5)
    assert (
        str(lazy.value)
        == str(eager.value)
        == ("result type Float can't be cast to the desired output type Long")
    )


# ----------------------------------------------------------------------------------------------
# Operands: lazy tensors of one device, 0-dim CPU tensors and Python numbers as graph scalars.


def test_mixing_with_cpu_tensor_raises_device_mismatch():
    x = torch.ones(3, device="lazy")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x + torch.ones(3)
    # 0-dim CPU tensors are scalars, as in eager CUDA.
    assert torch.equal((x * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))


@pytest.mark.parametrize(
    "call", [lambda x, c: x + c, lambda x, c: c * x, lambda x, c: torch.where(x > 1, x, c)]
)
def test_a_cpu_tensor_operand_gives_eager_cudas_device_error(call):
    with pytest.raises(RuntimeError) as error:
        call(torch.ones(3, device="lazy"), torch.ones(3))
    assert str(error.value) == (
        "Expected all tensors to be on the same device, but found at least two devices, "
        "lazy:0 and cpu!"
    )


@pytest.mark.parametrize(
    "x, scalar",
    [
        (torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor(5)),  # stays int32
        (torch.tensor([1, 2, 3]), torch.tensor(2.5)),  # int64 * float -> float32
        (torch.tensor([1.5, 2.0]), torch.tensor(3, dtype=torch.int64)),
        (torch.tensor([True, False]), torch.tensor(7)),
    ],
)
def test_a_0_dim_cpu_tensor_is_a_scalar_operand_with_eagers_promotion(x, scalar):
    _recorded_like_eager(lambda t: t * scalar, x)


def test_a_changing_0_dim_cpu_tensor_never_recompiles():
    x = torch.tensor([1.0, -2.0], dtype=torch.float64).to("lazy")
    (x * torch.tensor(0.5)).cpu()
    lazy_torch.metrics.reset()
    for v in (0.25, -3.0, 7.5):
        assert (x * torch.tensor(v)).tolist() == [v, -2.0 * v]
    assert lazy_torch.metrics.counters().get("compiles", 0) == 0


def test_scalars_are_parameters_not_constants():
    x = torch.ones(4, device="lazy")
    for lr in (0.1, 0.2, 0.3, 0.4):
        (x * lr + lr).sum().item()
    assert lazy_torch.metrics.counters()["compiles"] == 1
    assert lazy_torch.metrics.counters()["cache_hits"] == 3
    assert "scalar" in lazy_torch.debug.ir_text(
        x * 0.5
    ) and "constant(1)" in lazy_torch.debug.ir_text(x * 1)


@pytest.mark.parametrize(
    "number, leaf",
    [
        (0, "constant(0)"),
        (1, "constant(1)"),
        (True, "constant(True)"),
        (0.0, "constant(0.0)"),
        (1.0, "constant(1.0)"),
        (-0.0, "scalar(-0.0)"),  # its sign matters to division: a graph scalar
        (2, "scalar(2)"),
        (-1.0, "scalar(-1.0)"),
    ],
    ids=repr,
)
def test_only_0_and_1_are_constants(number, leaf):
    x = torch.tensor([1.0, -1.0, 2.5])
    assert leaf in lazy_torch.debug.ir_text(x.to("lazy") * number)
    _recorded_like_eager(lambda t: t / number, x)
    got, want = (x.to("lazy") / number).cpu(), x / number
    assert torch.equal(torch.signbit(got), torch.signbit(want))
