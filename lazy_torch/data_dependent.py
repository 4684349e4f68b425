"""Ops whose output shape or Python result depends on tensor values.

Each handler computes on the device, syncs only the number that decides the result's size (a
count, a maximum) or the Python value the op returns, and builds the rest from lowered ops. So
``nonzero``, ``unique``, ``masked_select``, ``bincount`` and ``repeat_interleave`` cost one small
transfer, not a CPU fallback of their inputs; the sync is counted under the op's name as cause.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lazy_torch.dispatch import special
from lazy_torch.recording import bound_arguments
from lazy_torch.shapes import check_like_eager
from lazy_torch.tensor import LazyTensor, Meta, to_cpu, wrap

aten = torch.ops.aten


def _fetch(t: torch.Tensor, cause: str) -> list:
    """The values of a small lazy tensor as Python numbers (one sync)."""
    return to_cpu(t, cause=cause).tolist()


# ----------------------------------------------------------------------------------------------
# Python results: the comparison runs on the device; only its boolean comes back.


@special(aten.equal.default)
def _equal(func, args, kwargs):
    a, b = args
    if a.shape != b.shape:
        return False
    return bool(_fetch((a == b).all(), "equal"))


@special(aten.allclose.default)
def _allclose(func, args, kwargs):
    close = torch.isclose(*args, **kwargs)
    return bool(_fetch(close.all(), "allclose"))


@special(aten._linalg_check_errors.default)
def _linalg_check_errors(func, args, kwargs):
    # LAPACK-style ``info`` codes: eager raises on a singular or non-definite input. Only the
    # codes travel; a nonzero one is handed to eager's own check for its exact message.
    info = args[0]
    if info.numel() and _fetch(info.ne(0).any(), "linalg_check"):
        func(to_cpu(info, cause="linalg_check"), *args[1:], **kwargs)


# ----------------------------------------------------------------------------------------------
# Data-dependent sizes: sync the size, then record static-size ops.


def _count(mask: torch.Tensor, cause: str) -> int:
    return int(_fetch(mask.sum(), cause))


@special(aten.nonzero.default)
def _nonzero(func, args, kwargs):
    x = args[0]
    check_like_eager(func, args, kwargs)
    size = _count(x.ne(0), "nonzero")
    out = aten.nonzero_static.default(x, size=size)
    # Eager's kernel fills a (dims, count) tensor and returns its transpose: strides (1, count).
    return wrap(out._lazy, Meta(out._meta.shape, (1, size), 0, out.dtype))


@special(aten.masked_select.default)
def _masked_select(func, args, kwargs):
    x, mask = args
    check_like_eager(func, args, kwargs)
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    flat_mask = mask.expand(shape).reshape(-1)
    index = _nonzero(aten.nonzero.default, (flat_mask,), {}).reshape(-1)
    return x.expand(shape).reshape(-1)[index]


@special(aten.bincount.default)
def _bincount(func, args, kwargs):
    x = args[0]
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
    check_like_eager(func, args, kwargs)
    length = minlength
    if x.numel():
        low, high = _fetch(torch.stack([x.min(), x.max()]), "bincount")
        if low < 0:
            func(torch.tensor([low]), minlength=minlength)  # eager's error
        length = max(high + 1, minlength)
    if weights is None:
        dtype, values = torch.int64, torch.ones_like(x, dtype=torch.int64)
    else:
        dtype = weights.dtype if weights.dtype == torch.float32 else torch.float64
        values = weights.to(dtype)
    out = torch.zeros(length, dtype=dtype, device=x.device)
    return out.index_add(0, x, values)


@special(aten.repeat_interleave.Tensor)
def _repeat_interleave(func, args, kwargs):
    repeats = args[0]
    output_size = kwargs.get("output_size")
    check_like_eager(func, args, {})
    if repeats.numel() == 0:
        return torch.zeros(0, dtype=repeats.dtype, device=repeats.device)
    ends = repeats.cumsum(0)
    if output_size is None:
        low, output_size = _fetch(torch.stack([repeats.min(), ends[-1]]), "repeat_interleave")
        if low < 0:
            func(torch.tensor([low]))  # eager's error
    positions = torch.arange(output_size, dtype=ends.dtype, device=repeats.device)
    return torch.searchsorted(ends, positions, right=True).to(repeats.dtype)


def _unique_rows(rows: torch.Tensor, sort: bool, cause: str) -> tuple:
    """Groups of equal rows of the (n, k) ``rows``: (first row of each group, inverse, counts).

    With ``sort`` the groups come in lexicographic order (NaNs last, each its own group, as in
    eager); without it only consecutive equal rows form a group.
    """
    n, device = rows.shape[0], rows.device
    order = torch.arange(n, device=device)
    if sort:
        for col in reversed(range(rows.shape[1])):  # stable sorts, least significant column first
            order = order[torch.sort(rows[order, col], stable=True).indices]
    ordered = rows[order]
    new = torch.ones(n, dtype=torch.bool, device=device)
    if n > 1:
        new[1:] = (ordered[1:] != ordered[:-1]).any(1)
    groups = _count(new, cause) if n else 0
    starts = aten.nonzero_static.default(new, size=groups).reshape(-1)
    group_of_sorted = new.cumsum(0) - 1
    inverse = torch.empty_like(group_of_sorted).scatter(0, order, group_of_sorted)
    ends = torch.cat([starts[1:], torch.full((1,), n, device=device)]) if groups else starts
    return ordered[starts], inverse, ends - starts


def _unique_flat(x, sort, return_inverse, return_counts, cause):
    values, inverse, counts = _unique_rows(x.reshape(-1, 1), sort, cause)
    empty = torch.zeros(0, dtype=torch.int64, device=x.device)
    return (
        values.reshape(-1),
        inverse.reshape(x.shape) if return_inverse else empty,
        counts if return_counts else empty,
    )


@special(aten._unique2.default)
def _unique2(func, args, kwargs):
    x, _, return_inverse, return_counts = _bound(func, args, kwargs)
    check_like_eager(func, args, kwargs)
    return _unique_flat(x, True, return_inverse, return_counts, "unique")


@special(aten._unique.default)
def _unique(func, args, kwargs):
    x, _, return_inverse = _bound(func, args, kwargs)
    check_like_eager(func, args, kwargs)
    return _unique_flat(x, True, return_inverse, False, "unique")[:2]


@special(aten.unique_consecutive.default, aten.unique_dim.default)
def _unique_along(func, args, kwargs):
    if func is aten.unique_dim.default:
        x, dim, _, return_inverse, return_counts = _bound(func, args, kwargs)
        sort = True
    else:
        x, return_inverse, return_counts, dim = _bound(func, args, kwargs)
        sort = False
    check_like_eager(func, args, kwargs)
    if dim is None:
        return _unique_flat(x, sort, return_inverse, return_counts, "unique")
    moved = x.movedim(dim, 0)
    values, inverse, counts = _unique_rows(moved.reshape(moved.shape[0], -1), sort, "unique")
    values = values.reshape(-1, *moved.shape[1:]).movedim(0, dim)
    if func is aten.unique_dim.default:
        return values, inverse, counts
    empty = torch.zeros(0, dtype=torch.int64, device=x.device)
    return values, inverse if return_inverse else empty, counts if return_counts else empty


def _bound(func: Any, args: tuple, kwargs: dict) -> list:
    """Every argument of ``func`` in schema order, defaults filled in."""
    return list(bound_arguments(func, args, kwargs).values())


def _lengths(t: Any) -> list[int]:
    """Sequence lengths as Python ints: free for CPU tensors (the usual case), one sync if lazy."""
    return t.tolist() if isinstance(t, torch.Tensor) else list(t)


@special(aten._ctc_loss.Tensor)
def _ctc_loss(func, args, kwargs):
    # The alpha table's width is the longest target: the lengths decide the output shape.
    log_probs, targets, input_lengths, target_lengths, *rest = args
    lengths = _lengths(input_lengths), _lengths(target_lengths)
    return aten._ctc_loss.default(log_probs, targets, *lengths, *rest, **kwargs)


@special(aten._ctc_loss_backward.Tensor)
def _ctc_loss_backward(func, args, kwargs):
    grad, log_probs, targets, input_lengths, target_lengths, *rest = args
    lengths = _lengths(input_lengths), _lengths(target_lengths)
    return aten._ctc_loss_backward.default(grad, log_probs, targets, *lengths, *rest, **kwargs)


def _ctc_loss_tensor_lengths(
    log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1, zero_infinity=False
):
    """``F.ctc_loss`` with lengths given as tensors (on the CPU, as is usual): eager reads them as
    numbers. (PyTorch's composite for tensor subclasses divides the loss by ``target_lengths``
    where they lie, which mixes devices.)"""
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    lengths = _lengths(input_lengths), _lengths(target_lengths)
    return aten.ctc_loss.IntList(log_probs, targets, *lengths, blank, reduction, zero_infinity)


# At AutogradLazy, where the composite would run; inference mode skips the autograd keys and
# hands the composite to the Python key, so it is a special handler as well.
special(aten.ctc_loss.Tensor)(lambda func, args, kwargs: _ctc_loss_tensor_lengths(*args, **kwargs))
_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (a kernel for an existing aten op)
_lib.impl("ctc_loss.Tensor", _ctc_loss_tensor_lengths, "AutogradLazy")


# ----------------------------------------------------------------------------------------------
# Packed sequences: eager takes the lengths on the CPU and returns the batch sizes there.


def _scalar_type(dtype: torch.dtype) -> str:
    """PyTorch's C++ name of ``dtype`` (Long, Float, ...), as its messages spell it."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


