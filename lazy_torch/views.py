"""Every aten view op as a ViewStep: its forward (Access) and its write-back (Assign), in one table.

A view op's output shares its input's storage; reading it applies the forward op to the storage's
current value, writing through it applies the inverse (``slice_scatter``, ``select_scatter``, a
transpose back, ...). Multi-output views (``split``, ``unbind``) become one slice/select each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lazy_core import NotWritable, ViewStep
from lazy_core import window as _window
from lazy_core.ir import Node, Operand, operand
from lazy_torch._dtypes import dtype_name

aten = torch.ops.aten
_PARENT, _VALUE = operand(0), operand(1)
# Eager's error for writes into expanded views (several elements share one memory location).
OVERLAP_ERROR = (
    "unsupported operation: more than one element of the written-to tensor refers to a single "
    "memory location. Please clone() the tensor before performing the operation."
)

Meta = tuple  # lazy_torch.tensor.Meta, which imports this module
Builder = Callable[[tuple, dict, Any, Meta], Sequence[ViewStep]]


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x) for x in v)
    if isinstance(v, torch.dtype):
        return dtype_name(v)
    return int(v) if isinstance(v, torch.SymInt) else v


def _step(
    op: str,
    rest: tuple,
    out: Meta,
    inverse_op: str | None,
    inverse_rest: tuple = (),
    error: str = "",
    parent: Meta | None = None,
) -> ViewStep:
    """``parent``: the Meta of the view's input, kept where the step has no inverse so that a
    write can go by address (``write``)."""
    # A ``*_scatter`` write-back takes (parent, value, ...); a reshaping one only (value, ...).
    inputs = (_PARENT, _VALUE) if inverse_op and "scatter" in inverse_op else (_VALUE,)
    return _STEP_TYPES.get(op, ViewStep)(
        op,
        ((_PARENT,) + rest, ()),
        dtype_name(out[3]),
        out[0],
        inverse_op,
        (inputs + inverse_rest, ()) if inverse_op else None,
        error,
        parent if inverse_op is None else None,
    )


class _Slice(ViewStep):
    """``aten.slice``. A range that lies within one operand of a pending ``cat`` along the same
    dimension is read from that operand: a sequence grown by ``torch.cat`` every step and read
    at its end (``ids[:, -1:]``) then reads the last step's tokens, not the whole sequence, so
    the graph that reads them keeps its shapes while the sequence grows (issue 34)."""

    __slots__ = ()

    def access(self, parent: Node) -> Node:
        if parent.op == _CAT:  # the one test every slice read pays
            dim, start, end, step = self.arg[0][1:]
            size = _cat_size(parent, dim)
            plain = all(v is None or type(v) is int for v in (start, end))
            if size is not None and plain and type(step) is int and step > 0:
                start = _bound(0 if start is None else start, size)
                end = _bound(size if end is None else end, size)
                found = _cat_operand(parent, dim, start, end) if start < end else None
                if found is not None:
                    piece, offset, dim = found
                    arg = ((_PARENT, dim, start - offset, end - offset, step), ())
                    return Node(self.op, (piece,), arg, self.dtype, self.shape)
        return Node(self.op, (parent,), self.arg, self.dtype, self.shape)


class _Select(ViewStep):
    """``aten.select``, read from the one operand of a pending ``cat`` that holds the index, as
    ``_Slice`` is."""

    __slots__ = ()

    def access(self, parent: Node) -> Node:
        if parent.op == _CAT:
            dim, index = self.arg[0][1:]
            size = _cat_size(parent, dim)
            if size is not None and type(index) is int and -size <= index < size:
                index %= size
                found = _cat_operand(parent, dim, index, index + 1)
                if found is not None:
                    piece, offset, dim = found
                    arg = ((_PARENT, dim, index - offset), ())
                    return Node(self.op, (piece,), arg, self.dtype, self.shape)
        return Node(self.op, (parent,), self.arg, self.dtype, self.shape)


_CAT = "aten.cat.default"


def _cat_size(parent: Node, dim: Any) -> int | None:
    """The size of dimension ``dim`` of ``parent``, a pending cat, when it concatenates along
    ``dim`` (given by position, as the cat handler records it); None otherwise."""
    if type(dim) is not int or parent.num_outputs != 1:
        return None
    (args, kwargs), rank = parent.arg, len(parent.shape)
    if kwargs or not -rank <= dim < rank:
        return None
    along = args[1] if len(args) > 1 else 0
    if type(along) is not int or along % rank != dim % rank:
        return None
    return parent.shape[dim]


def _cat_operand(parent: Node, dim: int, start: int, end: int) -> tuple[Node, int, int] | None:
    """The operand of the cat ``parent`` that holds elements ``[start, end)`` of its dimension
    ``dim``, where that operand starts, and ``dim`` counted from 0; None where the range crosses
    operands or an operand differs in rank or dtype (an operand promoted by the cat)."""
    dim %= len(parent.shape)
    offset = 0
    for marker in parent.arg[0][0]:
        if type(marker) is not Operand:
            return None
        piece = parent.src[marker.i]
        if len(piece.shape) != len(parent.shape) or piece.dtype != parent.dtype:
            return None
        size = piece.shape[dim]
        if offset <= start and end <= offset + size:
            return piece, offset, dim
        offset += size
    return None


def _bound(i: int, size: int) -> int:
    """A slice bound counted from 0 and clamped to ``[0, size]``, as eager's slice does."""
    return min(max(i + size if i < 0 else i, 0), size)


