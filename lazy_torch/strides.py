"""Output strides as eager CPU gives them: each op replayed once per shape-memo signature.

Shape inference (shapes.py's ``memo_entry``) runs an op on meta tensors, whose layout rules differ
from eager CPU's where a size-1 or size-0 dim is involved (TensorIterator keeps a dense input's
strides verbatim, size-1 dims included: ``torch.empty_strided((1, 8), (1, 1)) + 1`` has strides
(1, 1), the meta kernel's (8, 1)), and in Python-registered meta functions (``empty_like`` of an
empty tensor, ``index`` of overlapping windows, batch norm of a permuted input, FFTs). Strides are
observable (``stride()``, ``view``, ``as_strided``), so on a memo miss the op also runs in eager
CPU PyTorch on stand-ins with the lazy tensors' exact sizes, strides and offsets (zeros), and each
output takes eager's strides and offset where its shape and dtype agree with the meta kernel's.
The memo then holds eager's layout: memo hits, and the C dispatch that reads the same memo, pay
nothing.

Calls too large to replay at full size are replayed on stand-ins with fewer elements per dim
(see "Larger calls" below) when the op's kernel cannot be led out of bounds by them: pointwise
ops, reductions, and a few more (``_SHRINKABLE_OPS``); other large calls keep the meta kernel's
layout. Full-size stand-ins are consistent with each other as the lazy tensors are, and zeros are
in range as an index or offset wherever any value is (the dtype checks replay on zeros too).

Not replayed, keeping the meta kernel's layout: ops that write their arguments (in-place, out=:
their outputs are those arguments) or return views of them (views.py makes those), and ops of
other libraries (a collective would wait for its peers). A replay that raises (zeros make a
singular matrix) or gives another shape (zeros as data) keeps the meta kernel's result: the
replay never raises at the user's line. Random ops run with eager's CPU generator state saved
and restored, so they draw nothing from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from lazy_torch.resize import extent
from lazy_torch.tensor import LazyTensor, Meta, is_meta, meta_of

# Calls whose tensors (their storages' extents, and the outputs) hold at most this many elements
# in all are replayed at full size: a few microseconds to a millisecond, once per signature.
FULL_SIZE_MAX = 1 << 16

# id(op) -> whether its outputs can take eager's layout from a replay (see _replayable).
_REPLAYABLE: dict[int, bool] = {}


def output_meta(func: Any, args: tuple, kwargs: dict, result: Any) -> Any:
    """The output metadata of a call of ``func`` whose meta kernel gave ``result``: a Meta, None,
    or a tuple (list) of those for multi-output ops, with strides and offsets as eager CPU's."""
    meta = _metas(result)
    replayable = _REPLAYABLE.get(id(func))
    if replayable is None:
        replayable = _REPLAYABLE[id(func)] = _replayable(func)
    if not replayable or meta is None:
        return meta
    seeded = torch.Tag.nondeterministic_seeded in func.tags
    if _cheap(args, kwargs, meta):
        eager = _replay(func, _cpu(args, _standin), _cpu(kwargs, _standin), seeded)
        return meta if eager is None else _merged(meta, eager)
    if not _shrinkable(func):
        return meta
    return _shrunk_replay(func, args, kwargs, meta, seeded)


def _metas(out: Any) -> Any:
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return meta_of(out)
    if isinstance(out, (list, tuple)) and all(
        o is None or isinstance(o, torch.Tensor) for o in out
    ):
        metas = [_metas(o) for o in out]
        return tuple(metas) if isinstance(out, tuple) else metas
    raise NotImplementedError(f"output of type {type(out).__name__} needs a fallback")


def _cheap(args: tuple, kwargs: dict, meta: Any) -> bool:
    """Whether the call is small enough to replay at full size."""
    return _elements((args, tuple(kwargs.values()))) + _output_elements(meta) <= FULL_SIZE_MAX


def _replayable(func: Any) -> bool:
    schema = func._schema
    if func.namespace != "aten" or not schema.returns:
        return False
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False  # in-place or out=: the outputs are arguments, with their layouts
    return all(r.alias_info is None for r in schema.returns)  # views: views.py


def _elements(v: Any) -> int:
    if type(v) is LazyTensor:
        return extent(v._meta)
    if isinstance(v, (list, tuple)):
        return sum(_elements(x) for x in v)
    return 0


