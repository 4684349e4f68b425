"""Out-of-range indices and integer division by zero raise eager's error (type and message),
never a clamped, wrapped or garbage value."""

import pytest
import torch
import torch.nn.functional as F

import lazy_torch

X = torch.arange(15.0).reshape(5, 3)
ONE = torch.ones(1)

CASES = {
    "index": lambda x, i: x[i],
    "index_second_dim": lambda x, i: x[:, i],
    "index_two": lambda x, i: x[torch.zeros_like(i), i],
    "index_put": lambda x, i: x.index_put((i,), ONE.to(x.device)),
    "gather": lambda x, i: torch.gather(x, 0, i.reshape(1, 1)),
    "scatter": lambda x, i: x.scatter(1, i.reshape(1, 1), 1.0),
    "scatter_add": lambda x, i: x.scatter_add(0, i.reshape(1, 1), x[:1, :1]),
    "index_select": lambda x, i: x.index_select(0, i),
    "index_add": lambda x, i: x.index_add(0, i, x[:1]),
    "index_copy": lambda x, i: x.index_copy(0, i, x[:1]),
    "index_fill": lambda x, i: x.index_fill(1, i, 2.0),
    "embedding": lambda x, i: F.embedding(i, x),
    "take": lambda x, i: torch.take(x, i),
    "put": lambda x, i: x.put(i, ONE.to(x.device)),
}


@pytest.mark.parametrize("index", [7, -1, -6, 40, -40])
@pytest.mark.parametrize("name", sorted(CASES))
def test_out_of_range_index_matches_eager(name, index):
    fn, i = CASES[name], torch.tensor([index])
    try:
        expected = fn(X, i)
    except (IndexError, RuntimeError) as eager:
        assert _lazy_error(fn, i) == (type(eager), str(eager))
    else:
        torch.testing.assert_close(fn(X.to("lazy"), i.to("lazy")).cpu(), expected)


def _lazy_error(fn, i):
    try:
        fn(X.to("lazy"), i.to("lazy")).cpu()
    except Exception as e:  # its traceback keeps the failed pending tensor alive: drop it here
        return type(e), str(e)
    return None


def test_a_failed_check_keeps_values_and_an_async_step_reports_at_the_next_barrier():
    x = X.to("lazy")
    y = x * 2
    bad = x[torch.tensor([1, 9], device="lazy")]
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 5"):
        bad.sum().item()
    torch.testing.assert_close(y.cpu(), X * 2)  # the failed sync left every value intact
    del bad
    z = x[torch.tensor([9], device="lazy")]
    lazy_torch.mark_step()  # asynchronous: returns before the check is read
    w = x + 1
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        lazy_torch.mark_step()
    del z
    lazy_torch.mark_step()  # reported once: the next barrier is clean
    torch.testing.assert_close(w.cpu(), X + 1)


def test_reading_a_value_of_a_step_that_failed_its_check_raises():
    x = X.to("lazy")
    z = x[torch.tensor([9], device="lazy")]
    total = x.sum()
    lazy_torch.mark_step()  # asynchronous; total is computed by the failing graph
    with pytest.raises(IndexError, match="index 9 is out of bounds"):
        total.item()
    del z
    assert total.item() == pytest.approx(float(X.sum()))  # reported once


DIVISIONS = {
    "floor_divide": lambda a, b: a // b,
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "true": lambda a, b: a / b,
    "remainder": lambda a, b: a % b,
    "fmod": torch.fmod,
    "by_zero_scalar": lambda a, b: a // 0,
    "remainder_zero_scalar": lambda a, b: torch.remainder(a, 0),
}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_integer_division_by_zero_matches_eager(name, dtype):
    fn = DIVISIONS[name]
    a, b = torch.tensor([5, -3, 7], dtype=dtype), torch.tensor([2, 1, 0], dtype=dtype)
    try:
        expected = fn(a, b)
    except RuntimeError as eager:
        assert _lazy_division_error(fn, a, b) == (type(eager), str(eager))
    else:
        torch.testing.assert_close(fn(a.to("lazy"), b.to("lazy")).cpu(), expected, equal_nan=True)
    if not name.endswith("scalar"):  # nonzero divisors: no error, eager's values
        ok = torch.tensor([2, 1, 3], dtype=dtype)
        torch.testing.assert_close(fn(a.to("lazy"), ok.to("lazy")).cpu(), fn(a, ok))


@pytest.mark.parametrize("divisor", [0, False, "tensor", "lazy tensor", "broadcast"])
@pytest.mark.parametrize("name", sorted(DIVISIONS))
def test_integer_division_of_an_empty_tensor_by_zero_is_empty(name, divisor):
    # Eager divides element by element: an empty result divides nothing and raises nothing
    # (differential seeds 100795 and 100920: t // torch.tensor(0), t // False).
    b = {
        "tensor": torch.tensor(0),
        "lazy tensor": torch.tensor(0, device="lazy"),
        "broadcast": torch.tensor([0, 1, 0], device="lazy"),
    }.get(divisor, divisor)
    for shape in [(0, 3), (2, 0, 1), (3, 0, 3)]:
        a = torch.zeros(shape, dtype=torch.int64)
        expected = DIVISIONS[name](a, b.cpu() if isinstance(b, torch.Tensor) else b)
        got = DIVISIONS[name](a.to("lazy"), b)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert got.cpu().tolist() == expected.tolist()


def _lazy_division_error(fn, a, b):
    try:
        fn(a.to("lazy"), b.to("lazy")).cpu()
    except Exception as e:  # drop the traceback that keeps the failed pending tensor alive
        return type(e), str(e)
    return None
