"""Tests for lowerings/resampling.py against eager CPU PyTorch: values and backward ops."""

from __future__ import annotations

import pytest
import torch

from lowerings import LOWERINGS, LoweringContext
from tests.lowerings.util import check_lowering, make, to_jax, to_torch

aten = torch.ops.aten
GRAD_TOL = {"atol": 1e-4, "rtol": 1e-4}


def _check_with_backward(forward, backward, backward_args, x, *args, dtype_tol=None):
    """Check ``forward(x, *args)`` and ``backward(grad, *backward_args(x))``."""
    tol = dtype_tol or {}
    check_lowering(forward, x, *args, **tol)
    out = forward(x, *args)
    grad = make(tuple(out.shape), out.dtype, seed=7)
    check_lowering(backward, grad, *backward_args(out, x), **(tol or GRAD_TOL))


# ------------------------------------------------------------------------------------------------
# upsample / interpolate

# (op name, input shape, output size, align_corners (None: op takes none), scales)
UPSAMPLE_CASES = [
    ("upsample_nearest1d", (2, 3, 5), (9,), None, (None,)),
    ("upsample_nearest1d", (2, 3, 5), (10,), None, (2.0,)),
    ("upsample_nearest1d", (1, 2, 7), (3,), None, (0.5,)),
    ("upsample_nearest2d", (2, 2, 3, 5), (5, 7), None, (None, None)),
    ("upsample_nearest2d", (1, 2, 4, 4), (6, 6), None, (1.7, 1.5)),
    ("upsample_nearest3d", (1, 2, 3, 4, 5), (5, 3, 8), None, (None, None, None)),
    ("_upsample_nearest_exact1d", (2, 3, 5), (9,), None, (None,)),
    ("_upsample_nearest_exact1d", (2, 3, 3), (5,), None, (None,)),
    ("_upsample_nearest_exact2d", (2, 2, 3, 5), (5, 7), None, (None, None)),
    ("_upsample_nearest_exact2d", (1, 2, 8, 8), (3, 5), None, (0.4, 0.7)),
    ("_upsample_nearest_exact3d", (1, 2, 3, 4, 5), (5, 3, 8), None, (None, None, None)),
    ("upsample_linear1d", (2, 3, 5), (9,), False, (None,)),
    ("upsample_linear1d", (2, 3, 5), (9,), True, (None,)),
    ("upsample_linear1d", (2, 3, 5), (11,), False, (2.3,)),
    ("upsample_linear1d", (2, 3, 9), (4,), False, (None,)),
    ("upsample_bilinear2d", (2, 3, 4, 5), (7, 3), False, (None, None)),
    ("upsample_bilinear2d", (2, 3, 4, 5), (7, 3), True, (None, None)),
    ("upsample_bilinear2d", (1, 2, 4, 4), (6, 10), False, (1.5, 2.5)),
    ("upsample_bilinear2d", (1, 2, 4, 4), (4, 4), False, (1.1, 1.1)),
    ("upsample_trilinear3d", (1, 2, 3, 4, 5), (5, 3, 8), False, (None, None, None)),
    ("upsample_trilinear3d", (1, 2, 3, 4, 5), (5, 3, 8), True, (None, None, None)),
    ("upsample_bicubic2d", (2, 3, 4, 5), (7, 3), False, (None, None)),
    ("upsample_bicubic2d", (2, 3, 4, 5), (7, 3), True, (None, None)),
    ("upsample_bicubic2d", (1, 2, 5, 5), (12, 3), False, (2.5, 0.6)),
    ("_upsample_bilinear2d_aa", (2, 3, 9, 10), (4, 3), False, (None, None)),
    ("_upsample_bilinear2d_aa", (2, 3, 9, 10), (4, 3), True, (None, None)),
    ("_upsample_bilinear2d_aa", (1, 2, 4, 5), (9, 7), False, (None, None)),
    ("_upsample_bilinear2d_aa", (1, 2, 16, 16), (5, 3), False, (0.33, 0.2)),
    ("_upsample_bicubic2d_aa", (2, 3, 9, 10), (4, 3), False, (None, None)),
    ("_upsample_bicubic2d_aa", (2, 3, 9, 10), (4, 3), True, (None, None)),
    ("_upsample_bicubic2d_aa", (1, 2, 4, 5), (9, 7), False, (None, None)),
]


def _upsample_args(output_size, align_corners, scales):
    head = (list(output_size),) if align_corners is None else (list(output_size), align_corners)
    return (*head, *scales)


@pytest.mark.parametrize("name,shape,output_size,align_corners,scales", UPSAMPLE_CASES)
def test_upsample_forward_backward(name, shape, output_size, align_corners, scales):
    forward = getattr(aten, name).default
    backward = getattr(aten, f"{name}_backward").default
    x = make(shape)
    args = _upsample_args(output_size, align_corners, scales)
    head = args[:1] if align_corners is None else args[:2]

    def backward_args(out, x):
        return (head[0], list(x.shape), *head[1:], *scales)

    _check_with_backward(forward, backward, backward_args, x, *args)


