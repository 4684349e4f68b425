"""User call sites: the innermost frame outside torch and this backend, for metrics and errors."""

from __future__ import annotations

import os
import sys

import torch

_PACKAGES = ("lazy_torch", "lazy_core", "runtime", "lowerings")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,) + tuple(
    os.path.join(_ROOT, p) + os.sep for p in _PACKAGES
)


def user_site() -> str:
    """``file:line`` of the innermost frame outside torch and this backend."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_OWN_DIRS) and not path.startswith("<"):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
