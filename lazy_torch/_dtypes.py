"""torch <-> IR dtype names and host array conversions."""

from __future__ import annotations

import numpy as np
import torch

from lazy_core import register_atoms

# torch dtype -> IR dtype name, for every dtype the lazy device supports.
DTYPE_NAMES = {
    d: str(d).removeprefix("torch.")
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.uint16,
        torch.uint32,
        torch.uint64,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}
_FROM_NAME = {v: k for k, v in DTYPE_NAMES.items()}

# Keys (lazy_core/digest.py) may hold torch dtypes and Python's number types: each digests as its
# name.
register_atoms({d: str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)})
register_atoms({t: f"builtins.{t.__name__}" for t in (bool, int, float, complex)})


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on the lazy device") from None


def torch_dtype(name: str) -> torch.dtype:
    return _FROM_NAME[name]


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Host array of a CPU tensor; bfloat16 travels as its uint16 bit pattern."""
    t = t.detach().resolve_conj().resolve_neg().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy()
    return t.numpy()


def from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """CPU tensor of dtype ``dtype`` from a host array (a copy the tensor owns)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.array(a).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))