@special(aten._pack_padded_sequence.default)
def _pack_padded_sequence(func, args, kwargs):
    input, lengths, batch_first = bound_arguments(func, args, kwargs).values()
    if isinstance(lengths, LazyTensor):
        raise RuntimeError(  # noqa: TRY004 (eager's error)
            "'lengths' argument should be a 1D CPU int64 tensor, but got "
            f"{lengths.dim()}D {lengths.device} {_scalar_type(lengths.dtype)} tensor"
        )
    # Eager's kernel checks the lengths and counts the batch sizes; it only needs the padded
    # dims (and whether the input is empty), so it runs on a stand-in of those.
    shape = tuple(input.shape[:2])
    if input.dim() > 2:
        shape += (1 if input.numel() else 0,)
    standin = torch.zeros((), dtype=input.dtype).expand(shape)
    with torch._C._DisableTorchDispatch():
        batch_sizes = func(standin, lengths, batch_first)[1]
    steps = input.transpose(0, 1) if batch_first else input
    pieces, start, sizes = [], 0, batch_sizes.tolist()
    while start < len(sizes):
        end = start
        while end < len(sizes) and sizes[end] == sizes[start]:
            end += 1  # consecutive steps of one batch size are one slice
        piece = steps[start:end, : sizes[start]]
        pieces.append(piece.reshape(-1, *steps.shape[2:]))
        start = end
    return torch.cat(pieces), batch_sizes