_STEP_TYPES = {"aten.slice.Tensor": _Slice, "aten.select.int": _Select}


def _args(args: tuple, kwargs: dict, names: Sequence[str], defaults: Sequence[Any]) -> tuple:
    """The arguments after ``self`` by position or name, with schema defaults filled in."""
    values = list(args[1:]) + [kwargs.get(n, d) for n, d in zip(names, defaults)][len(args) - 1 :]
    return tuple(_plain(v) for v in values[: len(names)])


def _reshaping(name: str) -> Builder:
    # view, squeeze, unsqueeze, _reshape_alias: the write-back reshapes to the parent's shape.
    def build(args, kwargs, out, parent):
        rest = tuple(_plain(a) for a in args[1:])
        return [_step(name, rest, out, "aten.view.default", (parent[0],))]

    return build


def _view_dtype(args, kwargs, out, parent):
    return [
        _step(
            "aten.view.dtype",
            (dtype_name(args[1]),),
            out,
            "aten.view.dtype",
            (dtype_name(parent[3]),),
        )
    ]


def _transpose(args, kwargs, out, parent):
    rest = tuple(_plain(a) for a in args[1:])
    return [_step("aten.transpose.int", rest, out, "aten.transpose.int", rest)]


def _t(args, kwargs, out, parent):
    return [_step("aten.t.default", (), out, "aten.t.default")]


def _permute(args, kwargs, out, parent):
    dims = tuple(d % max(len(parent[0]), 1) for d in _plain(args[1]))
    inverse = tuple(sorted(range(len(dims)), key=dims.__getitem__))
    return [_step("aten.permute.default", (dims,), out, "aten.permute.default", (inverse,))]


def _complex_view(name: str, inverse: str) -> Builder:
    # view_as_real / view_as_complex: each writes back through the other.
    def build(args, kwargs, out, parent):
        return [_step(name, (), out, inverse)]

    return build


def _expand(args, kwargs, out, parent):
    rest = tuple(_plain(a) for a in args[1:])
    # Broadcast dimensions repeat elements; eager forbids writes only when one is really repeated.
    inverse = None if not _window.distinct(out[:3]) else "aten.view.default"
    return [_step("aten.expand.default", rest, out, inverse, (parent[0],), OVERLAP_ERROR, parent)]


def _slice(args, kwargs, out, parent):
    rest = _args(args, kwargs, ("dim", "start", "end", "step"), (0, None, None, 1))
    return [_step("aten.slice.Tensor", rest, out, "aten.slice_scatter.default", rest)]


def _select(args, kwargs, out, parent):
    rest = _args(args, kwargs, ("dim", "index"), (None, None))
    return [_step("aten.select.int", rest, out, "aten.select_scatter.default", rest)]


def _diagonal(args, kwargs, out, parent):
    rest = _args(args, kwargs, ("offset", "dim1", "dim2"), (0, 0, 1))
    return [_step("aten.diagonal.default", rest, out, "aten.diagonal_scatter.default", rest)]


def _unfold(args, kwargs, out, parent):
    rest = _args(args, kwargs, ("dimension", "size", "step"), (None, None, None))
    overlapping = rest[2] < rest[1] and out[0][rest[0] % max(len(parent[0]), 1)] > 1
    inverse = None if overlapping and _window.numel(out[0]) else "lazy.unfold_scatter"
    return [_step("aten.unfold.default", rest, out, inverse, rest, OVERLAP_ERROR, parent)]


