"""scaled_dot_product_attention: one fused node where eager CPU fuses, the math path elsewhere,
eager's values, gradients, dtypes and errors either way."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import lazy_torch
import runtime

FUSED = "aten._scaled_dot_product_flash_attention_for_cpu.default"
FUSED_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


def _qkv(q_shape, kv_shape=None, v_dim=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_shape = kv_shape or q_shape
    v_shape = kv_shape[:-1] + (v_dim or kv_shape[-1],)
    return [torch.randn(s, generator=g).to(dtype) for s in (q_shape, kv_shape, v_shape)]


def _mask_with_a_dead_row(length: int, source: int) -> torch.Tensor:
    mask = torch.rand(length, source, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True
    mask[2] = False  # a row that attends to nothing gives zeros, not NaN
    return mask


CASES = {
    "plain": (((2, 4, 8, 16),), {}),
    "causal": (((2, 4, 8, 16),), {"is_causal": True}),
    "bool_mask": (((2, 4, 8, 16),), {"attn_mask": _mask_with_a_dead_row(8, 8)}),
    "float_mask": (((2, 4, 8, 16),), {"attn_mask": torch.randn(2, 1, 8, 8)}),
    "mask_and_causal": (((2, 4, 8, 16),), {"attn_mask": torch.randn(8, 8), "is_causal": True}),
    "scale": (((2, 4, 8, 16),), {"scale": 0.3}),
    "grouped_query": (((2, 4, 8, 16), (2, 2, 8, 16)), {"enable_gqa": True}),
    "cross_lengths": (((2, 4, 8, 16), (2, 4, 5, 16), 32), {"is_causal": True}),
    "five_dims": (((2, 3, 2, 8, 16),), {}),
    "three_dims": (((4, 8, 16),), {}),  # eager CPU takes the math path here
}


def _run(device, tensors, kwargs, grad_out):
    leaves = [t.detach().to(device).requires_grad_() for t in tensors]
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = F.scaled_dot_product_attention(*leaves, **kwargs)
    out.backward(grad_out.to(device))
    return out, [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_eager(case, dtype):
    shapes, kwargs = CASES[case]
    tensors = _qkv(*shapes, dtype=dtype)
    kwargs = {
        k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in kwargs.items()
    }
    out_shape = tensors[0].shape[:-1] + tensors[2].shape[-1:]
    grad_out = torch.randn(out_shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    want, want_grads = _run("cpu", tensors, kwargs, grad_out)
    got, got_grads = _run("lazy", tensors, kwargs, grad_out)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **tol)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w, **tol)
    assert not [k for k in lazy_torch.metrics.counters() if k.startswith("fallback::")]


def test_fused_where_eager_cpu_fuses():
    q, k, v = (t.to("lazy").requires_grad_() for t in _qkv((2, 4, 8, 16)))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    forward = lazy_torch.debug.ir_text(out)
    assert FUSED in forward and "softmax" not in forward
    (grad_q,) = torch.autograd.grad(out.sum(), q)
    backward = lazy_torch.debug.ir_text(grad_q)
    assert FUSED_BACKWARD in backward and "softmax" not in backward


@pytest.mark.parametrize(
    "why",
    ["dropout", "mask_needs_grad", "math_backend_chosen", "three_dims"],
)
def test_math_path_where_eager_cpu_takes_it(why):
    shape = (4, 8, 16) if why == "three_dims" else (2, 4, 8, 16)
    q, k, v = (t.to("lazy") for t in _qkv(shape))
    kwargs = {}
    if why == "dropout":
        kwargs["dropout_p"] = 0.5
    if why == "mask_needs_grad":
        kwargs["attn_mask"] = torch.randn(8, 8, device="lazy", requires_grad=True)
    if why == "math_backend_chosen":
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(q, k, v)
    else:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    text = lazy_torch.debug.ir_text(out)
    assert FUSED not in text and "softmax" in text
    assert out.shape == shape


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
def test_boolean_mask_masks_on_both_paths(backend):
    """A boolean mask keeps True positions and masks False ones (a fully masked row too) on the
    math path as on the fused one: the math kernel takes an additive mask (it added 0 and 1)."""
    q, k, v = _qkv((1, 2, 16, 8))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    mask[3] = False
    with sdpa_kernel([backend, SDPBackend.MATH]):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        q_, k_, v_, m_ = (t.to("lazy") for t in (q, k, v, mask))
        got = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m_).cpu()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, equal_nan=True)

def test_no_grad_fuses_and_inference_mode_still_matches_eager():
    # Inference mode skips the autograd keys, where the Lazy kernel sits, and the Python key
    # decomposes the composite: attention takes the math path there, with eager's values.
    tensors = _qkv((2, 4, 8, 16))
    lazy = [t.to("lazy") for t in tensors]
    with torch.no_grad():
        out = F.scaled_dot_product_attention(*lazy)
    assert FUSED in lazy_torch.debug.ir_text(out)
    with torch.inference_mode():
        inferred = F.scaled_dot_product_attention(*lazy)
    want = F.scaled_dot_product_attention(*tensors)
    torch.testing.assert_close(out.cpu(), want)
    torch.testing.assert_close(inferred.cpu(), want)


@pytest.mark.parametrize(
    "shapes, dtypes, kwargs",
    [
        (((2, 4, 8, 16),) * 3, (torch.float32, torch.float64, torch.float32), {}),
        (
            ((2, 4, 8, 16),) * 3,
            (torch.float32,) * 3,
            {"attn_mask": torch.zeros(8, 8, dtype=torch.int64)},
        ),
        (((2, 4, 8, 16), (2, 4, 8, 12), (2, 4, 8, 16)), (torch.float32,) * 3, {}),
        (((2, 4, 8, 16), (2, 3, 8, 16), (2, 3, 8, 16)), (torch.float32,) * 3, {"enable_gqa": True}),
    ],
    ids=["dtype_mismatch", "integer_mask", "head_dim_mismatch", "heads_not_divisible"],
)
def test_bad_arguments_raise_eagers_error(shapes, dtypes, kwargs):
    tensors = [torch.randn(s, dtype=d) for s, d in zip(shapes, dtypes)]
    with pytest.raises(Exception) as eager:
        F.scaled_dot_product_attention(*tensors, **kwargs)
    lazy_kwargs = {k: v.to("lazy") for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    lazy_kwargs.update({k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)})
    with pytest.raises(type(eager.value)) as lazy:
        F.scaled_dot_product_attention(*(t.to("lazy") for t in tensors), **lazy_kwargs)
    assert str(lazy.value) == str(eager.value)


CUDA = runtime.platform_of(0) == "cuda"


@pytest.mark.parametrize(
    "case, dtype, cudnn",
    [
        ("causal", torch.bfloat16, True),
        ("grouped_query", torch.float16, True),
        ("causal", torch.float32, False),  # cuDNN's fused attention is 16-bit only
        ("float_mask", torch.bfloat16, False),
        ("cross_lengths", torch.bfloat16, False),  # causal over non-square scores
    ],
)
def test_cudnn_attention_on_cuda_only_where_it_applies(case, dtype, cudnn):
    shapes, kwargs = CASES[case]
    kwargs = {
        k: v.to("lazy", dtype) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
    }
    q, k, v = (t.to("lazy").requires_grad_() for t in _qkv(*shapes, dtype=dtype))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    text = lazy_torch.debug.stablehlo_text(out, *grads)
    assert ("cudnn" in text) == (cudnn and CUDA)
