"""Shape inference: PyTorch's meta kernels run on meta tensors laid out as the lazy ones,
memoized by op and argument metadata, with eager's errors where meta kernels raise other ones or
none."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from lazy_torch import dtype_checks as _dtype_checks
from lazy_torch.backend import BACKEND
from lazy_torch.eager_checks import eager_memo_rule
from lazy_torch.strides import output_meta
from lazy_torch.tensor import LazyTensor

# Ops whose (functional) result needs runtime-side keyword arguments.
MATMUL_OPS = frozenset(
    f"aten.{n}"
    for n in (
        "mm.default",
        "addmm.default",
        "bmm.default",
        "baddbmm.default",
        "addbmm.default",
        "matmul.default",
        "mv.default",
        "addmv.default",
        "dot.default",
        "convolution.default",
        "convolution_backward.default",
        "linear.default",
        "_scaled_dot_product_flash_attention_for_cpu.default",
        "_scaled_dot_product_flash_attention_for_cpu_backward.default",
    )
)
FALLBACK_EXCEPTIONS = (
    NotImplementedError,
    torch._subclasses.fake_tensor.DynamicOutputShapeException,
    torch._subclasses.fake_tensor.DataDependentOutputException,
)



def _to_meta(v: Any, cpu_scalars: bool = False) -> Any:
    """``v`` with lazy tensors (and, with ``cpu_scalars``, 0-dim CPU tensors) as meta tensors."""
    if isinstance(v, LazyTensor):
        shape, stride, offset, dtype = v._meta
        if not offset:
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        extent = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 0)
        return torch.empty(extent, dtype=dtype, device="meta").as_strided(shape, stride, offset)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_meta(x, cpu_scalars) for x in v)
    if cpu_scalars and isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu":
        return torch.empty((), dtype=v.dtype, device="meta")
    if isinstance(v, torch.device) or (isinstance(v, str) and v.startswith("lazy")):
        return torch.device("meta")
    return v


def infer(func: Any, args: tuple, kwargs: dict, key: tuple) -> Any:
    """Output metadata of ``func`` on these arguments (raises PyTorch's own errors)."""
    return memo_entry(func, args, kwargs, key)[0]


def memo_entry(func: Any, args: tuple, kwargs: dict, key: tuple, template: Any = None) -> tuple:
    """The memo entry of a call: its output metadata, and ``template`` as first recorded (for a
    recorded call, the nodes of equal calls share it instead of one each)."""
    # The shape memo (backend.py); operand keys hold dtypes and Python number types, atoms
    # registered by _dtypes.py.
    entry = BACKEND.meta_cache.get(key)
    if entry is None:
        margs = _to_meta(args, True)  # 0-dim CPU tensors too: eager CUDA takes them as scalars
        mkwargs = {k: _to_meta(v, True) for k, v in kwargs.items()}
        try:
            with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # meta kernels warn about resizing out= tensors
                result = func(*margs, **mkwargs)
        except FALLBACK_EXCEPTIONS:
            raise
        except Exception:
            # Eager's error (CPU scalars keep their values); eager skips the checks of some
            # kernels for empty tensors (log_softmax of a bool one): then its result's metadata.
            result = check_like_eager(func, args, kwargs)
            if not _all_empty(result):
                raise
        if str(func) in MATMUL_OPS and len({a.dtype for a in margs if _on_meta_device(a)}) > 1:
            _raise_eager_error(func, margs, mkwargs)  # meta kernels let matmuls mix dtypes
        result = eager_memo_rule(func, margs, mkwargs, result)  # what meta kernels miss
        _dtype_checks.check(func, margs, mkwargs)  # eager's kernels refuse some dtypes
        # Metas with eager's strides, which meta kernels' layout rules do not always give
        entry = BACKEND.meta_cache[key] = (output_meta(func, args, kwargs, result), template)
    return entry


def _on_meta_device(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.device.type == "meta"


def check_like_eager(func: Any, args: tuple, kwargs: dict) -> Any:
    """Raise the error eager CPU PyTorch gives for arguments of these shapes and dtypes, if any;
    else eager's result on zeros."""
    return _raise_eager_error(func, _to_meta(args), {k: _to_meta(v) for k, v in kwargs.items()})


def _all_empty(result: Any) -> bool:
    outs = result if isinstance(result, (list, tuple)) else [result]
    return bool(outs) and all(isinstance(t, torch.Tensor) and t.numel() == 0 for t in outs)


def _raise_eager_error(func: Any, margs: Any, mkwargs: dict) -> Any:
    """Raise the error eager CPU PyTorch gives for these shapes (meta kernels word some
    differently); else return eager's result."""

    def cpu(v: Any) -> Any:
        if _on_meta_device(v):
            return torch.zeros(v.shape, dtype=v.dtype)
        if isinstance(v, (list, tuple)):
            return type(v)(cpu(x) for x in v)
        return torch.device("cpu") if isinstance(v, torch.device) else v

    try:
        with torch._C._DisableTorchDispatch():
            return func(*cpu(margs), **{k: cpu(v) for k, v in mkwargs.items()})
    except Exception as eager_error:
        raise eager_error.with_traceback(None) from None
