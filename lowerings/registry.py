"""The lowering table: IR op name -> function that emits StableHLO through jax.numpy / jax.lax.

Conventions every lowering follows (see lowerings/__init__.py for the full contract):

- A lowering is ``fn(ctx, *args, **kwargs)`` where args/kwargs are the aten call's arguments as
  PyTorch passes them to ``__torch_dispatch__`` (trailing defaults omitted, kwarg-only arguments as
  keywords). Tensors arrive as JAX arrays, ``Scalar`` arguments as JAX 0-d arrays or Python numbers,
  lists as tuples, dtypes as names (``"float32"``); devices, layouts and memory formats as strings.
- Lowerings never infer shapes: the node's output shapes and dtypes are in ``ctx``.
- A multi-output op returns a tuple in aten's return order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

LOWERINGS: dict[str, Callable[..., Any]] = {}


def lowering(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as the lowering of every op in ``names``.

    >>> @lowering("aten.neg.default")
    ... def _neg(ctx, x):
    ...     return -x
    """

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"lowering for {name!r} registered twice")
            LOWERINGS[name] = fn
        return fn

    return register


def category(op: str) -> str | None:
    """The lowering module that registered ``op`` (``"elementwise"``, ...), None when unlowered.

    >>> import lowerings
    >>> category("aten.add.Tensor"), category("aten.no_such_op.default")
    ('elementwise', None)
    """
    fn = LOWERINGS.get(op)
    if fn is None:
        return None
    while isinstance(fn, functools.partial):  # a partial's own __module__ is "functools"
        fn = fn.func
    return fn.__module__.rpartition(".")[2]


_PRECISIONS = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "medium": jax.lax.Precision.DEFAULT,
}


class LoweringContext:
    """What a lowering may know about the node it lowers besides its operands."""

    __slots__ = ("_scalar_ids", "dtypes", "platform", "precision", "rng_key", "shapes")

    def __init__(
        self,
        shapes: tuple[tuple[int, ...], ...],
        dtypes: tuple[str, ...],
        precision: str = "highest",
        rng_key: Any = None,
        scalars: tuple[Any, ...] = (),
        platform: str = "cpu",
    ):
        # None marks an output the op does not produce (e.g. a False entry of an output_mask).
        self.shapes = tuple(None if s is None else tuple(s) for s in shapes)
        self.dtypes = tuple(None if d is None else np.dtype(jax.numpy.dtype(d)) for d in dtypes)
        self.precision = _PRECISIONS[precision]
        self.rng_key = rng_key
        self._scalar_ids = {id(s) for s in scalars}
        # The platform the graph is lowered for (a graph's key names its device): "cpu", "tpu",
        # "cuda" or "rocm". Only a lowering with a kernel of one platform's own looks at it.
        self.platform = platform

    def output(self, i: int) -> LoweringContext:
        """The context of output ``i`` alone, for a node that lowers several ops (foreach)."""
        sub = LoweringContext.__new__(LoweringContext)
        sub.shapes, sub.dtypes = (self.shapes[i],), (self.dtypes[i],)
        sub.precision, sub.rng_key, sub._scalar_ids = self.precision, self.rng_key, self._scalar_ids
        sub.platform = self.platform
        return sub

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shapes[0]

    @property
    def dtype(self) -> np.dtype:
        return self.dtypes[0]

    def is_scalar(self, x: Any) -> bool:
        """True for a Python number argument (a wrapped number in PyTorch's promotion rules)."""
        return isinstance(x, (bool, int, float, complex)) or id(x) in self._scalar_ids
