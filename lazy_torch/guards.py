"""The guards of ``lazy_torch.compile`` (capture.py): what a call must share with the one that was
captured for a replay to compute what the call would. Each is type-exact (8 and 8.0, True and 1,
0.0 and -0.0 differ) and holds objects by identity only while they are kept alive (``keep``), so
no other object takes their ids."""

from __future__ import annotations

import functools
import operator
import struct
import types
from collections.abc import Iterable
from typing import Any

import torch

from lazy_torch import amp
from lazy_torch.tensor import LazyTensor, extension

PLAIN = (int, float, bool, str, type(None))
_DEPTH = 8  # objects inside objects that ``arguments`` reads through
# Shared by nature, never a container of a call's data: guarded by identity.
_IDENTITY = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
             types.ModuleType, functools.partial)  # fmt: skip
_TRAINING = operator.attrgetter("training")


def describe(v: Any, keep: list) -> Any:
    """``v`` as a guard: type-exact (8 and 8.0, True and 1, 0.0 and -0.0 differ); a lazy tensor
    by its layout, gradient flag, device, storage shape and view steps; another tensor by its
    dtype, shape and device (a call given one is not captured, nor one that reads one inside an
    object it is given: ``side_effects.HostState``); any other object by its identity, appended
    to ``keep`` (held with the capture, so no other object takes its id)."""
    t = type(v)
    if t is LazyTensor:
        view = v._lazy
        storage = view.storage
        keep.append(view)  # and so its view steps
        return (v._meta, v.requires_grad, storage.device, storage.node.shape, _ids(view.steps))
    if t is float:
        return (float, v.hex())
    if v is None or t in (bool, int, str, torch.dtype, torch.device):
        return (t, v)
    if isinstance(v, torch.Tensor):  # not on the lazy device: its calls run op by op
        return (t, "not lazy", v.dtype, tuple(v.shape), v.device)
    keep.append(v)
    return (t, id(v))


def arguments(flat: list, keep: list) -> tuple[list, tuple]:
    """A call's argument leaves (``flat``, PyTorch's pytree leaves) with the contents of every
    object that holds a tensor after it, and the guard of each.

    Such an object (transformers' ``StaticCache``, its layers) is read through its attributes,
    and through lists, tuples and dicts with string keys in them: its guard is its type and
    attribute names, and each value inside is a leaf guarded as an argument, a lazy tensor by its
    layout (so a capture reads it as the argument it is, never the first call's tensor), any
    other object by identity (a tensor that is not lazy, by its layout: a call that reads one
    runs op by op). So two objects of one class holding tensors of one layout share a capture.
    An object that holds no tensor (a config, a sentinel), one with ``__slots__``, a module, an
    optimizer and an object met again inside itself are guarded by identity."""
    leaves: list = []
    described: list = []
    for v in flat:
        _visit(v, leaves, described, keep, 0, set())
    return leaves, tuple(described)


def _visit(v: Any, leaves: list, described: list, keep: list, depth: int, path: set) -> bool:
    """Append ``v`` and what it holds to ``leaves`` and their guards to ``described``; whether
    it holds a tensor."""
    t = type(v)
    header = None
    if t is not LazyTensor and depth < _DEPTH and id(v) not in path:
        if t is list or t is tuple:
            header, inner = (t, len(v)), v
        elif t is dict and all(type(k) is str for k in v):
            header, inner = (dict, tuple(v)), v.values()
        elif opened(v):
            header, inner = (t, tuple(vars(v))), vars(v).values()
    if header is None:
        leaves.append(v)
        described.append(describe(v, keep))
        return isinstance(v, torch.Tensor)
    start = len(leaves)
    leaves.append(v)
    described.append(("contents", header))
    path.add(id(v))
    found = False
    for x in list(inner):
        found = _visit(x, leaves, described, keep, depth + 1, path) or found
    path.discard(id(v))
    if not found and header[0] not in (list, tuple, dict):  # an object with nothing to read
        # through it: guarded by identity (a list, tuple or dict, by its values)
        del leaves[start + 1 :], described[start:]
        described.append(describe(v, keep))
    return found


