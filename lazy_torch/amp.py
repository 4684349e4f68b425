"""Mixed precision on device 'lazy': ``lazy_torch.amp.autocast``, PyTorch's CUDA autocast rules.

This PyTorch build has no autocast dispatch key for the Lazy backend: ``torch.autocast('lazy')``
raises, and autocast keys are chosen from a tensor's backend in C++, so none can be attached to
our tensors from Python. ``autocast`` therefore works one level higher, as a TorchFunctionMode:
each call of a torch function on lazy tensors is matched against the op lists of CUDA autocast
(documented in the "Autocast Op Reference"), its floating-point lazy inputs are cast, and the
function runs on the cast inputs. The casts are ordinary differentiable ``Tensor.to`` calls seen
by autograd, so gradients flow back to the float32 parameters in float32.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from lazy_torch.tensor import LazyTensor

if TYPE_CHECKING:
    from typing_extensions import Self

# Run in the autocast dtype: matmuls, convolutions, attention, recurrent cells.
_LOWER_PRECISION = (
    "conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d "
    "convolution _convolution prelu addmm addmv addr matmul __matmul__ __rmatmul__ einsum mm mv "
    "linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot lstm_cell gru_cell "
    "rnn_tanh_cell rnn_relu_cell scaled_dot_product_attention"
)
# Run in float32: ops whose range or accumulation suffers in 16 bits. Python-level composites whose
# parts are all float32 ops under CUDA autocast (cross_entropy = log_softmax + nll_loss, rms_norm,
# normalize, interpolate -> upsample_*) are listed themselves: the mode sees only the outermost call.
_FP32 = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow __pow__ "
    "__rpow__ float_power softplus layer_norm group_norm rms_norm frobenius_norm nuclear_norm "
    "cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d "
    "hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss "
    "multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss "
    "binary_cross_entropy binary_cross_entropy_with_logits cross_entropy gaussian_nll_loss dist "
    "pdist cdist renorm logsumexp normalize interpolate upsample upsample_nearest "
    "upsample_bilinear"
)
# Run in float32 by asking for a float32 result (``dtype=torch.float32``) unless a dtype is given.
_FP32_SET_DTYPE = (
    "prod softmax log_softmax softmin cumprod cumsum linalg_vector_norm linalg_matrix_norm sum norm"
)
# Run in the widest floating type among the inputs. multi_head_attention_forward is a Python
# composite whose inner linears the mode cannot reach: promoting keeps bfloat16 activations and
# float32 weights from meeting inside it (it runs in float32).
_PROMOTE = (
    "addcdiv addcmul atan2 bilinear cross linalg_cross dot grid_sample tensordot index_put "
    "scatter_add stack cat concat concatenate index_copy multi_head_attention_forward"
)

_NAMESPACES = (torch, torch.Tensor, F, torch._C._nn, torch._C._VariableFunctions)


def _functions(names: str) -> list[Callable]:
    """Every public callable spelling of these ops: ``torch.x``, ``Tensor.x``, ``F.x``, linalg."""
    found = []
    for name in names.split():
        spaces = [(ns, name) for ns in _NAMESPACES]
        if name.startswith("linalg_"):
            spaces.append((torch.linalg, name[len("linalg_") :]))
        for ns, attr in spaces:
            fn = getattr(ns, attr, None)
            if callable(fn):
                found.append(fn)
    return found


_LOWER, _F32, _F32_DTYPE, _WIDEST = "lower", "fp32", "fp32_dtype", "promote"
_POLICY: dict[Any, str] = {}
for _names, _policy in (
    (_LOWER_PRECISION, _LOWER),
    (_FP32, _F32),
    (_FP32_SET_DTYPE, _F32_DTYPE),
    (_PROMOTE, _WIDEST),
):
    for _fn in _functions(_names):
        _POLICY[_fn] = _policy


# ----------------------------------------------------------------------------------------------
# Autocast state: a thread-local stack of (enabled, dtype, cache_enabled), innermost last.


class _State(threading.local):
    def __init__(self) -> None:
        self.stack: list[tuple[bool, torch.dtype, bool]] = []
        # Casts of float32 leaf parameters, reused while the outermost autocast is open (a weight
        # used twice is cast once). Keyed by identity, version and grad mode; holds the source.
        self.cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


_state = _State()


def is_autocast_enabled() -> bool:
    """Whether lazy autocast is on in this thread."""
    return bool(_state.stack) and _state.stack[-1][0]


def get_autocast_dtype() -> torch.dtype:
    """The lower-precision dtype of the innermost lazy autocast (bfloat16 outside one)."""
    return _state.stack[-1][1] if _state.stack else torch.bfloat16


class autocast(contextlib.ContextDecorator):
    """``torch.autocast`` for lazy tensors: a context manager, also usable as a decorator.

    Inside it, matmuls, linear layers, convolutions and attention on lazy tensors run in ``dtype``;
    softmax, normalizations, losses, reductions and transcendental functions run in float32;
    ``cat``/``stack``/``addcmul``-like ops run in the widest input type (CUDA autocast's lists).
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
        # One mode per open ``with`` of this object (a decorated function may recurse).
        self._modes: list[TorchFunctionMode | None] = []

    def __enter__(self) -> Self:
        mode = None
        if not _state.stack:
            mode = _AutocastMode()
            mode.__enter__()
        _state.stack.append((self.enabled, self.dtype, self.cache_enabled))
        self._modes.append(mode)
        return self

    def __exit__(self, *exc: object) -> None:
        _state.stack.pop()
        mode = self._modes.pop()
        if mode is not None:
            _state.cache.clear()
            mode.__exit__(*exc)


# ----------------------------------------------------------------------------------------------
# The mode: one dictionary lookup per torch function call; casts only for listed functions.


class _AutocastMode(TorchFunctionMode):
    def __torch_function__(
        self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        policy = _POLICY.get(func)
        if policy is None or not _state.stack or "out" in kwargs:
            return func(*args, **kwargs)
        enabled, dtype, cache = _state.stack[-1]
        if not enabled:
            return func(*args, **kwargs)
        if policy == _LOWER:
            args, kwargs = _cast_all(args, kwargs, dtype, cache)
        elif policy == _F32:
            args, kwargs = _cast_all(args, kwargs, torch.float32, False)
        elif policy == _F32_DTYPE:
            first = _first_tensor(args, kwargs)
            if _eligible(first) and not _has_dtype(args, kwargs):
                kwargs = {**kwargs, "dtype": torch.float32}
        else:
            widest = _widest(args, kwargs, dtype)
            args, kwargs = _cast_all(args, kwargs, widest, False)
        return func(*args, **kwargs)


def _eligible(t: Any) -> bool:
    """A lazy floating-point tensor that autocast may cast (float64 is left alone, as in PyTorch)."""
    return isinstance(t, LazyTensor) and t.is_floating_point() and t.dtype != torch.float64


def _cast(t: Any, dtype: torch.dtype, cache: bool) -> Any:
    if isinstance(t, (list, tuple)):
        return type(t)(_cast(x, dtype, cache) for x in t)
    if not _eligible(t) or t.dtype == dtype:
        return t
    if not (cache and t.is_leaf and t.requires_grad and t.dtype == torch.float32):
        return t.to(dtype)
    key = (id(t), t._version, dtype, torch.is_grad_enabled())
    hit = _state.cache.get(key)
    if hit is None:
        hit = _state.cache[key] = (t, t.to(dtype))
    return hit[1]


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype, cache: bool) -> tuple[tuple, dict]:
    args = tuple(_cast(a, dtype, cache) for a in args)
    return args, {k: _cast(v, dtype, cache) for k, v in kwargs.items()}


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    tensors = _tensors(args, kwargs)
    return tensors[0] if tensors else None


def _has_dtype(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)


def _widest(args: tuple, kwargs: dict, lower: torch.dtype) -> torch.dtype:
    widest = lower
    for t in _tensors(args, kwargs):
        if _eligible(t):
            widest = torch.promote_types(widest, t.dtype)
    return widest
