"""Data-dependent ops against eager CPU: values, dtypes, shapes, errors; one small sync, no fallback."""

import pytest
import torch

import lazy_torch

NAN = float("nan")


def _run(fn, *cpu_args, **kwargs):
    """``fn`` on eager CPU and on lazy copies of the tensor arguments, with the new counters."""
    expected = fn(*cpu_args, **kwargs)
    lazy_args = [a.to("lazy") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    before = lazy_torch.metrics.counters()
    lazy_kwargs = {k: v.to("lazy") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    got = fn(*lazy_args, **lazy_kwargs)
    got_cpu = _cpu(got)
    after = lazy_torch.metrics.counters()
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not [k for k in new if k.startswith("fallback::")], new
    return expected, got_cpu, new


def _cpu(x):
    if isinstance(x, (tuple, list)):
        return [_cpu(v) for v in x]
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _same(got, expected):
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)
        return
    if isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape, (got, expected)
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)
    else:
        assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "x",
    [
        torch.tensor([[0.0, 1.5, 0.0], [-2.0, 0.0, NAN]]),
        torch.zeros(3, 4, dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.tensor(3.0),
        torch.tensor(0),
        torch.zeros(0, 3),
    ],
)
def test_nonzero_and_argwhere(x):
    for fn in (torch.nonzero, torch.argwhere, lambda t: torch.nonzero(t, as_tuple=True)):
        expected, got, new = _run(fn, x)
        _same(got, expected)
    assert new.get("syncs::nonzero") == 1


def test_masked_select_broadcasts_and_has_gradients():
    x = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([True, False, True, True])
    expected = torch.masked_select(x, mask)
    lx = x.detach().to("lazy").requires_grad_()
    got = torch.masked_select(lx, mask.to("lazy"))
    _same(got.cpu(), expected.detach())
    (g,) = torch.autograd.grad(expected, x, torch.arange(9.0))
    (lg,) = torch.autograd.grad(got, lx, torch.arange(9.0).to("lazy"))
    _same(lg.cpu(), g)
    with pytest.raises(RuntimeError, match="expected BoolTensor for mask"):
        torch.masked_select(lx, torch.ones(4, dtype=torch.int64, device="lazy"))


@pytest.mark.parametrize(
    "weights", [None, torch.tensor([0.5, 1.0, 2.0, 4.0]), torch.tensor([1, 2, 3, 4])]
)
@pytest.mark.parametrize("minlength", [0, 9])
def test_bincount(weights, minlength):
    x = torch.tensor([2, 0, 2, 5])
    args = (x,) if weights is None else (x, weights)
    expected, got, _ = _run(torch.bincount, *args, minlength=minlength)
    _same(got, expected)
    expected, got, _ = _run(torch.bincount, torch.zeros(0, dtype=torch.int64), minlength=minlength)
    _same(got, expected)


def test_bincount_negative_input_gives_eager_error():
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1]))
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([1, -1], device="lazy"))


def test_repeat_interleave():
    repeats = torch.tensor([2, 0, 3, 1])
    expected, got, _ = _run(torch.repeat_interleave, repeats)
    _same(got, expected)
    x = torch.arange(8.0).reshape(4, 2)
    for kwargs in ({"dim": 0}, {"dim": 0, "output_size": 6}):
        expected, got, new = _run(torch.repeat_interleave, x, repeats, **kwargs)
        _same(got, expected)
    assert "syncs::repeat_interleave" not in new  # output_size given: nothing to sync
    with pytest.raises(RuntimeError, match="repeats can not be negative"):
        torch.repeat_interleave(torch.tensor([1, -2], device="lazy"))


