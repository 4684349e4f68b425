"""Comparisons the front-end tests share."""

import torch


def assert_same_tensor(got: torch.Tensor, expected: torch.Tensor) -> None:
    """``got`` (lazy) has ``expected``'s (eager) shape, strides, storage offset, dtype and values."""
    assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == (
        expected.shape,
        expected.stride(),
        expected.storage_offset(),
        expected.dtype,
    )
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-6, atol=1e-6)
