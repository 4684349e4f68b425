"""tests/ops/overload_sweep.py: Python's operators on lazy tensors give eager's values without
falling back to the CPU, the sweep tells fallbacks from lowered and decomposed ops, and the full
sweep finds no fallback outside its GAPS and coverage.py's KNOWN_FALLBACKS."""

import operator

import pytest
import torch
from torch._decomp import decomposition_table

from tests.ops import overload_sweep as sweep
from tests.ops.coverage import KNOWN_FALLBACKS

# Augmented assignment: ``x op= y`` is ``x = operator.i<op>(x, y)`` (``x @= y`` has no in-place
# method on tensors, and so is ``x = x @ y``).
IN_PLACE = {
    ">>": operator.irshift, "<<": operator.ilshift, "&": operator.iand, "|": operator.ior,
    "^": operator.ixor, "//": operator.ifloordiv, "%": operator.imod, "**": operator.ipow,
    "@": operator.imatmul, "+": operator.iadd, "-": operator.isub, "*": operator.imul,
    "/": operator.itruediv,
}  # fmt: skip


# (how it reads, the call on (x, y): y nonzero, e small and non-negative)
OPERATOR_CASES = [
    ("x >> 1", lambda x, y, e: x >> 1),
    ("x >> y", lambda x, y, e: x >> y),
    ("x << 2", lambda x, y, e: x << 2),
    ("x << e", lambda x, y, e: x << e),
    ("3 >> e", lambda x, y, e: 3 >> e),
    ("x & y", lambda x, y, e: x & y),
    ("x & 6", lambda x, y, e: x & 6),
    ("x | y", lambda x, y, e: x | y),
    ("5 | x", lambda x, y, e: 5 | x),
    ("x ^ y", lambda x, y, e: x ^ y),
    ("~x", lambda x, y, e: ~x),
    ("x // y", lambda x, y, e: x // y),
    ("x // 3", lambda x, y, e: x // 3),
    ("7 // y", lambda x, y, e: 7 // y),
    ("x % y", lambda x, y, e: x % y),
    ("x % 3", lambda x, y, e: x % 3),
    ("7 % y", lambda x, y, e: 7 % y),
    ("x ** e", lambda x, y, e: x**e),
    ("x ** 2", lambda x, y, e: x**2),
    ("2 ** e", lambda x, y, e: 2**e),
    ("x @ y", lambda x, y, e: x @ y),
    ("x + y", lambda x, y, e: x + y),
    ("1 - x", lambda x, y, e: 1 - x),
    ("x * 3", lambda x, y, e: x * 3),
    ("x / y", lambda x, y, e: x / y),
    ("-x", lambda x, y, e: -x),
    ("abs(x)", lambda x, y, e: abs(x)),
    ("x == y", lambda x, y, e: x == y),
    ("x != 1", lambda x, y, e: x != 1),
    ("x < y", lambda x, y, e: x < y),
    ("x <= 0", lambda x, y, e: x <= 0),
    ("x > y", lambda x, y, e: x > y),
    ("2 >= x", lambda x, y, e: 2 >= x),
]


def _augmented(symbol, operand):
    """``x <symbol>= <operand>``: ``y``, ``e`` or a Python int."""

    def run(x, y, e):
        value = {"y": y, "e": e}[operand] if operand in ("y", "e") else int(operand)
        return IN_PLACE[symbol](x, value)

    return run


AUGMENTED = (
    ">>= e, >>= 2, <<= e, &= y, |= 2, ^= y, //= y, %= y, %= 2, **= e, **= 2, @= y, += y, -= 2, "
    "*= y, /= y"
)
OPERATOR_CASES += [(f"x {a}", _augmented(*a.split("= "))) for a in AUGMENTED.split(", ")]


def _operands(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-9, 10, (4, 4), generator=g)
    sign = torch.randint(0, 2, (4, 4), generator=g) * 2 - 1
    y = torch.randint(1, 5, (4, 4), generator=g) * sign
    e = torch.randint(0, 4, (4, 4), generator=g)
    if dtype.is_floating_point:
        x = x + torch.rand(4, 4, generator=g)
    return x.to(dtype), y.to(dtype), e.to(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
@pytest.mark.parametrize("call", [c for _, c in OPERATOR_CASES], ids=[t for t, _ in OPERATOR_CASES])
def test_operators_give_eagers_values_without_falling_back(call, dtype):
    x, y, e = _operands(dtype)
    try:
        want = call(x.clone(), y, e)  # in-place forms write their first operand
    except Exception as eager_error:  # eager refuses (a float shift, int64 /=): lazy refuses too
        with pytest.raises(type(eager_error)):
            call(*(t.to("lazy") for t in (x, y, e)))
        return
    before = sweep.fallback_counts()
    reached = sweep.Reached(lazy=True)
    with reached:
        got = call(*(t.to("lazy") for t in (x, y, e)))
    assert reached.ops, "no aten op on lazy tensors"
    assert [op for op, fell in reached.ops.items() if fell] == []
    assert sweep.fallback_counts() == before
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_the_sweep_spells_and_classifies_the_shift_operators():
    names = {"torch.Tensor.__rshift__", "torch.Tensor.__lshift__", "torch.Tensor.__irshift__"}
    report = sweep.sweep(sweep.probe_calls(names), named=False)
    for op in ("aten.__rshift__.Scalar", "aten.__rshift__.Tensor", "aten.__lshift__.Scalar"):
        assert report.status[op] == "lowered", (op, report.status)
    assert report.fallbacks == {}
    calls = [c for c in sweep.probe_calls({"torch.Tensor.__rshift__"})]
    texts = {sweep.spelled(c, *c.make()).split("  ")[0] for c in calls}
    assert {"x >> 1", "x >> y"} <= texts


# Two ops of this test's own: ``twice`` has a CPU kernel only (so it runs on the CPU fallback),
# ``thrice`` a CPU kernel and, within the test, a torch._decomp decomposition.
_lib = torch.library.Library("overload_sweep_test", "DEF")
_lib.define("twice(Tensor x) -> Tensor")
_lib.impl("twice", lambda x: x * 2, "CPU")
_lib.define("thrice(Tensor x) -> Tensor")
_lib.impl("thrice", lambda x: x * 3, "CPU")


def test_the_sweep_tells_a_fallback_from_lowered_and_decomposed_ops(monkeypatch):
    ops = torch.ops.overload_sweep_test
    monkeypatch.setitem(decomposition_table, ops.thrice.default, lambda x: x * 3)
    ones = sweep.maker((torch.ones(3),))
    calls = [
        sweep.Call("twice({all})", ops.twice, ones, key="twice"),
        sweep.Call("thrice({all})", ops.thrice, ones, key="thrice"),
        sweep.Call("{0} >> 1", lambda x: x >> 1, sweep.maker((torch.ones(3, dtype=torch.int64),))),
    ]
    report = sweep.sweep(calls, named=False)
    assert report.status == {
        "overload_sweep_test.twice.default": "fallback",
        "overload_sweep_test.thrice.default": "decomposed",
        "aten.__rshift__.Scalar": "lowered",
    }
    assert report.fallbacks == {
        "overload_sweep_test.twice.default": [
            "`twice(x)  (x: float32[3])` -> overload_sweep_test.twice.default"
        ]
    }
    assert "- `overload_sweep_test.twice.default` (new: " in sweep.markdown(report)


@pytest.mark.slow
def test_the_full_sweep_finds_no_fallback_outside_the_allow_list():
    report = sweep.sweep(sweep.all_calls())
    unexpected = {
        op: spellings
        for op, spellings in report.fallbacks.items()
        if op not in sweep.GAPS and op not in KNOWN_FALLBACKS
    }
    assert unexpected == {}