def _output_elements(meta: Any) -> int:
    if is_meta(meta):
        n = 1
        for s in meta.shape:
            n *= s
        return n
    return sum(_output_elements(m) for m in meta if m is not None)


def _standin(t: LazyTensor) -> torch.Tensor:
    """Zeros laid out as ``t`` is, on a storage just large enough."""
    meta = t._meta
    shape, stride, offset, dtype = meta
    return torch.zeros(max(extent(meta), offset), dtype=dtype).as_strided(shape, stride, offset)


def _cpu(v: Any, standin: Callable[[LazyTensor], torch.Tensor]) -> Any:
    """``v`` with CPU stand-ins (``standin``) for lazy tensors, as eager CPU takes it."""
    if type(v) is LazyTensor:
        return standin(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu(x, standin) for x in v)
    if isinstance(v, dict):
        return {k: _cpu(x, standin) for k, x in v.items()}
    if isinstance(v, torch.device) and v.type == "lazy":
        return torch.device("cpu")
    if isinstance(v, str) and v.startswith("lazy"):
        return "cpu"
    if isinstance(v, torch.Generator):
        return None  # the default generator, whose state the replay restores
    return v  # CPU scalars keep their values and wrapped-number flags


def _replay(func: Any, args: tuple, kwargs: dict, seeded: bool) -> Any:
    """``func``'s result in eager CPU PyTorch on these arguments, or None where eager raises."""
    threads = torch.get_num_threads()
    # One thread: a replay is small, and waking the intra-op pool costs more than it saves (tens
    # of milliseconds where another process holds the other cores).
    torch.set_num_threads(1)
    try:
        with (
            torch._C._DisableTorchDispatch(),
            torch.autocast("cpu", enabled=False),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            result: list = []
            if seeded:
                with torch.random.fork_rng(devices=[]):
                    _Quiet.apply(func, args, kwargs, result)
            else:
                _Quiet.apply(func, args, kwargs, result)
            return result[0]
    except Exception:  # noqa: BLE001 (zeros may be data eager refuses: keep the meta kernel's)
        return None
    finally:
        torch.set_num_threads(threads)


class _Quiet(torch.autograd.Function):
    """Calls an op where its C++ warnings become Python warnings at once, which the replay's
    filter drops: a ``torch.ops`` call installs no warning handler of its own, so they would
    wait for the handler of the user's call and reach the user; ``apply``'s binding installs
    one."""

    @staticmethod
    def forward(ctx: Any, func: Any, args: tuple, kwargs: dict, result: list) -> None:
        result.append(func(*args, **kwargs))


def _merged(meta: Any, eager: Any) -> Any:
    """``meta`` with eager's strides and offset for each output whose shape and dtype agree."""
    if is_meta(meta):
        if isinstance(eager, torch.Tensor) and eager.layout == torch.strided:
            got = meta_of(eager)
            if got.shape == meta.shape and got.dtype == meta.dtype:
                return got
        return meta
    if not isinstance(eager, (list, tuple)) or len(eager) != len(meta):
        return meta
    merged = [m if m is None else _merged(m, e) for m, e in zip(meta, eager)]
    return tuple(merged) if isinstance(meta, tuple) else merged


# ----------------------------------------------------------------------------------------------
# Larger calls: stand-ins with their sizes of 2 or more shrunk to 2, 3, ... by rank among the
# call's sizes (sizes 0 and 1 kept; equal sizes stay equal, a larger one stays larger), strides
# re-derived so that every relation eager's layout rules test holds as it does at full size: the
# order of the strides, which dims continue a dense run and which leave a gap, zero strides, and
# where a size-1 dim's stride falls among them. An output's dims then take their order back to
# the real sizes, or the layout of the input eager gave it.


# Ops replayed on shrunk stand-ins besides TensorIterator's pointwise ops and reductions: those
# whose tensors' sizes relate only by equality (matching and broadcast dims), which the shrinking
# keeps, and whose kernels take no size or position from data. Other kernels may rely on sizes
# that relate otherwise (a CTC loss's alphas have 2 * target length + 1 entries; a convolution's
# output size follows from its input's and kernel's): on shrunk stand-ins they may read out of
# bounds, as _ctc_loss_backward did (a segmentation fault), so their larger calls keep the meta
# kernel's layout.
_SHRINKABLE_OPS = frozenset(
    (
        "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
        "randint_like", "clone", "_to_copy", "cat", "mm", "addmm", "bmm", "baddbmm",
        "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
        "native_layer_norm", "native_layer_norm_backward",
    )
)  # fmt: skip
_SHRINKABLE: dict[int, bool] = {}


def _shrinkable(func: Any) -> bool:
    shrinkable = _SHRINKABLE.get(id(func))
    if shrinkable is None:
        tags = func.tags
        shrinkable = _SHRINKABLE[id(func)] = (
            torch.Tag.pointwise in tags
            or torch.Tag.reduction in tags
            or func._opname in _SHRINKABLE_OPS
        )
    return shrinkable


# Arguments that name sizes of the call's tensors (layer norm's trailing dims): they shrink with
# them. Other integers (kernel sizes, paddings, output sizes) stay: where the shrunk tensors do
# not fit them, the replay fails and the meta kernel's layout stays.
_SIZE_ARGUMENTS = frozenset({"normalized_shape"})


class _Unshrinkable(Exception):
    """A layout whose relations the shrunk sizes cannot keep (overlapping windows)."""


def _shrink(meta: Meta, sizes: dict[int, int]) -> Meta:
    """The shrunk layout of a tensor of ``meta``; ``sizes``: each real size's shrunk one."""
    shape, stride, offset, dtype = meta
    small_shape = tuple(sizes.get(n, n) for n in shape)
    small = [0] * len(shape)
    # (real, shrunk) pairs of the values a size-1 dim's stride is compared with, increasing.
    points = [(0, 0), (1, 1)]
    dense, small_dense = 1, 1  # the stride that would continue a dense run
    for st, d in sorted((st, d) for d, (n, st) in enumerate(zip(shape, stride)) if n > 1 and st):
        if st < dense:
            raise _Unshrinkable
        s = small_dense if st == dense else small_dense + 1  # a gap stays a gap
        small[d] = s
        dense, small_dense = st * shape[d], s * small_shape[d]
        points += [(st, s), (dense, small_dense)]
    for d, n in enumerate(shape):
        if n < 2:
            small[d] = _placed(stride[d], points)
    return Meta(small_shape, tuple(small), min(offset, 1), dtype)


def _placed(value: int, points: list[tuple[int, int]]) -> int:
    """``value``'s shrunk counterpart: the same place among ``points``."""
    below = points[0]
    for real, small in points:
        if real == value:
            return small
        if real > value:
            if small - below[1] < 2:
                raise _Unshrinkable
            return below[1] + 1
        below = (real, small)
    return below[1] + 1


def _lazy_tensors(v: Any, found: list) -> list:
    if type(v) is LazyTensor:
        found.append(v)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _lazy_tensors(x, found)
    elif isinstance(v, dict):
        _lazy_tensors(tuple(v.values()), found)
    return found


def _shrunk_replay(func: Any, args: tuple, kwargs: dict, meta: Any, seeded: bool) -> Any:
    tensors = _lazy_tensors((args, kwargs), [])
    if not tensors:
        return meta  # a factory: its sizes are its arguments
    ranked = sorted({n for t in tensors for n in t._meta.shape if n > 1})
    sizes = {n: 2 + i for i, n in enumerate(ranked)}
    try:
        layouts = {id(t): (t._meta, _shrink(t._meta, sizes)) for t in tensors}
    except _Unshrinkable:
        return meta

    args, kwargs = _with_shrunk_sizes(func, args, kwargs, sizes)

    def standin(t: LazyTensor, device: str) -> torch.Tensor:
        small = layouts[id(t)][1]
        size = max(extent(small), small.offset)
        return torch.zeros(size, dtype=small.dtype, device=device).as_strided(*small[:3])

    # The meta kernel first: the shrunk outputs must be small (an output's sizes may be
    # arguments, new_zeros's), and must be made.
    meta_args = _meta_device(_cpu(args, lambda t: standin(t, "meta")))
    meta_kwargs = _meta_device(_cpu(kwargs, lambda t: standin(t, "meta")))
    small = _replay(func, meta_args, meta_kwargs, False)
    if small is None or _output_elements(_metas_or_none(small)) > FULL_SIZE_MAX:
        return meta
    cpu_args = _cpu(args, lambda t: standin(t, "cpu"))
    eager = _replay(func, cpu_args, _cpu(kwargs, lambda t: standin(t, "cpu")), seeded)
    return meta if eager is None else _grown(meta, eager, list(layouts.values()))


def _with_shrunk_sizes(func: Any, args: tuple, kwargs: dict, sizes: dict) -> tuple[tuple, dict]:
    """The arguments with those that name sizes of the tensors (``_SIZE_ARGUMENTS``) shrunk as
    the tensors' sizes are."""
    names = _argument_names(func)
    args = tuple(
        _shrunk_ints(v, sizes) if names[i] in _SIZE_ARGUMENTS else v for i, v in enumerate(args)
    )
    kwargs = {k: _shrunk_ints(v, sizes) if k in _SIZE_ARGUMENTS else v for k, v in kwargs.items()}
    return args, kwargs


def _shrunk_ints(v: Any, sizes: dict) -> Any:
    if isinstance(v, (list, tuple)):
        return type(v)(sizes.get(n, n) if type(n) is int else n for n in v)
    return v


_ARGUMENT_NAMES: dict[int, tuple[str, ...]] = {}


def _argument_names(func: Any) -> tuple[str, ...]:
    names = _ARGUMENT_NAMES.get(id(func))
    if names is None:
        names = _ARGUMENT_NAMES[id(func)] = tuple(a.name for a in func._schema.arguments)
    return names


def _meta_device(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return type(v)(_meta_device(x) for x in v)
    if isinstance(v, dict):
        return {k: _meta_device(x) for k, x in v.items()}
    if isinstance(v, torch.device) or (isinstance(v, str) and v == "cpu"):
        return torch.device("meta")
    return v


def _metas_or_none(out: Any) -> Any:
    try:
        return _metas(out)
    except NotImplementedError:
        return None


def _grown(meta: Any, eager: Any, layouts: list) -> Any:
    """``meta`` with the layout each output's shrunk replay ``eager`` maps back to, where the
    shrunk output matches: same dtype and number of dims, sizes 0 and 1 in the same places."""
    if not is_meta(meta):
        if not isinstance(eager, (list, tuple)) or len(eager) != len(meta):
            return meta
        grown = [m if m is None else _grown(m, e, layouts) for m, e in zip(meta, eager)]
        return tuple(grown) if isinstance(meta, tuple) else grown
    shape, _, _, dtype = meta
    if (
        not isinstance(eager, torch.Tensor)
        or eager.layout != torch.strided
        or eager.dtype != dtype
        or eager.dim() != len(shape)
        or any(min(n, 2) != min(e, 2) for n, e in zip(shape, eager.shape))
    ):
        return meta
    small = meta_of(eager)
    # Eager gave it an input's strides (TensorIterator's fast path, empty_like), and offset
    # (*_scatter), or a new dense layout.
    kept = {
        (real.stride, real.offset if small.offset else 0)
        for real, shrunk in layouts
        if real.shape == shape and shrunk[:2] == small[:2] and small.offset in (0, shrunk.offset)
    }
    if kept:
        return Meta(shape, *kept.pop(), dtype) if len(kept) == 1 else meta
    stride = _dense_stride_back(shape, small) if small.offset == 0 else None
    return meta if stride is None else Meta(shape, stride, 0, dtype)


def _dense_stride_back(shape: tuple, small: Meta) -> tuple | None:
    """The strides of a new dense tensor of ``shape`` whose dims lie in the order of the shrunk
    output ``small``'s, or None where ``small`` is not dense."""
    if 0 in shape:
        return None
    small_shape, small_stride = small[:2]
    stride = [0] * len(shape)
    grown = {1: 1}  # shrunk running product -> real one
    dense, real_dense = 1, 1
    for st, d in sorted(
        (st, d) for d, (n, st) in enumerate(zip(small_shape, small_stride)) if n > 1
    ):
        if st != dense:
            return None
        stride[d] = real_dense
        dense, real_dense = dense * small_shape[d], real_dense * shape[d]
        grown[dense] = real_dense
    for d, n in enumerate(small_shape):
        if n < 2:
            st = small_stride[d]
            if st and st not in grown:
                return None
            stride[d] = grown[st] if st else 0
    return tuple(stride)