def _as_strided(args, kwargs, out, parent):
    """Strides and offset address the storage's memory. A window inside the input's own elements
    reads them by address (the input's layout says where each lies, whatever the layout of the
    storage's value); any other reads the storage's value as laid out contiguously."""
    rest = _args(args, kwargs, ("size", "stride", "storage_offset"), (None, None, None))
    if rest[2] is None:  # eager keeps the input's own storage offset
        rest = (rest[0], rest[1], parent[2])
    distinct = _window.distinct(rest)
    if _window.positions(parent[:3], rest) is not None:
        layouts = (parent[:3], rest)
        inverse = "lazy.memory_window_scatter" if distinct else None
        return [_step("lazy.memory_window", layouts, out, inverse, layouts, OVERLAP_ERROR, parent)]
    inverse = "aten.as_strided_scatter.default" if distinct else None
    return [_step(STORAGE_STEP, rest, out, inverse, rest, OVERLAP_ERROR)]


# The step of a view that applies to its storage's value rather than to its input's.
STORAGE_STEP = "aten.as_strided.default"


def write(target: Any, node: Any) -> None:
    """Make ``node`` the value of lazy tensor ``target`` (maybe a view): an Assign through its view
    steps. Where one of them has no inverse (an expand that repeats elements, overlapping unfold
    windows), ``target`` is written by address into the value that step reads, unless two of its
    own elements share memory: then eager's error."""
    view = target._lazy
    try:
        view.assign(node)
        return
    except NotWritable as e:
        error = str(e)
    steps = view.steps
    k = next(i for i, s in enumerate(steps) if s.inverse_op is None)
    source, meta = steps[k].source, target._meta
    if source is None or source.dtype != meta.dtype or not _window.distinct(meta[:3]):
        raise RuntimeError(error) from None
    prefix = view.storage
    for step in steps[:k]:
        prefix = prefix.then(step)
    layouts = (source[:3], meta[:3])
    step = _step("lazy.memory_window", layouts, meta, "lazy.memory_window_scatter", layouts)
    prefix.assign(step.write(prefix.node, node))


def _split_steps(dim: int, sizes: Sequence[int], outs: Sequence[Meta], parent: Meta):
    dim = dim % len(parent[0])
    steps, start = [], 0
    for n, out in zip(sizes, outs):
        rest = (dim, start, start + n, 1)
        steps.append(_step("aten.slice.Tensor", rest, out, "aten.slice_scatter.default", rest))
        start += n
    return steps


def _split(args, kwargs, outs, parent):
    dim = _args(args, kwargs, ("split_size", "dim"), (None, 0))[1]
    d = dim % len(parent[0])
    return _split_steps(dim, [o[0][d] for o in outs], outs, parent)


def _split_with_sizes(args, kwargs, outs, parent):
    sizes, dim = _args(args, kwargs, ("split_sizes", "dim"), (None, 0))
    return _split_steps(dim, sizes, outs, parent)


def _unbind(args, kwargs, outs, parent):
    dim = _args(args, kwargs, ("dim",), (0,))[0] % len(parent[0])
    return [
        _step("aten.select.int", (dim, i), out, "aten.select_scatter.default", (dim, i))
        for i, out in enumerate(outs)
    ]


VIEWS: dict[Any, Builder] = {
    aten.view.default: _reshaping("aten.view.default"),
    aten._reshape_alias.default: _reshaping("aten._reshape_alias.default"),
    # Shares its input's storage as ``view`` does (composite out= kernels such as ``kron_out``
    # write their result through it); only autograd treats it as a new tensor.
    aten._unsafe_view.default: _reshaping("aten._unsafe_view.default"),
    aten.squeeze.default: _reshaping("aten.squeeze.default"),
    aten.squeeze.dim: _reshaping("aten.squeeze.dim"),
    aten.squeeze.dims: _reshaping("aten.squeeze.dims"),
    aten.unsqueeze.default: _reshaping("aten.unsqueeze.default"),
    aten.view.dtype: _view_dtype,
    aten.view_as_real.default: _complex_view(
        "aten.view_as_real.default", "aten.view_as_complex.default"
    ),
    aten.view_as_complex.default: _complex_view(
        "aten.view_as_complex.default", "aten.view_as_real.default"
    ),
    aten.transpose.int: _transpose,
    aten.t.default: _t,
    aten.permute.default: _permute,
    aten.expand.default: _expand,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.diagonal.default: _diagonal,
    aten.unfold.default: _unfold,
    aten.as_strided.default: _as_strided,
    aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.unbind.int: _unbind,
}
# Views that may address the storage itself rather than their input's value (``STORAGE_STEP``).
STORAGE_RELATIVE = frozenset({aten.as_strided.default})
