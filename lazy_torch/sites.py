"""User call sites: the innermost frame outside torch and this backend, for metrics and errors."""

from __future__ import annotations

import os
import sys

import torch

import runtime
from lazy_core.ir import attribute_to, current_site

_PACKAGES = ("lazy_torch", "lazy_core", "runtime", "lowerings")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OWN_DIRS = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,) + tuple(
    os.path.join(_ROOT, p) + os.sep for p in _PACKAGES
)


def user_site(also: tuple[str, ...] = ()) -> str:
    """``file:line`` of the innermost frame outside torch, this backend and the directories
    ``also`` (a library the backend adapts)."""
    frame = sys._getframe(1)
    skipped = _OWN_DIRS + also
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(skipped) and not path.startswith("<"):
            return f"{path}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


# Whether IR nodes remember the user call site that created them (LAZY_DEBUG, LAZY_DUMP_DIR and
# ``lazy_torch.debug.explain`` turn it on; it costs a frame walk per op).
recording: bool = runtime.config.DEBUG or bool(runtime.config.DUMP_DIR)


def record_sites(on: bool) -> bool:
    """Make new IR nodes remember their user call site (or stop); returns the previous setting."""
    global recording
    previous, recording = recording, on
    return previous


def call_attributed(handler, func, args, kwargs):
    """Run an op's handler with every node it creates attributed to the user's call site; ops
    it dispatches in turn (decompositions, autograd) keep the outermost op's site."""
    if current_site() is not None:
        return handler(func, args, kwargs)
    attribute_to(user_site())
    try:
        return handler(func, args, kwargs)
    finally:
        attribute_to(None)