@pytest.mark.parametrize(
    "name", ["upsample_bilinear2d", "upsample_bicubic2d", "upsample_nearest2d"]
)
def test_upsample_float64(name):
    forward = getattr(aten, name).default
    x = make((2, 2, 5, 6), torch.float64)
    ac = () if "nearest" in name else (False,)
    check_lowering(forward, x, [7, 4], *ac, 1.5, 0.7, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", ["upsample_bilinear2d", "_upsample_nearest_exact1d"])
def test_upsample_vec(name):
    forward = getattr(aten, name).vec
    nd = 2 if "2d" in name else 1
    x = make((2, 3) + (5,) * nd)
    ac = () if "nearest" in name else (True,)
    check_lowering(forward, x, None, *ac, [1.6] * nd)


# ------------------------------------------------------------------------------------------------
# padding


@pytest.mark.parametrize("kind", ["replication", "reflection"])
@pytest.mark.parametrize(
    "dims,shape,padding",
    [
        (1, (2, 3, 5), [2, 3]),
        (1, (3, 5), [0, 4]),
        (2, (2, 3, 4, 5), [1, 2, 3, 0]),
        (2, (2, 3, 4, 5), [-1, 2, 3, -2]),
        (3, (1, 2, 3, 4, 5), [1, 2, 2, 0, 1, 1]),
    ],
)
def test_pad_forward_backward(kind, dims, shape, padding):
    forward = getattr(aten, f"{kind}_pad{dims}d").default
    backward = getattr(aten, f"{kind}_pad{dims}d_backward").default
    x = make(shape)
    _check_with_backward(forward, backward, lambda out, x: (x, padding), x, padding)


def test_pad_integer():
    check_lowering(aten.replication_pad2d.default, make((2, 3, 4), torch.int64), [1, 2, 0, 3])


# ------------------------------------------------------------------------------------------------
# grid_sample


def _grid(shape, seed=3, spread=1.2):
    return make(shape, low=-spread, high=spread, seed=seed)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_mode", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_2d(mode, padding_mode, align_corners):
    x = make((2, 3, 5, 6))
    grid = _grid((2, 4, 7, 2))
    args = (mode, padding_mode, align_corners)
    check_lowering(aten.grid_sampler_2d.default, x, grid, *args)
    out = aten.grid_sampler_2d.default(x, grid, *args)
    grad = make(tuple(out.shape), seed=5)
    check_lowering(
        aten.grid_sampler_2d_backward.default, grad, x, grid, *args, [True, True], **GRAD_TOL
    )


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("padding_mode", [0, 1, 2])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sampler_3d(mode, padding_mode, align_corners):
    x = make((2, 2, 3, 4, 5))
    grid = _grid((2, 3, 2, 4, 3))
    args = (mode, padding_mode, align_corners)
    check_lowering(aten.grid_sampler_3d.default, x, grid, *args)
    out = aten.grid_sampler_3d.default(x, grid, *args)
    grad = make(tuple(out.shape), seed=5)
    check_lowering(
        aten.grid_sampler_3d_backward.default, grad, x, grid, *args, [True, True], **GRAD_TOL
    )


def test_grid_sampler_backward_input_only():
    """A False output_mask entry gives None, the contract for outputs the op does not produce."""
    x = make((1, 2, 4, 4))
    grid = _grid((1, 3, 3, 2))
    grad = make((1, 2, 3, 3), seed=5)
    expected, _ = aten.grid_sampler_2d_backward.default(grad, x, grid, 0, 0, False, [True, False])
    ctx = LoweringContext(shapes=((1, 2, 4, 4), None), dtypes=("float32", None))
    lower = LOWERINGS["aten.grid_sampler_2d_backward.default"]
    got = lower(ctx, *(to_jax(t) for t in (grad, x, grid)), 0, 0, False, (True, False))
    assert got[1] is None
    torch.testing.assert_close(to_torch(got[0]), expected, **GRAD_TOL)


def test_grid_sampler_float64():
    x = make((1, 2, 4, 5), torch.float64)
    grid = _grid((1, 3, 3, 2)).double()
    check_lowering(aten.grid_sampler_2d.default, x, grid, 2, 2, False, atol=1e-12, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# _trilinear (nn.functional.bilinear)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_trilinear_bilinear_form(dtype):
    x1, w, x2 = make((4, 3), dtype), make((5, 3, 2), dtype, seed=1), make((4, 2), dtype, seed=2)
    check_lowering(aten._trilinear.default, x1, w, x2, [1, 3], [0], [1, 2], [2, 3], 1)


def test_trilinear_empty_batch():
    x1, w, x2 = make((0, 3)), make((5, 3, 2), seed=1), make((0, 2), seed=2)
    check_lowering(aten._trilinear.default, x1, w, x2, [1, 3], [0], [1, 2], [2, 3], 1)


def test_trilinear_partial_sum():
    a, b, c = make((2, 3)), make((3,), seed=1), make((2, 3), seed=2)
    check_lowering(aten._trilinear.default, a, b, c, [], [0], [], [1], 1)
