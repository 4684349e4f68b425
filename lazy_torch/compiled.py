"""``lazy_torch.compile``: the captures of one compiled module or function, by guards
(guards.py), and the public entry point. A call under guards seen before replays its capture
(capture.py); one under new guards is captured, or runs op by op where it cannot be.
"""

from __future__ import annotations

import functools
import operator
import types
import warnings
from collections.abc import Callable
from itertools import chain
from typing import Any

import torch
from torch.utils import _pytree as pytree

import runtime
from lazy_torch import control_flow, step_state
from lazy_torch.capture import (
    CAPTURE_LIMIT,
    EAGER,
    EAGER_IN_SESSION,
    SESSION,
    Miss,
    capture_call,
    compile_session,
)
from lazy_torch.guards import ModuleSet, aliasing, arguments, state
from lazy_torch.sites import user_site
from lazy_torch.tensor import LazyTensor

_NOT_NONE = functools.partial(operator.is_not, None)


class _Compiled:
    """The captures of one compiled function or module, by guards."""

    def __init__(self, fn: Callable, module: torch.nn.Module | None) -> None:
        self.fn = fn  # for a module: its forward, unbound
        self.module = module
        self.captures: dict[tuple, tuple] = {}  # guards -> (a Capture or EAGER or SESSION, held)
        self.last: tuple | None = None
        self.warned = False
        self.modules: list[torch.nn.Module] | None = None  # read at the first call: a copy
        # (deepcopy, torch.load) makes this object before its module has any attributes

    def _read_module(self) -> None:
        self.modules = list(self.module.modules())
        self.guarded = ModuleSet(self.modules)
        self.hook_dicts = [
            d
            for m in self.modules
            for d in (
                m._forward_hooks,
                m._forward_pre_hooks,
                m._backward_hooks,
                m._backward_pre_hooks,
            )
        ]

    def __reduce__(self) -> tuple:  # deepcopy and pickle: a fresh object, nothing captured
        return (_Compiled, (self.fn, self.module))

    def _tensors(self) -> tuple:
        """The module's parameters and buffers, as they stand."""
        dicts = self.guarded.tensor_dicts
        return tuple(filter(_NOT_NONE, chain.from_iterable(map(dict.values, dicts))))

    def _module_guards(self) -> tuple:
        """The module's and its submodules' guards (guards.ModuleSet)."""
        try:
            training, tensors, values = self.guarded.read()
        except KeyError:  # an attribute was deleted: read the module again
            self._read_module()
            return self._module_guards()
        return (("training", training), ("parameters", tensors), ("attributes", values))

    def _keep_module(self, keep: list) -> None:
        """Hold the objects whose ids the module guards hold, for as long as the capture."""
        tensors = self._tensors()
        keep += (tensors, [getattr(t, "_lazy", None) for t in tensors])

    def _hooked(self) -> bool:
        nn = torch.nn.modules.module
        if nn._global_forward_hooks or nn._global_backward_hooks:
            return True
        # A compiled function's capture watches which modules it calls (step_state.py).
        if any(h is not step_state.module_called for h in nn._global_forward_pre_hooks.values()):
            return True
        return any(map(len, self.hook_dicts))

    def __call__(self, args: tuple, kwargs: dict) -> Any:
        module = self.module
        call = self.fn if module is None else functools.partial(self.fn, module)
        if module is not None and self.modules is None:
            self._read_module()
        if control_flow.tracing():  # a loop or branch body: recorded once, into its node
            return call(*args, **kwargs)
        if module is not None and self._hooked():
            return self._op_by_op(call, args, kwargs, "the module has hooks")
        top, spec = pytree.tree_flatten((args, kwargs))
        keep: list = []
        flat, described = arguments(top, keep)
        guards = (("arguments", spec, described, aliasing(flat)), *state())
        if module is not None:
            guards += self._module_guards()
        entry = self.captures.get(guards)
        if entry is None or entry[0] is SESSION:
            if entry is not None:
                keep = entry[1]  # held since the call that synced
            elif module is not None:
                self._keep_module(keep)
            result, capture = self._capture(call, args, kwargs, guards, flat, entry is not None)
            self._keep(guards, capture, keep)
            return result
        self.last = guards  # a recapture names what changed since the previous call
        if entry[0] is EAGER:
            return call(*args, **kwargs)
        if entry[0] is EAGER_IN_SESSION:
            with compile_session():
                return call(*args, **kwargs)
        result = entry[0].replay(flat)
        if type(result) is Miss:  # a compiled step's optimizer or gradients changed
            result, capture = self._capture(call, args, kwargs, guards, flat, False, result.why)
            self._keep(guards, capture, entry[1])
        return result

    def _keep(self, guards: tuple, capture: Any, keep: list) -> None:
        """Keep what calls under ``guards`` replay, unless the call made optimizer state (its
        first step: the next call is captured)."""
        if capture is not step_state.AGAIN:
            self.captures[guards] = (capture, keep)
            self.last = guards

    def _capture(
        self,
        call: Callable,
        args: tuple,
        kwargs: dict,
        guards: tuple,
        flat: list,
        session: bool,
        missed: str | None = None,
    ) -> tuple:
        """A call under new guards (or whose replay ``missed``, saying why): its result, and
        what later calls with them replay (a capture, ``EAGER``, ``SESSION``: the call synced,
        and the next one is captured in a compile session, ``session`` True, whose failure
        gives ``EAGER_IN_SESSION``; or ``step_state.AGAIN``: nothing, the next call is
        captured)."""
        tensors = [v for v in flat if type(v) is LazyTensor]
        owned: dict[int, LazyTensor] = {}
        if self.module is not None:
            for t in self._tensors():
                if type(t) is LazyTensor:
                    owned.setdefault(id(t._lazy.storage), t)
        devices = [t._lazy.device for t in tensors] + [t._lazy.device for t in owned.values()]
        has_tensors = any(isinstance(v, torch.Tensor) for v in flat)
        if not devices and (self.module is not None or has_tensors):
            return call(*args, **kwargs), EAGER  # nothing on the lazy device
        devices.append(0)  # a function without tensor arguments (a training step): lazy:0
        if len(self.captures) >= CAPTURE_LIMIT:
            why = f"it was captured {CAPTURE_LIMIT} times"
            return self._op_by_op(call, args, kwargs, why), EAGER
        top = pytree.tree_leaves((args, kwargs))  # inside objects: HostState says if read
        if any(isinstance(v, torch.Tensor) and type(v) is not LazyTensor for v in top):
            why = "an argument is not on the lazy device"
            return self._op_by_op(call, args, kwargs, why), EAGER
        runtime.metrics.count("captures")
        why = missed or self._changed(guards)
        site = user_site()
        if why is not None:
            runtime.metrics.count("recaptures")
            runtime.metrics.site("recaptures", f"{site} ({why} changed)")
            if runtime.config.DEBUG:
                print(f"[lazy] {self._name()} captured again at {site}: {why} changed")
        modules = self.modules if self.module is not None else []
        function = self.module is None
        _, _, described, _ = guards[0]  # ("arguments", spec, described, aliasing)
        result, capture, synced = capture_call(
            call, args, kwargs, flat, described, owned, devices[0], modules, session, function
        )
        if synced and not session:
            return result, SESSION
        if capture is step_state.AGAIN:
            return result, capture
        if isinstance(capture, str):
            self._warn(capture, site)
            return result, EAGER_IN_SESSION if session else EAGER
        return result, capture

    def _changed(self, guards: tuple) -> str | None:
        """The guards that differ from the previous call's (None at the first call)."""
        if self.last is None:
            return None
        changed = [name for (name, *new), (_, *old) in zip(guards, self.last) if new != old]
        return ", ".join(changed) or "guards"

    def _op_by_op(self, call: Callable, args: tuple, kwargs: dict, why: str) -> Any:
        self._warn(why, user_site())
        return call(*args, **kwargs)

    def _warn(self, why: str, site: str) -> None:
        """Warn once, from the user's call ``site`` (a module's call reaches here through a
        varying number of torch and capture frames, so no fixed stack level names it)."""
        if not self.warned:
            self.warned = True
            path, _, line = site.rpartition(":")
            warnings.warn_explicit(
                f"lazy_torch.compile: {self._name()} runs op by op, as it is not captured: "
                f"{why} (called at {site})",
                UserWarning,
                path or site,
                int(line) if line.isdigit() else 0,
            )

    def _name(self) -> str:
        return type(self.module).__name__ if self.module is not None else self.fn.__qualname__


