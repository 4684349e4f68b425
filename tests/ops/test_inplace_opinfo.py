"""PyTorch's OpInfo samples for in-place variants, on device='lazy' against eager CPU.

Every in-place variant of ``op_db`` runs each float32 (and int64 where supported) sample; the
result must match eager in value, dtype and shape, and the op must return its input object.
"""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazy_torch

# Ops whose in-place form cannot be compared value by value, each with its reason.
SKIP = {
    "resize_": "changes the tensor's sizes in place; a wrapper tensor's sizes are fixed",
    "resize_as_": "changes the tensor's sizes in place; a wrapper tensor's sizes are fixed",
    "squeeze": "squeeze_ changes sizes in place (metadata mutation)",
    "squeeze.multiple": "squeeze_ changes sizes in place (metadata mutation)",
    "unsqueeze": "unsqueeze_ changes sizes in place (metadata mutation)",
    "transpose": "transpose_ changes strides in place (metadata mutation)",
    "t": "t_ changes strides in place (metadata mutation)",
    "as_strided": "as_strided_ changes sizes and strides in place (metadata mutation)",
    "as_strided.partial_views": "as_strided_ changes sizes and strides in place",
}
_SEEDED = "OpInfo's wrapper_set_seed calls torch._lazy (PyTorch's own LTC) on device 'lazy'"
SKIP.update(
    {
        name: _SEEDED
        for name in (
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.alpha_dropout",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.feature_alpha_dropout.without_train",
            "nn.functional.rrelu",
        )
    }
)
# Random in-place ops: checked by shape and dtype only (values come from the device RNG).
RANDOM = {"cauchy", "exponential", "geometric", "log_normal", "normal.in_place", "uniform"}


def _name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


INPLACE_OPS = [op for op in op_db if op.inplace_variant is not None]


def _to_lazy(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("lazy")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_lazy(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_lazy(v) for k, v in x.items()}
    return x


def _samples(op, dtype):
    try:
        return list(op.sample_inputs("cpu", dtype, requires_grad=False))
    except Exception:
        return []


@pytest.mark.slow
@pytest.mark.parametrize("op", INPLACE_OPS, ids=_name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
def test_inplace_variant_matches_eager(op, dtype):
    if _name(op) in SKIP:
        pytest.skip(SKIP[_name(op)])
    if dtype not in op.supported_dtypes("cpu"):
        pytest.skip(f"{dtype} not supported by {_name(op)} in eager")
    checked = 0
    for sample in _samples(op, dtype):
        eager_input = sample.input.clone()
        try:
            expected = op.inplace_variant(eager_input, *sample.args, **sample.kwargs)
        except Exception as eager_error:  # eager rejects it: the lazy device must too
            with pytest.raises(type(eager_error)):
                lazy_input = _to_lazy(sample.input)
                op.inplace_variant(lazy_input, *_to_lazy(sample.args), **_to_lazy(sample.kwargs))
                lazy_torch.mark_step()
            continue
        if expected.shape != sample.input.shape:
            continue  # eager resized its input in place; a wrapper tensor's sizes are fixed
        lazy_input = _to_lazy(sample.input)
        got = op.inplace_variant(lazy_input, *_to_lazy(sample.args), **_to_lazy(sample.kwargs))
        assert got is lazy_input
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if _name(op) not in RANDOM:
            torch.testing.assert_close(got.cpu(), expected, equal_nan=True, atol=1e-5, rtol=1e-5)
        checked += 1
    if checked == 0:
        pytest.skip("no sample eager accepts")
