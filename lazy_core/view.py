"""Views as pure Access/Assign: a tensor is a window (a chain of view steps) on a storage.

Reading a view applies its steps to the storage's current value (Access). Writing through a view
applies each step's inverse from the innermost outwards (Assign), producing the storage's new
value, so every other view of the same storage sees the write. Nothing in the IR mutates.
"""

from __future__ import annotations

from typing import Any

from lazy_core import _native
from lazy_core.ir import Node


class NotWritable(RuntimeError):
    """A write through a view that has no inverse (e.g. an expanded view with repeated elements)."""


class ViewStep:
    """One view, defined by its forward op and its write-back op together.

    ``access`` records ``op`` on the parent value (template operand 0); ``write`` records
    ``inverse_op`` on (parent value, new view value) = operands (0, 1) and yields the parent's new
    value. ``inverse_op`` None makes the view read-only through this chain; ``error`` is then the
    message to raise, and ``source`` (when known) the layout of the parent value, with which a
    write can still go by address (lazy_core/window.py).
    """

    __slots__ = ("op", "arg", "dtype", "shape", "inverse_op", "inverse_arg", "error", "source")

    def __init__(
        self,
        op: str,
        arg: Any,
        dtype: str,
        shape: tuple[int, ...],
        inverse_op: str | None,
        inverse_arg: Any = None,
        error: str = "",
        source: Any = None,
    ):
        self.op, self.arg, self.dtype, self.shape = op, arg, dtype, shape
        self.inverse_op, self.inverse_arg, self.error = inverse_op, inverse_arg, error
        self.source = source

    def access(self, parent: Node) -> Node:
        return Node(self.op, (parent,), self.arg, self.dtype, self.shape)

    def write(self, parent: Node, value: Node) -> Node:
        if self.inverse_op is None:
            raise NotWritable(self.error or f"cannot write through a view made by {self.op}")
        return Node(self.inverse_op, (parent, value), self.inverse_arg, parent.dtype, parent.shape)


# What a tensor holds (C: lazy_core/csrc/storage.cpp): ``View(storage, steps=())``, its storage
# and the view steps from the storage's value to its own. ``node`` is the current value, an
# Access of the storage's value, cached on the storage per value so every view with these steps
# shares one Access node; ``assign(value)`` writes through the steps' inverses from the innermost
# outwards (raising NotWritable where one has none), after which reading the view back gives
# what was written; ``then(step)`` is a view of the view; ``writable``: every step has an inverse.
View: Any = _native.View