def _forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    return self.__dict__["_lazy_compiled"](args, kwargs)


_forward.__name__ = "forward"


def _signed(original: Callable) -> Callable:
    """``_forward`` as a function of its own whose signature is ``original``'s (the forward it
    replaces): libraries read it (transformers' ``generate()`` asks whether the forward takes an
    ``attention_mask``, and drops an all-ones mask only if it does). A function, not a closure:
    a deepcopy of the module binds it to the copy."""
    forward = types.FunctionType(_forward.__code__, _forward.__globals__, "forward")
    if original is not _forward:
        functools.update_wrapper(forward, original)
    return forward


def compile(fn: Any) -> Any:
    """Capture ``fn`` (an ``nn.Module`` or a function) once and replay it as one node for its
    forward and one for its backward in the lazy graph, so a step's host time no longer grows
    with its op count.

    A module is returned itself, its ``forward`` replaced: ``state_dict``, ``parameters()``,
    ``train()``/``eval()`` and ``to()`` work as before. A call captures again when its guards
    change: the arguments' shapes, dtypes, strides and ``requires_grad``, the parameters and
    buffers (identity and layout), ``training``, grad mode, autocast and the float32 matmul
    precision (``lazy_torch.metrics.counters()``: ``captures``, ``recaptures``). Learning
    rates, optimizer state and dropout's random draws never do. Tensors the call stores on its
    submodules are set again by each replay. A call that syncs, or keeps a tensor elsewhere,
    runs op by op, with one warning.

    A function may be a whole training step: ``zero_grad``, forward, loss, ``backward`` and
    an Adam, AdamW or SGD ``step()`` replay as one node, the gradients it makes set again and
    its learning rates and step counts read again at every call (step_state.py).

    >>> import torch, lazy_torch
    >>> model = lazy_torch.compile(torch.nn.Linear(4, 2).to("lazy"))
    >>> loss = model(torch.ones(3, 4, device="lazy")).sum()
    >>> loss.backward()
    >>> lazy_torch.mark_step()
    >>> model.weight.grad.shape
    torch.Size([2, 4])
    """
    if isinstance(fn, torch.nn.Module):
        forward = fn.forward
        original = forward.__func__ if getattr(forward, "__self__", None) is fn else forward
        if getattr(original, "__code__", None) is _forward.__code__:
            return fn  # compiled already
        unbound = (
            original if hasattr(forward, "__self__") else (lambda self, *a, **k: forward(*a, **k))
        )
        fn.__dict__["_lazy_compiled"] = _Compiled(unbound, fn)
        signed = _signed(original) if unbound is original else _signed(_forward)
        fn.forward = types.MethodType(signed, fn)
        return fn
    compiled = _Compiled(fn, None)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return compiled(args, kwargs)

    run._lazy_compiled = compiled
    return run
