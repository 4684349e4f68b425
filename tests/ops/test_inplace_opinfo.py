"""PyTorch's OpInfo samples for in-place variants, on device='lazy' against eager CPU.

Every in-place variant of ``op_db`` runs each float32 (and int64 where supported) sample; the
result must match eager in value, dtype and shape, and the op must return its input object.
"""

import pytest
import torch

import lazy_torch
from tests.ops.harness import OPS, RANDOM_OPS, SKIP, op_name, to_lazy

INPLACE_OPS = [op for op in OPS.values() if op.inplace_variant is not None]


def _samples(op, dtype):
    try:
        return list(op.sample_inputs("cpu", dtype, requires_grad=False))
    except Exception:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("op", INPLACE_OPS, ids=op_name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_inplace_variant_matches_eager(op, dtype):
    if op_name(op) in SKIP:
        pytest.skip(SKIP[op_name(op)])
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{dtype} not supported by {op_name(op)} in eager")
    checked = 0
    for sample in _samples(op, dtype):
        eager_input = sample.input.clone()
        try:
            expected = op.inplace_variant(eager_input, *sample.args, **sample.kwargs)
        except Exception as eager_error:  # eager rejects it: the lazy device must too
            with pytest.raises(type(eager_error)):
                lazy_input = to_lazy(sample.input)
                op.inplace_variant(lazy_input, *to_lazy(sample.args), **to_lazy(sample.kwargs))
                lazy_torch.mark_step()
            continue
        lazy_input = to_lazy(sample.input)
        got = op.inplace_variant(lazy_input, *to_lazy(sample.args), **to_lazy(sample.kwargs))
        assert got is lazy_input
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if op_name(op) not in RANDOM_OPS:
            torch.testing.assert_close(got.cpu(), expected, equal_nan=True, atol=1e-5, rtol=1e-5)
        checked += 1
    if checked == 0:
        pytest.skip("no sample eager accepts")
