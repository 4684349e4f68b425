"""The backend's per-process state about ops, in one object: ``BACKEND``.

As torchax's environment holds its op table, ``BACKEND`` holds what the lazy device has learned
about aten ops: each op's handler (dispatch.py resolves it at the op's first call), each op's
recording plan (recording.py), the shape memo (shapes.py) and the view memo (recording.py). Every
module that reads one of them imports this module, which imports nothing of the package, so the
tables need no module above their readers. The C recording path holds the same dicts
(recording.configure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Backend:
    """The handler table and the memos. Their keys are type-exact: ops by identity (OpOverloads
    live for the whole process, and their ``__hash__`` is Python code), memo entries by
    ``(op name, type-exact digest)`` (lazy_core/digest.py), so ``8`` and ``8.0``, ``True`` and
    ``1``, ``0.0`` and ``-0.0`` are different calls."""

    __slots__ = ("handlers", "meta_cache", "plans", "view_cache")

    def __init__(self) -> None:
        # id(op) -> handler(func, args, kwargs), resolved once.
        self.handlers: dict[int, Callable[[Any, tuple, dict], Any]] = {}
        # id(op) -> its RECORD Plan (lazy_torch._native.Plan).
        self.plans: dict[int, Any] = {}
        # Shape memo: (op name, digest of template and operand keys) -> (Meta or Metas, template).
        self.meta_cache: dict[tuple[str, int], tuple] = {}
        # View memo: (op name, digest of its arguments' metadata) -> (Meta or Metas, view steps).
        self.view_cache: dict[tuple[str, int], tuple] = {}

    def sizes(self) -> dict[str, int]:
        """How many entries each table holds."""
        return {name: len(getattr(self, name)) for name in self.__slots__}


BACKEND = Backend()
