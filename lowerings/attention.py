"""Lowerings: fused scaled dot-product attention (the ops of eager CPU's flash path).

``_scaled_dot_product_flash_attention_for_cpu`` returns the output and the rows' log-sum-exp;
its backward recomputes the probabilities, so no (L, S) intermediate crosses from forward to
backward. Products accumulate in float32 for 16-bit inputs and the softmax runs in
the accumulation dtype; the probabilities meet the values in the values' dtype, as flash
attention kernels do. Rows masked out entirely give zeros (log-sum-exp 0), as in PyTorch.

On CUDA GPUs, 16-bit attention without a mask tensor runs as cuDNN's flash attention
(``jax.nn.dot_product_attention``), as eager CUDA PyTorch runs it: no (L, S) scores reach memory.
Its backward recomputes the forward inside cuDNN, so the backward node reads neither ``out`` nor the
log-sum-exp; the forward node's log-sum-exp comes from the scores only where a graph uses it. These
are the ops' ``platform="cuda"`` kernels, which decline (``NotImplemented``) the calls cuDNN does
not take, leaving them to the generic rules.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from lowerings.linalg import accumulation_dtype
from lowerings.registry import LoweringContext, lowering


def _product(ctx: LoweringContext, a: Any, b: Any, acc: Any) -> Any:
    """``a @ b.T`` over the last two axes, batched over the leading ones."""
    batch = tuple(range(a.ndim - 2))
    dims = (((a.ndim - 1,), (b.ndim - 1,)), (batch, batch))
    return jax.lax.dot_general(a, b, dims, precision=ctx.precision, preferred_element_type=acc)


def _t(x: Any) -> Any:
    return jnp.swapaxes(x, -1, -2)


def _groups(q: Any, kv: Any) -> Any:
    """Grouped-query attention: repeat each key/value head for its group of query heads."""
    heads = q.shape[-3]
    return kv if kv.shape[-3] == heads else jnp.repeat(kv, heads // kv.shape[-3], axis=-3)


def _ungroup(grad: Any, kv: Any) -> Any:
    """Sum a repeated key/value head's gradient back over its group."""
    heads = kv.shape[-3]
    if grad.shape[-3] == heads:
        return grad
    shape = grad.shape[:-3] + (heads, grad.shape[-3] // heads) + grad.shape[-2:]
    return jnp.sum(jnp.reshape(grad, shape), axis=-3)


def _scale(q: Any, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def _scores(ctx, q, k, is_causal, attn_mask, scale) -> Any:
    """Scaled, masked scores in the accumulation dtype."""
    acc = accumulation_dtype(q.dtype)
    scale = _scale(q, scale)
    s = _product(ctx, q, k, acc) * jnp.asarray(scale, acc)
    if attn_mask is not None:
        s = s + attn_mask.astype(acc)
    if is_causal:
        length, source = s.shape[-2:]
        s = jnp.where(jnp.tri(length, source, dtype=bool), s, -jnp.inf)
    return s


def _softmax(s: Any) -> tuple[Any, Any]:
    """Probabilities and log-sum-exp of each row; a fully masked row gives zeros and 0."""
    peak = jnp.max(s, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0)
    e = jnp.exp(s - peak)
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = jnp.where(total > 0, e / total, 0)
    lse = jnp.where(total > 0, peak + jnp.log(total), 0)
    return p, lse[..., 0]


def _heads_swapped(x: Any) -> Any:
    """(B, H, L, D) <-> (B, L, H, D), the layout of ``jax.nn.dot_product_attention``."""
    return jnp.swapaxes(x, 1, 2)


@functools.cache
def _flash_gpus() -> bool:
    """Whether every CUDA GPU has cuDNN's flash attention kernels (Ampere and later)."""
    capabilities = (d.compute_capability.split(".") for d in jax.devices("gpu"))
    return all((int(major), int(minor)) >= (8, 0) for major, minor in capabilities)


def _cudnn(query, key, value, is_causal, attn_mask, scale, grad_out=None) -> Any:
    """cuDNN's attention output, or with ``grad_out`` the gradients of query, key and value;
    NotImplemented where it does not apply: a GPU before Ampere, float32, a mask tensor, a causal
    mask over non-square scores (where cuDNN and PyTorch might align it differently), or a shape
    cuDNN has no kernel for (jax raises NotImplementedError while tracing)."""
    dtypes = {query.dtype.name, key.dtype.name, value.dtype.name}
    if attn_mask is not None or query.ndim != 4 or len(dtypes) > 1:
        return NotImplemented
    if dtypes.pop() not in ("bfloat16", "float16"):
        return NotImplemented
    if is_causal and query.shape[-2] != key.shape[-2]:
        return NotImplemented
    if not _flash_gpus():
        return NotImplemented
    scale = _scale(query, scale)

    def attend(q: Any, k: Any, v: Any) -> Any:
        out = jax.nn.dot_product_attention(
            *map(_heads_swapped, (q, k, v)), scale=scale, is_causal=is_causal,
            implementation="cudnn",
        )  # fmt: skip
        return _heads_swapped(out)

    try:
        if grad_out is None:
            return attend(query, key, value)
        out, pullback = jax.vjp(attend, query, key, value)
        return pullback(grad_out.astype(out.dtype))
    except NotImplementedError:
        return NotImplemented


_FORWARD = "aten._scaled_dot_product_flash_attention_for_cpu.default"
_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


@lowering(_FORWARD)
def _attention(
    ctx, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    if dropout_p:
        # scaled_dot_product_attention sends dropout to the math path, as eager CPU does.
        raise NotImplementedError("the fused attention op has no dropout")
    k, v = _groups(query, key), _groups(query, value)
    s = _scores(ctx, query, k, is_causal, attn_mask, scale)
    p, lse = _softmax(s)
    out = _product(ctx, p.astype(v.dtype), _t(v), s.dtype)
    return out.astype(ctx.dtypes[0]), lse.astype(ctx.dtypes[1])


@lowering(_FORWARD, platform="cuda")
def _attention_cudnn(
    ctx, query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None
):
    if dropout_p:
        return NotImplemented
    out = _cudnn(query, key, value, is_causal, attn_mask, scale)
    if out is NotImplemented:
        return out
    # The log-sum-exp from the scores, which XLA leaves out where the graph does not use it.
    _, lse = _softmax(_scores(ctx, query, _groups(query, key), is_causal, attn_mask, scale))
    return out.astype(ctx.dtypes[0]), lse.astype(ctx.dtypes[1])


@lowering(_BACKWARD)
def _attention_backward(
    ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
    scale=None,
):  # fmt: skip
    k, v = _groups(query, key), _groups(query, value)
    s = _scores(ctx, query, k, is_causal, attn_mask, scale)
    acc = s.dtype
    scale = _scale(query, scale)
    # Recomputed as the forward computed them: more accurate than exp(s - logsumexp).
    p, _ = _softmax(s)
    grad_v = _product(ctx, _t(p.astype(grad_out.dtype)), _t(grad_out), acc)
    grad_p = _product(ctx, grad_out, v, acc)
    # softmax's backward as the math path has it: sum(p * grad_p) is more accurate than the
    # flash kernels' sum(grad_out * out), whose out was rounded to its dtype.
    rows = jnp.sum(p * grad_p, axis=-1, keepdims=True)
    grad_s = (p * (grad_p - rows) * jnp.asarray(scale, acc)).astype(query.dtype)
    grad_q = _product(ctx, grad_s, _t(k), acc)
    grad_k = _product(ctx, _t(grad_s), _t(query), acc)
    grads = (grad_q, _ungroup(grad_k, key), _ungroup(grad_v, value))
    return tuple(g.astype(d) for g, d in zip(grads, ctx.dtypes))


@lowering(_BACKWARD, platform="cuda")
def _attention_backward_cudnn(
    ctx, grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
    scale=None,
):  # fmt: skip
    grads = _cudnn(query, key, value, is_causal, attn_mask, scale, grad_out)
    if grads is NotImplemented:
        return grads
    return tuple(g.astype(d) for g, d in zip(grads, ctx.dtypes))
