"""Run a function on a module once it has been imported, without importing it.

lazy_torch adapts libraries it must not load at its own import (TorchDynamo takes seconds;
transformers is optional): ``after_import(name, fn)`` calls ``fn(module)`` at once when the
module is loaded, else right after the module's code has run at its first import.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

_pending: dict[str, list[Callable[[Any], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module with callbacks waiting, it wraps the loader that the
    other finders give, so the callbacks run after the module's code."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _pending:
            return None
        callbacks = _pending.pop(name)
        if not _pending:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            for callback in callbacks:
                callback(module)

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """``callback(module)`` for the module ``name``: now if it is loaded, else after its first
    import has run its code."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    _pending.setdefault(name, []).append(callback)
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
