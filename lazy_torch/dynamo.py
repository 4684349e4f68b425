"""``torch.compile(model, backend="lazy")``: TorchDynamo finds the graphs (guards, graph breaks),
and each graph it hands over is captured and replayed by ``lazy_torch.compile`` (capture.py).

Dynamo traces a function on fake tensors, cuts it into graphs where it cannot trace (a graph
break) and hands each graph to a backend with fake example inputs. This backend returns
``lazy_torch.compile(graph)``: the graph's first call under new guards runs op by op, watched,
and later calls record one ``lazy.call`` node for its forward and one for its backward. It does
not go through AOTAutograd: capture.py records the backward itself. A graph break costs no
extra program either: the regions on both sides of it and the Python between them land in the
step's one lazy graph.

Dynamo knows nothing of device 'lazy', so it must be taught three things, all below, all applied
by ``install()`` when the backend is first looked up (``torch.compile(..., backend="lazy")``),
never at ``import lazy_torch``:

1. While Dynamo compiles a frame, a LazyTensor is a plain tensor to it. LazyTensor has
   ``__tensor_flatten__``/``__tensor_unflatten__`` (tensor.py: they make ``model.to('lazy')``
   keep shared parameters shared), which makes PyTorch take it for a traceable wrapper subclass:
   Dynamo would then fakify it by calling ``__tensor_unflatten__`` with its flatten context,
   rebuilding a real LazyTensor (holding the real value) where a fake one is needed, and guard
   on that context in Python on every call. So the two attributes are hidden while a
   ``torch._guards.CompileContext`` is active (``_OutsideCompile``), and ``VariableBuilder``
   wraps a LazyTensor as the tensor it is (its generic rule only accepts subclasses with
   PyTorch's own ``__torch_dispatch__`` or traceable wrapper subclasses).
2. ``MetaConverter`` refuses every tensor whose device type is 'lazy' (a rule kept for PyTorch's
   legacy lazy-tensor core, which is not used here): while Dynamo compiles, a LazyTensor is
   described and converted like any dense tensor, giving a FakeTensor on its lazy device.
3. Dynamo skips the frames of this project's packages: called from eager code between graphs
   (``__torch_dispatch__``, amp, fused optimizers), they run as they are, never traced.

AOTAutograd's ``__coerce_same_metadata_as_tangent__`` question never arises, as AOTAutograd is
not used. These patches were written against the torch versions in ``TORCH_VERSIONS``; on any
other, the backend refuses with a message naming ``lazy_torch.compile``, and
tests/lazy_torch/test_dynamo.py checks each patched internal, so a change of PyTorch fails there
loudly. One limit on torch 2.11 only: ``torch.tensor(data, device='lazy')`` inside a compiled
function (transformers' KV cache starts as ``torch.tensor([])``) makes its tensor with Python
modes excluded, so a real LazyTensor meets Dynamo's fake propagation and compiling the frame
raises ``TorchRuntimeError``; torch 2.13 makes the data on the CPU first and traces the copy.

Registration is cheap: importing this module puts the name "lazy" into Dynamo's backend
registry when Dynamo itself is imported (at once if it already is), without importing it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from lazy_torch import import_hooks
from lazy_torch.tensor import LazyTensor

BACKEND = "lazy"
# The minor versions of torch whose internals the patches below were written against and tested
# with: 2.13 (CPU) and 2.11 (the GPU machines).
TORCH_VERSIONS = ("2.11", "2.13")
# The packages of this project, whose frames Dynamo leaves alone.
PACKAGES = ("lazy_torch", "lazy_core", "runtime", "lowerings")
_REGISTRY = "torch._dynamo.backends.registry"

_installed = False


def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The Dynamo backend: ``gm`` captured and replayed by ``lazy_torch.compile``.

    >>> import torch, lazy_torch
    >>> model = torch.compile(torch.nn.Linear(4, 2).to("lazy"), backend="lazy")
    >>> model(torch.ones(3, 4, device="lazy")).shape
    torch.Size([3, 2])
    """
    # Passed itself (backend=lazy_torch.dynamo.backend) rather than by name, the function meets
    # Dynamo only after its first trace, which without the patches breaks the graph at every
    # lazy tensor (correct, op by op); from then on the patches are in place.
    install()
    from lazy_torch.compiled import compile

    # A _LazyGraphModule generates its forward at its first call, which then calls the module
    # again: that forward must exist before capture.py replaces the module's.
    real_recompile = getattr(gm, "real_recompile", None)
    if real_recompile is not None:
        real_recompile()
    return compile(gm)


