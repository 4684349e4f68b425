"""PyTorch's OpInfo samples with ``out=`` tensors that eager resizes, on device='lazy' against eager.

For every op of ``op_db`` that supports ``out=``, the first float32 sample runs with out tensors of
no elements (``torch.empty(0)``, resized silently) and of the wrong shape (resized with a
warning), both of the dtypes eager's result has. Each out tensor must end as eager's does (shape,
strides, dtype, values), the op must return the out tensor itself, and the warnings must match.
"""

import os
import warnings

import pytest
import torch
from torch.utils._pytree import tree_flatten

import lazy_torch
from tests.ops.harness import OPS, RANDOM_OPS, SKIP, op_name, to_lazy

OUT_OPS = [op for op in OPS.values() if op.supports_out]
# Ops whose out= run is not compared, each with its reason.
OUT_SKIP = {
    "histogramdd": "its OpInfo's out= is a tuple of a tensor and a list of edges",
}
# Values that eager itself does not fix (eigenvector signs): shapes, strides and dtypes only.
UNCOMPARED_VALUES = {"linalg.eigh", "linalg.eigvalsh"}


def _outs(expected, fill, device):
    outs = [fill(t, device) for t in tree_flatten(expected)[0]]
    if isinstance(expected, torch.Tensor):
        return outs[0]
    return tuple(outs)


def _call(op, sample, out):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = op.op(sample[0], *sample[1], out=out, **sample[2])
    return result, sorted(str(w.message) for w in caught if "out" in str(w.message))


def _meta(t):
    return tuple(t.shape), t.stride(), t.dtype


FILLS = {
    "empty": lambda t, device: torch.empty(0, dtype=t.dtype, device=device),
    "wrong_shape": lambda t, device: torch.empty(7, dtype=t.dtype, device=device),
}


@pytest.mark.slow
# Opt-in (LAZY_OUT_SWEEP=1): run serially it passes (692 tests, 103 s), but at the end of the
# whole suite in one xdist worker XLA's CPU compiler crashed (segfault or abort) on one of its
# graphs three times out of three, and pytest-xdist then hangs on the crashed worker. Not yet
# understood; tests/lazy_torch/test_resize.py covers out= resizing in CI meanwhile.
@pytest.mark.skipif(
    os.environ.get("LAZY_OUT_SWEEP") != "1", reason="set LAZY_OUT_SWEEP=1 (see the comment)"
)
@pytest.mark.parametrize("op", OUT_OPS, ids=op_name)
@pytest.mark.parametrize("fill", list(FILLS), ids=str)
def test_out_variant_resizes_as_eager(op, fill):
    name = op_name(op)
    if name in SKIP or name in OUT_SKIP:
        pytest.skip(SKIP.get(name) or OUT_SKIP[name])
    if torch.float32 not in op.supported_dtypes("cpu"):
        pytest.skip("float32 not supported in eager")
    samples = list(op.sample_inputs("cpu", torch.float32))[:1]
    if not samples:
        pytest.skip("no sample")
    sample = samples[0]
    eager_sample = (sample.input, sample.args, sample.kwargs)
    try:
        expected = op.op(*eager_sample[:1], *eager_sample[1], **eager_sample[2])
    except Exception:  # noqa: BLE001 (eager rejects the sample itself)
        pytest.skip("eager rejects the sample")
    if not all(isinstance(t, torch.Tensor) for t in tree_flatten(expected)[0]):
        pytest.skip("not a tensor result")
    eager_out = _outs(expected, FILLS[fill], "cpu")
    try:
        eager_result, eager_warnings = _call(op, eager_sample, eager_out)
    except Exception as eager_error:  # noqa: BLE001 (eager refuses these out tensors: so must lazy)
        with pytest.raises(type(eager_error)):
            lazy_sample = (to_lazy(sample.input), to_lazy(sample.args), to_lazy(sample.kwargs))
            _call(op, lazy_sample, _outs(expected, FILLS[fill], "lazy"))
            lazy_torch.mark_step()
        return
    lazy_out = _outs(expected, FILLS[fill], "lazy")
    lazy_sample = (to_lazy(sample.input), to_lazy(sample.args), to_lazy(sample.kwargs))
    lazy_result, lazy_warnings = _call(op, lazy_sample, lazy_out)
    assert lazy_warnings == eager_warnings
    if isinstance(eager_out, torch.Tensor):
        assert (lazy_result is lazy_out) == (eager_result is eager_out)
    eager_leaves = tree_flatten(eager_out)[0]
    lazy_leaves = tree_flatten(lazy_out)[0]
    assert [_meta(t) for t in lazy_leaves] == [_meta(t) for t in eager_leaves]
    if name not in RANDOM_OPS and name not in UNCOMPARED_VALUES:
        for got, want in zip(lazy_leaves, eager_leaves):
            torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=1e-4, rtol=1.3e-4)
    lazy_torch.mark_step()