# ----------------------------------------------------------------------------------------------
# Histograms: the counting is static-shaped; only the data's range, when no range is given, is
# read back (eager rejects a non-finite one).


def _outer_edges(points: torch.Tensor, range_: Any) -> list[tuple[float, float]]:
    dims = points.shape[1]
    if range_ is not None:
        pairs = [(range_[2 * d], range_[2 * d + 1]) for d in range(dims)]
    elif points.shape[0] == 0:
        pairs = [(0.0, 0.0)] * dims
    else:
        low, high = _fetch(torch.stack([points.amin(0), points.amax(0)]), "histogram")
        pairs = list(zip(low, high))
        if not all(math.isfinite(v) for pair in pairs for v in pair):
            torch.histogramdd(torch.tensor(pairs, dtype=points.dtype).T, [1] * dims)  # its error
    return [(lo - 0.5, hi + 0.5) if lo == hi else (lo, hi) for lo, hi in pairs]


def _edges(points: torch.Tensor, bins: Any, range_: Any) -> list[torch.Tensor]:
    return [
        torch.linspace(lo, hi, n + 1, dtype=points.dtype, device=points.device)
        for (lo, hi), n in zip(_outer_edges(points, range_), bins)
    ]


def _grid_counts(points: torch.Tensor, edges: list, weight: Any, density: bool) -> torch.Tensor:
    """Weighted counts of ``points`` (N, D) in the grid of ``edges``; the last edge is inclusive."""
    n = points.shape[0]
    flat = torch.zeros(n, dtype=torch.int64, device=points.device)
    inside = torch.ones(n, dtype=torch.bool, device=points.device)
    sizes = [e.numel() - 1 for e in edges]
    for d, (e, size) in enumerate(zip(edges, sizes)):
        v = points[:, d]
        index = torch.searchsorted(e, v, right=True) - 1
        inside &= (v >= e[0]) & (v <= e[-1])
        flat = flat * size + index.clamp(0, size - 1)
    w = torch.ones(n, dtype=points.dtype, device=points.device) if weight is None else weight
    w = torch.where(inside, w.reshape(-1), 0)
    total = math.prod(sizes)
    hist = torch.zeros(total, dtype=points.dtype, device=points.device).index_add(0, flat, w)
    hist = hist.reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * len(edges)
            shape[d] = sizes[d]
            hist = hist / (e[1:] - e[:-1]).reshape(shape)
    return hist


@special(aten.histogram.bin_ct, aten.histogram.bins_tensor)
def _histogram(func, args, kwargs):
    x, bins, *_ = _bound(func, args, kwargs)
    check_like_eager(func, args, kwargs)
    points = x.reshape(-1, 1)
    if isinstance(bins, torch.Tensor):
        edges = [bins]
    else:
        edges = _edges(points, [bins], kwargs.get("range"))
    return _grid_counts(points, edges, kwargs.get("weight"), kwargs.get("density", False)), edges[0]


@special(
    aten._histogramdd_bin_edges.default,
    aten._histogramdd_from_bin_cts.default,
    aten._histogramdd_from_bin_tensors.default,
)
def _histogramdd(func, args, kwargs):
    x, bins = args[:2]
    check_like_eager(func, args, kwargs)
    points = x.reshape(-1, x.shape[-1])
    if func is aten._histogramdd_from_bin_tensors.default:
        edges = list(bins)
    else:
        edges = _edges(points, bins, kwargs.get("range"))
        if func is aten._histogramdd_bin_edges.default:
            return edges
    return _grid_counts(points, edges, kwargs.get("weight"), kwargs.get("density", False))
