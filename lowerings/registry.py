"""The lowering table: IR op name -> function that emits StableHLO through jax.numpy / jax.lax.

Conventions every lowering follows (see lowerings/__init__.py for the full contract):

- A lowering is ``fn(ctx, *args, **kwargs)`` where args/kwargs are the aten call's arguments as
  PyTorch passes them to ``__torch_dispatch__`` (trailing defaults omitted, kwarg-only arguments as
  keywords). Tensors arrive as JAX arrays, ``Scalar`` arguments as JAX 0-d arrays or Python numbers,
  lists as tuples, dtypes as names (``"float32"``); devices, layouts and memory formats as strings.
- Lowerings never infer shapes: the node's output shapes and dtypes are in ``ctx``.
- A multi-output op returns a tuple in aten's return order.

Each op has one generic rule (every platform), declared with its category (the lowering module it
belongs to) and, for ops that address through an index tensor, its bounds check. A platform may add
a kernel of its own for an op (``platform="cuda"``): ``lowering_for`` picks it on that platform,
and the kernel declines a call by returning ``NotImplemented``, which runs the generic rule.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

Rule = Callable[..., Any]

# The platforms a kernel may be registered for, as ``LoweringContext.platform`` names them.
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What an op's generic registration declares besides its rule."""

    category: str  # the lowering module the op belongs to: "elementwise", "indexing", ...
    # Its index-bounds check, a lowerings.bounds.Bound (which reads this table), if it has one.
    bounds: Any = None


# op -> its generic rule, the one every platform runs (tests may patch entries).
LOWERINGS: dict[str, Rule] = {}
# (op, platform) -> that platform's own kernel for op, tried before the generic rule.
KERNELS: dict[tuple[str, str], Rule] = {}
# op -> its declaration; every op of LOWERINGS registered by ``lowering`` has one.
DECLARATIONS: dict[str, Declaration] = {}


def lowering(
    *names: str,
    category: str | None = None,
    platform: str | None = None,
    bounds: Any = None,
) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the lowering of every op in ``names``.

    ``category`` defaults to the module whose import runs the registration (a helper in another
    module registering for it does not change it). With ``platform``, ``fn`` is that platform's
    own kernel, a second registration of ops whose generic rule is registered already; it
    returns ``NotImplemented`` for calls it leaves to the generic rule. ``bounds`` declares the
    op's index-bounds check (lowerings/bounds.py), on the generic registration only.

    >>> @lowering("aten.neg.default")
    ... def _neg(ctx, x):
    ...     return -x
    """
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}: one of {PLATFORMS}")
    if platform is not None and bounds is not None:
        raise ValueError("bounds belong to an op's generic registration")
    declaration = None if platform else Declaration(category or _registering_module(), bounds)

    def register(fn: Rule) -> Rule:
        for name in names:
            if declaration is not None:
                _register_generic(name, fn, declaration)
            else:
                _register_kernel(name, platform, fn, category)
        return fn

    return register


def _registering_module() -> str:
    """The last part of the name of the module whose top-level code is running the registration:
    the nearest frame outside functions, above ``lowering``'s caller."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_name != "<module>":
        frame = frame.f_back
    return frame.f_globals["__name__"].rpartition(".")[2]


def _register_generic(name: str, fn: Rule, declaration: Declaration) -> None:
    if name in LOWERINGS:
        raise ValueError(f"lowering for {name!r} registered twice")
    LOWERINGS[name] = fn
    DECLARATIONS[name] = declaration


def _register_kernel(name: str, platform: str, fn: Rule, category: str | None) -> None:
    if name not in DECLARATIONS:
        raise ValueError(f"register the generic lowering of {name!r} before a {platform} kernel")
    if (name, platform) in KERNELS:
        raise ValueError(f"{platform} lowering for {name!r} registered twice")
    declared = DECLARATIONS[name].category
    if category not in (None, declared):
        raise ValueError(f"{name!r} is declared in category {declared!r}, not {category!r}")
    KERNELS[name, platform] = fn


def lowering_for(op: str, platform: str) -> Rule | None:
    """The lowering of ``op`` on ``platform``: the platform's kernel falling back to the generic
    rule where it declines, else the generic rule; None when ``op`` has none.

    >>> import lowerings
    >>> lowering_for("aten.add.Tensor", "cpu") is LOWERINGS["aten.add.Tensor"]
    True
    """
    generic = LOWERINGS.get(op)
    kernel = KERNELS.get((op, platform))
    if kernel is None or generic is None:
        return generic
    return functools.partial(_kernel_or_generic, kernel, generic)


def _kernel_or_generic(kernel: Rule, generic: Rule, ctx: Any, *args: Any, **kwargs: Any) -> Any:
    out = kernel(ctx, *args, **kwargs)
    return generic(ctx, *args, **kwargs) if out is NotImplemented else out


def category(op: str) -> str | None:
    """The declared category of ``op`` (``"elementwise"``, ...), None when unlowered.

    >>> import lowerings
    >>> category("aten.add.Tensor"), category("aten.no_such_op.default")
    ('elementwise', None)
    """
    declaration = DECLARATIONS.get(op)
    return None if declaration is None else declaration.category


def bounds_of(op: str) -> Any:
    """The index-bounds check declared with ``op``'s lowering, None where it has none."""
    declaration = DECLARATIONS.get(op)
    return None if declaration is None else declaration.bounds


_PRECISIONS = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "medium": jax.lax.Precision.DEFAULT,
}


class LoweringContext:
    """What a lowering may know about the node it lowers besides its operands."""

    __slots__ = ("_scalar_ids", "dtypes", "mesh", "platform", "precision", "rng_key", "shapes")

    def __init__(
        self,
        shapes: tuple[tuple[int, ...], ...],
        dtypes: tuple[str, ...],
        precision: str = "highest",
        rng_key: Any = None,
        scalars: tuple[Any, ...] = (),
        platform: str = "cpu",
        mesh: Any = None,
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
        # The graph's jax.sharding.Mesh where its values are laid out over several devices
        # (runtime/spmd.py), else None.
        self.mesh = mesh

    def output(self, i: int) -> LoweringContext:
        """The context of output ``i`` alone, for a node that lowers several ops (foreach)."""
        sub = LoweringContext.__new__(LoweringContext)
        sub.shapes, sub.dtypes = (self.shapes[i],), (self.dtypes[i],)
        sub.precision, sub.rng_key, sub._scalar_ids = self.precision, self.rng_key, self._scalar_ids
        sub.platform, sub.mesh = self.platform, self.mesh
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
