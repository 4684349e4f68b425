"""Meta kernels (shape, dtype and stride inference) for aten ops PyTorch ships none for.

Shape inference runs each op on meta tensors (lazy_torch/shapes.py); an op without a meta kernel
raises NotImplementedError there and takes the CPU fallback even when it has a lowering. The
kernels here give the sizes and strides eager CPU PyTorch gives. They need not word errors as eager
does: on any error, dispatch reruns the op eagerly on zeros and raises eager's own.

>>> import torch, lazy_torch
>>> h, tau = torch.geqrf(torch.empty(2, 5, 3, device="meta"))
>>> h.stride(), tuple(tau.shape)
((15, 1, 5), (2, 3))
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException

_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (kernels for existing aten ops)

_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


def _column_major(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """An empty meta tensor laid out as LAPACK leaves it: each matrix column-major."""
    return torch.empty(*shape[:-2], shape[-1], shape[-2], dtype=dtype, device="meta").mT


def _geqrf(self: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(self.dim() >= 2, lambda: "geqrf: input must have at least 2 dimensions.")
    torch._check(self.is_floating_point() or self.is_complex(), lambda: "geqrf: bad dtype")
    m, n = self.shape[-2:]
    tau = torch.empty(*self.shape[:-2], min(m, n), dtype=self.dtype, device="meta")
    return _column_major(tuple(self.shape), self.dtype), tau


def _linalg_lstsq(
    self: torch.Tensor,
    b: torch.Tensor,
    rcond: float | None = None,
    *,
    driver: str | None = None,
) -> tuple[torch.Tensor, ...]:
    # On the CPU, which lazy tensors stand in for, PyTorch's default driver is gelsy.
    driver = "gelsy" if driver is None else driver
    torch._check(driver in _LSTSQ_DRIVERS, lambda: f"lstsq: unknown driver {driver}")
    torch._check(self.dim() >= 2 and b.dim() >= 1, lambda: "lstsq: bad dimensions")
    torch._check(self.dim() - b.dim() in (0, 1), lambda: "lstsq: bad dimensions")
    torch._check(self.dtype == b.dtype, lambda: "lstsq: dtypes differ")
    torch._check(self.is_floating_point() or self.is_complex(), lambda: "lstsq: bad dtype")
    vector = b.dim() == 1 or self.dim() - b.dim() == 1
    b2 = b.unsqueeze(-1) if vector else b
    m, n = self.shape[-2:]
    k = b2.shape[-1]
    torch._check(b2.shape[-2] == m, lambda: "lstsq: row counts differ")
    batch = torch.broadcast_shapes(self.shape[:-2], b2.shape[:-2])
    # LAPACK overwrites B (max(m, n) rows, column-major) with the solution in its first n rows.
    solution = _column_major((*batch, max(m, n), k), self.dtype)[..., :n, :]
    if vector:
        solution = solution.squeeze(-1)
    real = self.real.dtype if self.is_complex() else self.dtype
    residuals = torch.empty(0, dtype=real, device="meta")
    if m > n and driver != "gelsy":
        if driver in ("gelsd", "gelss"):
            # Eager fills residuals only where every matrix has full rank n: a size that depends
            # on the values. Raising this sends the op to the CPU fallback.
            raise DataDependentOutputException(torch.ops.aten.linalg_lstsq.default)
        residuals = torch.empty(*batch, k, dtype=real, device="meta")
    rank_shape = (0,) if driver == "gels" else tuple(self.shape[:-2])
    rank = torch.empty(rank_shape, dtype=torch.int64, device="meta")
    values_shape = (*self.shape[:-2], min(m, n)) if driver in ("gelsd", "gelss") else (0,)
    singular_values = torch.empty(values_shape, dtype=real, device="meta")
    return solution, residuals, rank, singular_values


_lib.impl("geqrf", _geqrf, "Meta")
_lib.impl("linalg_lstsq", _linalg_lstsq, "Meta")


def _like_input(position: int):
    """A backward whose gradient has the shape, dtype and layout of its ``position``-th argument."""

    def kernel(*args, **kwargs):
        return torch.empty_like(args[position])

    return kernel


# Loss backwards: the gradient of the loss input (grad_output comes first).
_lib.impl("multi_margin_loss_backward", _like_input(1), "Meta")
_lib.impl("multilabel_margin_loss_backward", _like_input(1), "Meta")
_lib.impl("_ctc_loss_backward", _like_input(1), "Meta")
# Pooling backward: the gradient of the pooled input.
_lib.impl("fractional_max_pool3d_backward", _like_input(1), "Meta")
