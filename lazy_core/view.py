"""Views as pure Access/Assign: a tensor is a window (a chain of view steps) on a storage.

Reading a view applies its steps to the storage's current value (Access). Writing through a view
applies each step's inverse from the innermost outwards (Assign), producing the storage's new
value, so every other view of the same storage sees the write. Nothing in the IR mutates.
"""

from __future__ import annotations

from typing import Any

from lazy_core.ir import Node, _native
from lazy_core.value import Storage


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


class PyView:
    """What a tensor holds: its storage and the view steps from the storage's value to its own.

    A tensor that is not a view has no steps and reads the storage's value directly. The C
    extension's View (lazy_core/csrc/storage.cpp) is the one used when it is built: the same
    attributes and methods, and outside the cycle collector.
    """

    __slots__ = ("storage", "steps")

    def __init__(self, storage: Storage, steps: tuple[ViewStep, ...] = ()):
        self.storage = storage
        self.steps = steps

    @property
    def device(self) -> Any:
        return self.storage.device

    @property
    def node(self) -> Node:
        """The current value: an Access of the storage's current value."""
        storage = self.storage
        if not self.steps:
            return storage.node
        # Cached on the storage, per value: every view with these steps shares one Access node.
        cache = storage.views
        if cache is None:
            cache = storage.views = {}
        node = cache.get(self.steps)
        if node is None:
            node = storage.node
            for step in self.steps:
                node = step.access(node)
            cache[self.steps] = node
        return node

    def assign(self, value: Node) -> None:
        """Make ``value`` (shape and dtype of this view) the view's value: an Assign to the base."""
        if not self.steps:
            self.storage.set(value)
            return
        parents = [self.storage.node]
        for step in self.steps[:-1]:
            parents.append(step.access(parents[-1]))
        new = value
        for step, parent in zip(reversed(self.steps), reversed(parents)):
            new = step.write(parent, new)
        self.storage.set(new)
        self.storage.views = {self.steps: value}  # reading the view back gives what was written

    def then(self, step: ViewStep) -> PyView:
        """A view of this view."""
        return PyView(self.storage, self.steps + (step,))

    @property
    def writable(self) -> bool:
        return all(s.inverse_op is not None for s in self.steps)


View: Any = _native.View if _native is not None else PyView