def opened(v: Any) -> bool:
    """Whether an argument leaf is an object that ``arguments`` reads through, if it holds a
    tensor: one whose ``__dict__`` is all its state (no ``__slots__`` holding more)."""
    return (
        hasattr(v, "__dict__")
        and not isinstance(v, (*PLAIN, torch.Tensor, torch.nn.Module, torch.optim.Optimizer))
        and not isinstance(v, _IDENTITY)
        and _dict_only(type(v))
    )


@functools.cache
def _dict_only(cls: type) -> bool:
    return not any(
        set(getattr(c, "__slots__", ())) - {"__dict__", "__weakref__"} for c in cls.__mro__
    )


def aliasing(flat: list) -> tuple:
    """For each lazy tensor argument, the position of the first one sharing its storage: a
    capture reads a storage once, so calls whose arguments alias otherwise are other graphs."""
    first: dict[int, int] = {}
    return tuple(
        [
            first.setdefault(id(v._lazy.storage), k)
            for k, v in enumerate(flat)
            if type(v) is LazyTensor
        ]
    )


def _ids(objects: Any) -> tuple:
    return tuple(map(id, objects))


def plain_value(v: Any) -> tuple:
    """A plain attribute's value, type-exact: its type, and a float by its bits (0.0 and -0.0
    differ, a nan equals itself), as csrc/guards.cpp reads it."""
    return type(v), struct.unpack("q", struct.pack("d", v))[0] if type(v) is float else v


def plain_attributes(module: torch.nn.Module) -> dict[str, tuple]:
    """A module's plain attributes, type-exact (1, 1.0 and True differ)."""
    return {k: plain_value(v) for k, v in module.__dict__.items() if type(v) in PLAIN}


def changed_attribute(snapshots: Iterable[tuple[torch.nn.Module, dict]]) -> str | None:
    """Why a call cannot be replayed, if a module's plain attributes differ from its
    ``snapshots`` entry (``plain_attributes`` taken before): a replay would not change them."""
    for m, before in snapshots:
        after = plain_attributes(m)
        if after != before:
            name = next(k for k in {*before, *after} if before.get(k) != after.get(k))
            return f"it changes the attribute {type(m).__name__}.{name}"
    return None


def state() -> tuple:
    """Grad mode, autocast and the float32 matmul precision, with their names."""
    return (
        ("grad mode", torch.is_grad_enabled(), torch.is_inference_mode_enabled()),
        ("autocast", amp.is_autocast_enabled(), amp.get_autocast_dtype()),
        ("float32 matmul precision", torch.get_float32_matmul_precision()),
    )


class ModuleSet:
    """The guards of some modules: each one's ``training``; its parameters' and buffers'
    identities, their storages' (``p.data = ...`` replaces one) and ``requires_grad``; its plain
    attributes (a dropout's p, a norm's eps, which a capture keeps), type-exact (1, 1.0 and True
    differ, floats by their bits). ``read`` runs in C++ (csrc/guards.cpp, several times faster
    than Python loops; figures: benchmarks/RESULTS.md, "Capture and replay") and raises KeyError
    where an attribute was deleted since."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules = modules
        self.attributes = []  # one itemgetter per module, read in C
        for m in modules:
            names = [k for k, v in m.__dict__.items() if type(v) in PLAIN and k != "training"]
            if names:
                self.attributes.append((m.__dict__, tuple(names)))
        self.tensor_dicts = [d for m in modules for d in (m._parameters, m._buffers)]

    def read(self) -> tuple:
        """(training flags, tensor identities, attribute values) as they stand."""
        return extension.module_guards(self.tensor_dicts, self.modules, self.attributes)
