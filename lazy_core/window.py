"""Windows addressed by memory: which elements of a strided layout another strided layout reads.

A layout is ``(sizes, strides, offset)`` over one storage's memory, as PyTorch reports a tensor's.
A view whose chain of view steps cannot be inverted (an expand that repeats elements, overlapping
unfold windows) or that addresses memory directly (``as_strided``) is still a window on the memory
of some tensor ``source`` whose value is known: each of the window's elements is the element of
``source`` at the same address. ``positions`` finds them, so the window can be read as a gather
from ``source``'s value and, when no two of its elements share an address, written back as a
scatter into it.
"""

from __future__ import annotations

import numpy as np

Layout = tuple[tuple[int, ...], tuple[int, ...], int]


def numel(sizes: tuple[int, ...]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def addresses(layout: Layout) -> np.ndarray:
    """The address of each element of ``layout``, in row-major order of its sizes."""
    sizes, strides, offset = layout
    out = np.full((), offset, dtype=np.int64)
    for n, st in zip(sizes, strides):
        out = out[..., None] + np.arange(n, dtype=np.int64) * st
    return out.reshape(-1)


def distinct(layout: Layout) -> bool:
    """Whether no two elements of ``layout`` share an address (an empty layout has none)."""
    sizes, strides, _ = layout
    if any(n > 1 and st == 0 for n, st in zip(sizes, strides)):
        return numel(sizes) == 0
    a = addresses(layout)
    return len(np.unique(a)) == len(a)


def positions(source: Layout, window: Layout) -> np.ndarray | None:
    """For each element of ``window`` (row-major), the row-major position in ``source`` of the
    element at its address; None if some address is not one of ``source``'s. ``source``'s
    elements must have distinct addresses."""
    src = addresses(source)
    want = addresses(window)
    order = np.argsort(src, kind="stable")
    found = np.searchsorted(src[order], want)
    found = np.minimum(found, max(len(src) - 1, 0))
    if len(want) and (len(src) == 0 or not np.array_equal(src[order][found], want)):
        return None
    return order[found] if len(want) else np.zeros(0, dtype=np.int64)


def digits(source: Layout) -> tuple[tuple[int, int, int], ...]:
    """``source``'s dimensions of size > 1 as (stride, size, row-major stride of its position),
    largest stride first: an address's index along each, taken greedily from the largest
    stride down, gives its position when ``arithmetic`` holds."""
    sizes, strides, _ = source
    row = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        row[d] = row[d + 1] * sizes[d + 1]
    dims = [(st, n, r) for n, st, r in zip(sizes, strides, row) if n > 1]
    return tuple(sorted(dims, key=lambda d: -d[0]))


def digit_positions(source: Layout, address: np.ndarray, xp=np) -> np.ndarray:
    """The greedy position of each ``address`` in ``source`` (numpy or jax.numpy arrays)."""
    rest = address - source[2]
    pos = xp.zeros_like(rest)
    for st, n, r in digits(source):
        i = rest // st if st else xp.zeros_like(rest)
        pos = pos + i * r
        rest = rest - i * st
    return pos


def arithmetic(source: Layout, window: Layout, found: np.ndarray) -> bool:
    """Whether the greedy positions of ``window``'s addresses are ``found`` (true of every
    layout whose strides nest, as those of views other than ``as_strided`` do)."""
    return bool(np.array_equal(digit_positions(source, addresses(window)), found))
