"""``scaled_dot_product_attention`` on lazy tensors: one fused node where eager CPU fuses.

PyTorch picks an attention kernel per device type in C++; the Lazy device has none, so the
composite would take the math path: about twenty nodes per call, a float32 upcast of 16-bit
inputs, and an (L, S) probability tensor carried from forward to backward. This module gives
the Lazy backend its own kernel of the composite. It raises eager CPU's errors for the
arguments, asks eager CPU's kernel chooser which path CPU tensors of the same metadata would
take, and takes the same one: the fused flash ops
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward, lowered in
``lowerings/attention.py``; autograd's formula for them is PyTorch's) or the math composite
(dropout, a mask that needs its gradient, 3-d inputs, ...). Both answers are memoized by
the arguments' metadata.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from lazy_core import digest

aten = torch.ops.aten
_FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
_choices: dict[int, bool] = {}


class _Unbacked(Exception):
    """A symbolic size with no example value (a data-dependent one, while Dynamo traces)."""


def _ints(sizes: Any) -> tuple[int, ...]:
    """Sizes or strides as ints. While Dynamo traces with dynamic shapes they are SymInts: the
    choice is made for their example values (as the call that runs will be), adding no guard."""
    out = []
    for v in sizes:
        if type(v) is not int:
            v = getattr(getattr(v, "node", None), "hint", None)
            if v is None:
                raise _Unbacked
        out.append(int(v))
    return tuple(out)


def _describe(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return (_ints(t.shape), _ints(t.stride()), t.dtype, t.requires_grad)
    return t


def _cpu_like(t: Any, fill: bool = False) -> Any:
    """A CPU tensor with ``t``'s metadata (uninitialized, or zeros), or ``t`` if not a tensor."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(_ints(t.shape), _ints(t.stride()), dtype=t.dtype)
    if fill:
        out.zero_()
    return out.requires_grad_(t.requires_grad)


def _validate(args: list, flags: dict) -> None:
    """Raise what eager CPU raises for these arguments. CPU FakeTensors run the composite as
    CPU does (its kernel choice included) without computing; when they fail, eager CPU itself
    runs on zeros, so the error is eager's exact one (and none if eager has none)."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level, logger.level = logger.level, logging.CRITICAL  # it logs each failing meta kernel
    try:
        with FakeTensorMode():
            aten.scaled_dot_product_attention(*(_cpu_like(a) for a in args), **flags)
    except Exception:  # noqa: BLE001 (eager decides)
        aten.scaled_dot_product_attention(*(_cpu_like(a, fill=True) for a in args), **flags)
    finally:
        logger.level = level


def _fused(args: tuple, dropout_p: float, is_causal: bool, scale: Any, enable_gqa: bool) -> bool:
    """Whether eager CPU would run these arguments on its fused kernel (after raising its errors
    for them). While Dynamo traces on FakeTensors, the question goes to real CPU tensors of
    their example sizes; a size without one takes the composite's math path."""
    try:
        with unset_fake_temporarily():
            return _fused_for(args, dropout_p, is_causal, scale, enable_gqa)
    except _Unbacked:
        return False


def _fused_for(args: tuple, dropout_p: float, is_causal: bool, scale: Any, gqa: bool) -> bool:
    # Type-exact (lazy_core/digest.py): a scale of 1 and of 1.0 are different calls.
    key = digest((
        tuple(_describe(a) for a in args),
        dropout_p,
        is_causal,
        scale,
        gqa,
        torch.is_grad_enabled(),
        torch._C._get_flash_sdp_enabled(),
        torch._C._get_math_sdp_enabled(),
    ))  # fmt: skip
    fused = _choices.get(key)
    if fused is None:
        flags = {
            "dropout_p": dropout_p,
            "is_causal": is_causal,
            "scale": scale,
            "enable_gqa": gqa,
        }
        _validate(list(args), flags)
        choice = aten._fused_sdp_choice(*(_cpu_like(a) for a in args), **flags)
        fused = _choices[key] = choice == _FLASH
    return fused


def _boolean_to_additive(mask: Any, dtype: torch.dtype) -> Any:
    # As the composite does before its fused kernels: True keeps a position, False masks it.
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask, zero, torch.full((), float("-inf"), dtype=dtype, device=mask.device))


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    fused = _fused((query, key, value, attn_mask), dropout_p, is_causal, scale, enable_gqa)
    mask = _boolean_to_additive(attn_mask, query.dtype)  # as the composite does for both paths
    if not fused:
        return aten._scaled_dot_product_attention_math(
            query, key, value, mask, dropout_p, is_causal, None,
            scale=scale, enable_gqa=enable_gqa,
        )[0]  # fmt: skip
    return aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale
    )[0]


# AutogradLazy is where the composite would decompose. Inference mode skips the autograd keys,
# and the Python key then decomposes composites itself: there attention takes the math path.
_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (a kernel for an existing aten op)
_lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradLazy")
