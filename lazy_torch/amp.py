"""Mixed precision on device 'lazy': ``lazy_torch.amp.autocast``, PyTorch's CUDA autocast rules.

PyTorch autocasts in a dispatch key above autograd, picked from a tensor's backend, and the Lazy
backend has none: ``torch.autocast('lazy')`` raises. So lazy autocast borrows the key of XLA, the
compiler this backend targets: while it is on, this thread's dispatch includes ``AutocastXLA``
(nothing else uses that key unless torch_xla is loaded, and the two backends do not share a
process). Kernels registered there handle exactly the ops that CUDA autocast handles (the
dispatcher lists them: every op with an ``AutocastCUDA`` kernel), each by CUDA's policy, and cast
only lazy operands; every other op falls through the key at no cost. The kernels of the two
casting policies, nearly every call, run in C (``lazy_core/csrc/amp.cpp``); the rest in Python.
As in CUDA autocast, a handled op runs with the key excluded, so the ops it decomposes into are
not cast again, while the parts of an unlisted composite (``F.multi_head_attention_forward``'s
linears) are.

The casts are ordinary differentiable ``Tensor.to`` calls seen by autograd, so gradients flow back
to the float32 parameters in float32.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

import runtime
from lazy_torch import linear
from lazy_torch.tensor import LazyTensor, _native

if TYPE_CHECKING:
    from typing_extensions import Self

# CUDA autocast's policies, by op name (aten packet); the ops themselves are the dispatcher's.
_LOWER, _F32, _F32_DTYPE, _WIDEST, _BANNED = "lower", "fp32", "fp32_dtype", "promote", "banned"
_POLICIES = {
    # Run in the autocast dtype: matmuls, convolutions, attention, recurrent cells.
    _LOWER: "_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d "
    "conv_transpose3d convolution cudnn_convolution cudnn_convolution_transpose prelu addmm addmv "
    "addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul "
    "linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell "
    "rnn_relu_cell _scaled_dot_product_flash_attention scaled_dot_product_attention "
    "_cudnn_rnn",  # CUDA builds of torch have it; the CPU wheel does not
    # Run in float32: ops whose range or accumulation suffers in 16 bits (``norm`` appends
    # dtype=float32 in CUDA's version, which computes the same as casting its input).
    _F32: "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow "
    "softplus layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm "
    "cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss "
    "multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss "
    "binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp rms_norm norm "
    "upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact1d "
    "_upsample_nearest_exact2d _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d "
    "_upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d _upsample_bicubic2d_aa",
    # Run in float32 by asking for a float32 result (``dtype=torch.float32``) unless a dtype is
    # given, when the first tensor is one autocast may cast.
    _F32_DTYPE: "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum",
    # Run in the widest floating type among the inputs.
    _WIDEST: "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot "
    "scatter_add",
    # Raise: the result of a sigmoid is unsafe to autocast into this loss.
    _BANNED: "binary_cross_entropy",
}
_POLICY = {name: policy for policy, names in _POLICIES.items() for name in names.split()}

_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)

_KEY_NAME = "AutocastXLA"
_KEY = torch._C._parse_dispatch_key(_KEY_NAME)
_KEYSET = torch._C.DispatchKeySet(_KEY)
_CASTABLE = (torch.float32, torch.bfloat16, torch.float16)  # float64 is left alone, as in PyTorch


def cuda_autocast_ops() -> list[str]:
    """Every op overload CUDA autocast handles (``aten::mm``, ``aten::pow.Tensor_Scalar``, ...)."""
    return sorted(
        name
        for name in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA")
    )


def policy_of(op_name: str) -> str | None:
    """The policy of an op overload name such as ``aten::pow.Tensor_Scalar``."""
    return _POLICY.get(op_name.removeprefix("aten::").split(".")[0])


# ----------------------------------------------------------------------------------------------
# Autocast state: a thread-local stack of (enabled, dtype, cache_enabled), innermost last.


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[bool, torch.dtype, bool]] = []
        # Casts of float32 leaf parameters, reused while the outermost autocast is open (a weight
        # used twice is cast once). Keyed by identity, version and grad mode; holds the source.
        self.cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        # This thread's include and exclude flags of the key before the outermost autocast.
        self.saved: tuple[bool, bool] | None = None


_state = _State()


def is_autocast_enabled() -> bool:
    """Whether lazy autocast is on in this thread."""
    return bool(_state.stack) and _state.stack[-1][0]


def get_autocast_dtype() -> torch.dtype:
    """The lower-precision dtype of the innermost lazy autocast (bfloat16 outside one)."""
    return _state.stack[-1][1] if _state.stack else torch.bfloat16


def _set_key(included: bool, excluded: bool) -> None:
    torch._C._dispatch_tls_set_dispatch_key_included(_KEY, included)
    torch._C._dispatch_tls_set_dispatch_key_excluded(_KEY, excluded)


class autocast(contextlib.ContextDecorator):
    """``torch.autocast`` for lazy tensors: a context manager, also usable as a decorator.

    Inside it, matmuls, linear layers, convolutions and attention on lazy tensors run in ``dtype``;
    softmax, normalizations, losses, reductions and transcendental functions run in float32;
    ``addcmul``-like ops run in the widest input type (CUDA autocast's lists, op by op).
    Parameters stay float32 and get float32 gradients. ``autocast(enabled=False)`` inside turns
    it off; tensors on other devices are never touched.

    >>> import torch, lazy_torch
    >>> x = torch.randn(4, 8, device="lazy")
    >>> with lazy_torch.amp.autocast(dtype=torch.bfloat16):
    ...     y = x @ x.T
    ...     p = y.softmax(-1)
    >>> y.dtype, p.dtype
    (torch.bfloat16, torch.float32)
    """

    def __init__(
        self, dtype: torch.dtype = torch.bfloat16, enabled: bool = True, cache_enabled: bool = True
    ) -> None:
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"lazy autocast supports bfloat16 and float16, got {dtype}")
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled

    def __enter__(self) -> Self:
        _register()
        if not _state.stack:
            _state.saved = (
                torch._C._dispatch_tls_is_dispatch_key_included(_KEY),
                torch._C._dispatch_tls_is_dispatch_key_excluded(_KEY),
            )
        _state.stack.append((self.enabled, self.dtype, self.cache_enabled))
        _set_key(self.enabled, not self.enabled)
        return self

    def __exit__(self, *exc: object) -> None:
        _state.stack.pop()
        if _state.stack:
            enabled = _state.stack[-1][0]
            _set_key(enabled, not enabled)
            return
        _state.cache.clear()
        _set_key(*_state.saved)


# ----------------------------------------------------------------------------------------------
# The kernels: one per handled op overload, registered at the first autocast.

_libraries: list[torch.library.Library] = []


def _register() -> None:
    if _libraries:
        return
    try:
        fallthrough = torch.library.Library("_", "IMPL")
        fallthrough.fallback(torch.library.fallthrough_kernel, _KEY_NAME)
        kernels = torch.library.Library("aten", "IMPL")
        for name in cuda_autocast_ops():
            policy = policy_of(name)
            if policy is not None:
                kernel = _kernel(_op(name), policy)
                if name in _FUSED:
                    kernel = _fused_kernel(kernel, _FUSED[name])
                kernels.impl(name.removeprefix("aten::"), kernel, _KEY_NAME)
    except RuntimeError as e:
        raise RuntimeError(
            f"lazy_torch.amp.autocast needs the {_KEY_NAME} dispatch key, which another library "
            f"(torch_xla?) has taken: {e}"
        ) from e
    _libraries[:] = [fallthrough, kernels]


# Ops whose call under autocast may be recorded as one node with its backward (linear.py).
_FUSED = {"aten::addmm": linear.addmm, "aten::linear": linear.linear}


def _fused_kernel(kernel: Callable, fused: Callable) -> Callable:
    """``kernel``, with the calls ``fused`` takes: every tensor one autocast may cast
    (``fused`` returns NotImplemented for the others)."""
    exclude = torch._C._ExcludeDispatchKeyGuard

    def fused_kernel(*args: Any, **kwargs: Any) -> Any:
        stack = _state.stack  # empty in a thread the autograd engine started
        if (
            stack
            and runtime.config.FUSE_LINEAR
            and all(_castable(a) for a in _flat(args, kwargs) if isinstance(a, torch.Tensor))
        ):
            with exclude(_KEYSET):
                out = fused(stack[-1][1], *args, **kwargs)
            if out is not NotImplemented:
                return out
        return kernel(*args, **kwargs)

    return fused_kernel


def _op(name: str) -> Any:
    """The OpOverload of an overload name such as ``aten::pow.Tensor_Scalar``."""
    base, _, overload = name.removeprefix("aten::").partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _kernel(op: Any, policy: str) -> Callable:
    """The kernel of ``op`` under ``policy``: in C for the casting policies (lower and float32,
    nearly every call: lazy_torch/csrc/amp.cpp), else in Python."""
    call = op._op  # the C++ operator itself: no OpOverload.__call__ frame
    if policy in (_LOWER, _F32):
        return _native.CastKernel(call, policy == _LOWER, _shared())
    if policy == _F32_DTYPE:
        adjust = functools.partial(_set_float32, slot=_dtype_slot(op))
    else:
        adjust = _ADJUST[policy]
    exclude = torch._C._ExcludeDispatchKeyGuard

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with exclude(_KEYSET):
            stack = _state.stack  # empty in a thread the autograd engine started
            if stack and _any_lazy(args, kwargs):
                args, kwargs = adjust(args, kwargs, stack[-1])
            return call(*args, **kwargs)

    return kernel


@functools.cache
def _shared() -> tuple:
    """What the C kernels share (lazy_torch/csrc/amp.cpp)."""
    set_excluded = torch._C._dispatch_tls_set_dispatch_key_excluded
    return (_state, _cast, set_excluded, _KEY, torch.float32, _CASTABLE)


def _dtype_slot(op: Any) -> tuple[int | None, str]:
    """Where an op takes its ``dtype``: (position, name), position None when keyword-only."""
    for i, a in enumerate(op._schema.arguments):
        if a.name == "dtype":
            return (None if a.kwarg_only else i), a.name
    raise AssertionError(f"{op} has no dtype argument")


def _flat(args: tuple, kwargs: dict) -> Iterator[Any]:
    """Each argument, and each element of a list or tuple argument."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _castable(t: Any) -> bool:
    """A lazy floating-point tensor that autocast may cast (float64 is left alone)."""
    return isinstance(t, LazyTensor) and t._meta.dtype in _CASTABLE


def _any_lazy(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(a, LazyTensor) for a in _flat(args, kwargs))


def _cast(t: Any, dtype: torch.dtype, cache: bool) -> Any:
    """``t`` in ``dtype`` if autocast may cast it: a lazy floating-point tensor (not float64)."""
    if not isinstance(t, LazyTensor):
        if isinstance(t, (list, tuple)):
            return type(t)(_cast(x, dtype, cache) for x in t)
        return t
    have = t._meta.dtype
    if have is dtype or have not in _CASTABLE:
        return t
    if not (cache and have is torch.float32 and t.is_leaf and t.requires_grad and not t._is_view()):
        return t.to(dtype)
    key = (id(t), t._version, dtype, torch.is_grad_enabled())
    hit = _state.cache.get(key)
    if hit is None:
        hit = _state.cache[key] = (t, t.to(dtype))
    return hit[1]


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype, cache: bool) -> tuple[tuple, dict]:
    args = tuple([_cast(a, dtype, cache) for a in args])
    if kwargs:
        kwargs = {k: _cast(v, dtype, cache) for k, v in kwargs.items()}
    return args, kwargs


