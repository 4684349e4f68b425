"""0-dim CPU tensors as operands of ops on lazy tensors, as eager CUDA takes them (graph scalars):
first or second operand of arithmetic, comparisons, where, masked_fill, clamp, pow and integer
division, at bool, int and float dtypes; each agrees with eager CPU (values, dtype, shape, or the
error's type and message)."""

import pytest
import torch

import lazy_torch  # noqa: F401

SCALARS = {
    "bool": lambda: torch.tensor(True),
    "int": lambda: torch.tensor(3),
    "zero_int": lambda: torch.tensor(0),
    "float": lambda: torch.tensor(0.5),
}
TENSORS = {
    "bool": lambda: torch.tensor([True, False, True]),
    "int": lambda: torch.tensor([1, -2, 3]),
    "float": lambda: torch.tensor([1.5, -2.0, 0.25]),
}
OPS = {
    "add": lambda x, s: x + s,
    "radd": lambda x, s: s + x,
    "sub": lambda x, s: x - s,
    "rsub": lambda x, s: s - x,
    "mul": lambda x, s: s * x,
    "div": lambda x, s: s / x,
    "eq": lambda x, s: x == s,
    "lt": lambda x, s: s < x,
    "where_second": lambda x, s: torch.where(x > 0, s, x),
    "where_third": lambda x, s: torch.where(x > 0, x, s),
    "masked_fill": lambda x, s: x.masked_fill(x > 0, s),
    "masked_fill_": lambda x, s: x.clone().masked_fill_(x > 0, s),
    "clamp_min": lambda x, s: torch.clamp(x, min=s),
    "clamp_max": lambda x, s: x.clamp(max=s),
    "pow": lambda x, s: x**s,
    "rpow": lambda x, s: s**x,
    "floordiv": lambda x, s: x // s,
    "rfloordiv": lambda x, s: s // x,
    "remainder": lambda x, s: x % s,
    "rremainder": lambda x, s: torch.remainder(s, x),
    "maximum": lambda x, s: torch.maximum(s, x),
}


# Dtype rules of eager's kernels, not of scalar operands (known failures of test_differential.py).
_DTYPE_CHECKS = {("pow", "bool", "bool"), ("rpow", "bool", "bool")}


def _run(fn, x, s):
    try:
        out = fn(x, s)
        return out.cpu() if isinstance(out, torch.Tensor) else out
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return e.with_traceback(None)  # frees a failed result, which a barrier would rerun


@pytest.mark.parametrize("tensor", sorted(TENSORS))
@pytest.mark.parametrize("scalar", sorted(SCALARS))
@pytest.mark.parametrize("op", sorted(OPS))
def test_cpu_scalar_operand_matches_eager(op, scalar, tensor):
    if (op, scalar, tensor) in _DTYPE_CHECKS:
        pytest.skip("a dtype check of eager's kernel")
    fn, x = OPS[op], TENSORS[tensor]()
    expected = _run(fn, x, SCALARS[scalar]())
    got = _run(fn, x.to("lazy"), SCALARS[scalar]())
    if isinstance(expected, Exception):
        assert isinstance(got, Exception), got
        assert (type(got), str(got)) == (type(expected), str(expected))
        return
    assert not isinstance(got, Exception), got
    assert (got.dtype, got.shape) == (expected.dtype, expected.shape)
    torch.testing.assert_close(got, expected, equal_nan=True)


def test_cpu_scalar_dividend_divides_each_element():
    # A scalar dividend once raised ZeroDivisionError: the error replay divided it by zeros.
    out = torch.tensor(3) // torch.arange(1, 4, device="lazy")
    assert out.cpu().tolist() == [3, 1, 1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_a_0dim_tensor_outranks_a_python_number_in_promotion(dtype):
    # With an int64 tensor, eager compares in the 0-dim tensor's dtype (16777217 is no float32),
    # and in float32 (complex64) with a Python number: the graph parameter alone cannot say which
    # it was, its lazy.zero_dim node does.
    x = torch.tensor([16777217, 3])
    s = torch.tensor(16777216.5, dtype=dtype)
    ops = [lambda t, s: t == s] + ([] if dtype.is_complex else [lambda t, s: t > s])
    for fn in ops:
        for scalar in (s, s.item()):
            assert fn(x.to("lazy"), scalar).cpu().tolist() == fn(x, scalar).tolist()
    assert (x.to("lazy") + s).cpu().dtype == (x + s).dtype