# ----------------------------------------------------------------------------------------------
# The patches.


def _compiling() -> bool:
    """Whether Dynamo is compiling a frame in this thread."""
    from torch._guards import CompileContext

    return CompileContext.try_get() is not None


class _OutsideCompile:
    """A class attribute that is absent while Dynamo compiles a frame (reading it raises
    AttributeError, so ``hasattr`` is False), and the attribute itself otherwise."""

    def __init__(self, attribute: Any) -> None:
        self.attribute = attribute  # a function or a staticmethod, as in the class body

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        if _compiling():
            raise AttributeError("a LazyTensor is a plain tensor to TorchDynamo")
        return self.attribute.__get__(obj, cls)


def _hide_flatten() -> None:
    for name in ("__tensor_flatten__", "__tensor_unflatten__"):
        attribute = LazyTensor.__dict__[name]
        if not isinstance(attribute, _OutsideCompile):
            setattr(LazyTensor, name, _OutsideCompile(attribute))


def _patch_variable_builder() -> None:
    from torch._dynamo.variables.builder import VariableBuilder

    wrap = VariableBuilder._wrap
    if getattr(wrap, "_lazy_patch", False):
        return

    @functools.wraps(wrap)
    def _wrap(self: Any, value: Any) -> Any:
        if type(value) is LazyTensor:
            return self.wrap_tensor(value)
        return wrap(self, value)

    _wrap._lazy_patch = True
    VariableBuilder._wrap = _wrap


def _patch_meta_converter() -> None:
    from torch._dispatch.python import suspend_functionalization
    from torch._subclasses.meta_utils import MetaConverter

    call = MetaConverter.__call__
    if getattr(call, "_lazy_patch", False):
        return

    @functools.wraps(call)
    def __call__(self: Any, t: Any, shape_env: Any = None, **kwargs: Any) -> Any:
        if type(t) is not LazyTensor or not _compiling():
            return call(self, t, shape_env, **kwargs)
        # What the original does for a dense tensor, minus the refusal of device 'lazy' and its
        # structured-trace logging: describe, then build the meta (via callback, fake) tensor
        # with no functionalization in effect.
        self.hit += 1
        desc = self.describer.describe_tensor(t, trace=False)
        callback = kwargs.get("callback") or self._identity_callable
        with suspend_functionalization():
            r = self.meta_tensor(
                desc, shape_env, callback, kwargs.get("source"), kwargs.get("symbolic_context")
            )
        for name in ("_is_param", "_is_buffer", "persistent"):  # nn.Parameter, nn.Buffer marks
            if name in t.__dict__:
                setattr(r, name, t.__dict__[name])
        return r

    __call__._lazy_patch = True
    MetaConverter.__call__ = __call__


def _skip_project_frames() -> None:
    from torch._dynamo import trace_rules

    for package in PACKAGES:
        if importlib.util.find_spec(package) is not None:
            trace_rules.add(package)


def check_torch_version() -> None:
    """Raise a RuntimeError naming the alternative where this torch is not one the patches were
    written for."""
    version = ".".join(torch.__version__.split(".")[:2])
    if version not in TORCH_VERSIONS:
        raise RuntimeError(
            f'torch.compile(backend="{BACKEND}") patches internals of torch '
            f"{', '.join(TORCH_VERSIONS)} and refuses torch {torch.__version__}, whose internals "
            "it has not been checked against (tests/lazy_torch/test_dynamo.py); "
            "lazy_torch.compile(model) captures without TorchDynamo"
        )


def install() -> None:
    """Apply the patches (once): what Dynamo needs to trace functions of lazy tensors."""
    global _installed
    if _installed:
        return
    check_torch_version()
    _hide_flatten()
    _patch_variable_builder()
    _patch_meta_converter()
    _skip_project_frames()
    _installed = True


# ----------------------------------------------------------------------------------------------
# Registration of the name, without importing Dynamo.


class _EntryPoint(importlib.metadata.EntryPoint):
    """The registry's entry of "lazy": Dynamo loads it at the first lookup of the name, which
    applies the patches before Dynamo traces anything."""

    def load(self) -> Callable:
        install()
        return backend


def _add_to(registry: Any) -> None:
    if BACKEND not in registry._BACKENDS and BACKEND not in registry._COMPILER_FNS:
        registry._BACKENDS[BACKEND] = _EntryPoint(
            name=BACKEND, value=f"{__name__}:backend", group="torch_dynamo_backends"
        )


import_hooks.after_import(_REGISTRY, _add_to)