def _promote(args: tuple, kwargs: dict, state: tuple) -> tuple[tuple, dict]:
    return _cast_all(args, kwargs, _widest(args, kwargs, state[1]), False)


def _banned(args: tuple, kwargs: dict, state: tuple) -> tuple[tuple, dict]:
    raise RuntimeError(_BANNED_MESSAGE)


def _set_float32(
    args: tuple, kwargs: dict, state: tuple, slot: tuple[int | None, str]
) -> tuple[tuple, dict]:
    """A float32 result unless a dtype is given, when the first tensor is one autocast may cast."""
    first = next((a for a in _flat(args, kwargs) if isinstance(a, torch.Tensor)), None)
    if not _castable(first):
        return args, kwargs
    position, name = slot
    if position is not None and position < len(args):
        if args[position] is None:
            args = (*args[:position], torch.float32, *args[position + 1 :])
    elif kwargs.get(name) is None:
        kwargs = {**kwargs, name: torch.float32}
    return args, kwargs


def _widest(args: tuple, kwargs: dict, lower: torch.dtype) -> torch.dtype:
    widest = lower
    for t in _flat(args, kwargs):
        if _castable(t):
            widest = torch.promote_types(widest, t._meta.dtype)
    return widest


_ADJUST = {_WIDEST: _promote, _BANNED: _banned}
