"""A captured call's result as its tensors and a recipe that rebuilds it around new ones
(capture.py): each replay returns a result of the same structure holding its own outputs.

Pytree nodes (tuples, lists, dicts, ``ModelOutput``) are taken apart by PyTorch's pytree. Any
other object is taken apart through its ``__dict__`` (transformers' ``DynamicCache``, a
dataclass that is no pytree node) and rebuilt as a new instance of its class with the rebuilt
attributes, never returned as the capture found it: it would hold the first call's tensors.
Immutable values (numbers, strings, dtypes) are returned as they are, and so are objects shared
by nature (classes, functions, modules) and objects whose ``__dict__`` holds no tensor (a
config). An object without ``__dict__`` (``__slots__``), or nested too deep, is out of sight:
``flatten`` says so, and the call runs op by op.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.utils import _pytree as pytree

# Returned by every replay as the capture found them: immutable, holding nothing.
KEPT = (
    int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.layout,
    torch.memory_format,
)  # fmt: skip
# Shared by reference, not made by a call.
_SHARED = (
    type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType,
    torch.nn.Module,
)  # fmt: skip
_DEPTH = 8  # objects inside objects

_TENSOR, _VALUE, _OBJECT, _GIVEN = range(4)


class Unrebuildable(Exception):
    """Why a result cannot be rebuilt around new tensors."""


def flatten(result: Any, given: dict[int, int]) -> tuple[list[torch.Tensor], tuple]:
    """The tensors of ``result`` in a fixed order, and the recipe ``unflatten`` rebuilds it by.
    An object the call was given (``given``: its id -> its place among the argument leaves) is
    returned as the one each replay is given, as it stands (a KV cache the call wrote into)."""
    tensors, recipe, problem = _flatten(result, given, 0)
    if problem is not None:
        raise Unrebuildable(f"it returns a {problem} object, which a replay cannot rebuild")
    return tensors, recipe


def _flatten(
    result: Any, given: dict[int, int], depth: int
) -> tuple[list[torch.Tensor], tuple, str | None]:
    """``flatten``'s tensors and recipe, and the type of a leaf it cannot rebuild (or None).

    An object that holds no tensor (a config) is returned as the capture found it, as it may
    well have existed before the call."""
    leaves, spec = pytree.tree_flatten(result)
    tensors: list[torch.Tensor] = []
    entries = []
    problem = None
    for v in leaves:
        if isinstance(v, torch.Tensor):
            entries.append((_TENSOR, len(tensors)))
            tensors.append(v)
            continue
        if isinstance(v, (*KEPT, *_SHARED)):
            entries.append((_VALUE, v))
            continue
        if id(v) in given:
            entries.append((_GIVEN, given[id(v)]))
            continue
        if not hasattr(v, "__dict__") or depth == _DEPTH:
            problem = problem or type(v).__qualname__  # what it holds is out of sight
            continue
        inner, recipe, why = _flatten(dict(vars(v)), given, depth + 1)
        if not inner:
            entries.append((_VALUE, v))
        elif why is not None:
            problem = problem or why
        elif not _makeable(type(v)):
            problem = problem or type(v).__qualname__
        else:
            entries.append((_OBJECT, type(v), recipe, len(tensors), len(inner)))
            tensors += inner
    return tensors, (spec, tuple(entries)), problem


def _makeable(cls: type) -> bool:
    """Whether ``cls.__new__(cls)`` makes an instance whose ``__dict__`` takes attributes (a
    class whose ``__new__`` needs arguments cannot be rebuilt)."""
    try:
        obj = cls.__new__(cls)
        obj.__dict__.update({})
    except Exception:  # noqa: BLE001 (any failure means: not rebuildable)
        return False
    return True


def unflatten(recipe: tuple, tensors: list[torch.Tensor], given: list) -> Any:
    """The result ``recipe`` describes, holding ``tensors`` and the objects of the argument
    leaves ``given``."""
    spec, entries = recipe
    leaves = []
    for entry in entries:
        kind = entry[0]
        if kind == _TENSOR:
            leaves.append(tensors[entry[1]])
        elif kind == _VALUE:
            leaves.append(entry[1])
        elif kind == _GIVEN:
            leaves.append(given[entry[1]])
        else:
            _, cls, inner, start, count = entry
            obj = cls.__new__(cls)
            obj.__dict__.update(unflatten(inner, tensors[start : start + count], given))
            leaves.append(obj)
    return pytree.tree_unflatten(leaves, spec)