@pytest.mark.parametrize("sorted_", [True, False])
@pytest.mark.parametrize(
    "x",
    [
        torch.tensor([3, 1, 2, 3, 5, 1, 9, 0, 2]),
        torch.tensor([[NAN, 1.0, -0.0], [0.0, NAN, 1.0]]),
        torch.tensor([True, False, True]),
        torch.zeros(0),
    ],
)
def test_unique_flat(x, sorted_):
    expected, got, _ = _run(
        torch.unique, x, sorted=sorted_, return_inverse=True, return_counts=True
    )
    _same(got, expected)
    expected, got, _ = _run(torch.unique, x)
    _same(got, expected)


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique_dim_and_consecutive(dim):
    x = torch.tensor([[1, 2, 1, 1], [1, 2, 0, 0], [1, 2, 1, 1], [0, 5, 0, 0]])
    kwargs = {"return_inverse": True, "return_counts": True, "dim": dim}
    expected, got, _ = _run(torch.unique_consecutive, x, **kwargs)
    _same(got, expected)
    if dim is not None:
        expected, got, _ = _run(torch.unique, x, **kwargs)
        _same(got, expected)


def test_equal_and_allclose_return_python_bools():
    a = torch.tensor([1.0, NAN, 3.0])
    for b in (a.clone(), torch.tensor([1.0, 2.0, 3.0]), torch.ones(2)):
        expected, got, _ = _run(torch.equal, a, b)
        _same(got, expected)
    expected, got, _ = _run(torch.equal, torch.ones(2), torch.ones(2, dtype=torch.int64))
    _same(got, expected)
    c = a + 1e-7
    for kwargs in ({}, {"equal_nan": True}, {"atol": 0.0, "rtol": 0.0, "equal_nan": True}):
        expected, got, new = _run(torch.allclose, a, c, **kwargs)
        _same(got, expected)
    assert new.get("syncs::allclose") == 1
    with pytest.raises(RuntimeError, match="Float did not match Long"):
        torch.allclose(
            torch.ones(2, device="lazy"), torch.ones(2, dtype=torch.int64, device="lazy")
        )


def test_linalg_errors_are_eagers_and_values_survive():
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    with pytest.raises(torch.linalg.LinAlgError) as eager:
        torch.linalg.inv(singular)
    x = singular.to("lazy")
    with pytest.raises(torch.linalg.LinAlgError) as lazy:
        torch.linalg.inv(x)
    assert str(lazy.value) == str(eager.value)
    with pytest.raises(torch.linalg.LinAlgError, match="not positive-definite"):
        torch.linalg.cholesky(x)
    _same(x.cpu(), singular)
    good = torch.tensor([[2.0, 1.0], [1.0, 3.0]])
    expected, got, new = _run(torch.linalg.inv, good)
    torch.testing.assert_close(got, expected)
    assert new.get("syncs::linalg_check") == 1


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"range": (0.0, 2.0)}, {"density": True}, {"weight": torch.arange(7.0)}],
)
def test_histogram(kwargs):
    x = torch.tensor([0.5, -1.0, 2.0, 2.0, 3.5, 0.0, 1.25])
    expected, got, new = _run(torch.histogram, x, 4, **kwargs)
    torch.testing.assert_close(tuple(got), tuple(expected))
    assert new.get("syncs::histogram", 0) == (0 if "range" in kwargs else 1)
    if "range" not in kwargs:
        edges = torch.tensor([-1.0, 0.0, 2.0, 3.5])
        expected, got, new = _run(torch.histogram, x, edges, **kwargs)
        torch.testing.assert_close(tuple(got), tuple(expected))
        assert "syncs::histogram" not in new


def test_histogram_edge_cases_match_eager():
    expected, got, _ = _run(torch.histogram, torch.ones(3), 4)  # one value: edges at +-0.5
    torch.testing.assert_close(tuple(got), tuple(expected))
    for bad in ([0.0, NAN], [0.0, float("inf"), -2.0]):
        with pytest.raises(RuntimeError) as eager:
            torch.histogram(torch.tensor(bad), 4)
        with pytest.raises(RuntimeError) as lazy:
            torch.histogram(torch.tensor(bad).to("lazy"), 4)
        assert str(lazy.value) == str(eager.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bins": [2, 3]},
        {"bins": [2, 3], "density": True},
        {"bins": [1, 2], "range": [0.0, 4.0, 0.0, 5.0], "weight": torch.arange(4.0)},
    ],
)
def test_histogramdd(kwargs):
    x = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 9.0], [4.0, 1.0]])
    expected, got, _ = _run(torch.histogramdd, x, **kwargs)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(tuple(got[1]), tuple(expected[1]))
