"""What a watched call of ``lazy_torch.compile`` (capture.py) leaves behind besides its result,
and which of it a replay redoes.

A replay records the call's graph and returns its outputs; none of the call's Python runs again.
So each effect of the call beyond its result is one a replay redoes, or the call is not captured
(it runs op by op, as ``torch.compile`` would run it after a graph break):

- writes into tensors that existed before the call (BatchNorm's running statistics, in-place
  updates of arguments): capture.py makes the new values outputs and writes them back;
- tensors the call made and stored as attributes or buffers of the module's submodules
  (``self.aux_loss = ...``, ``self.last = y.detach()``): outputs of the call too (differentiable
  where they require grad), assigned again by each replay (``Effects.after`` lists them);
- changed plain attributes of the submodules (``self.calls += 1``): refused, a replay would not
  count;
- tensors the call made and kept anywhere else (appended to a list, stored in a global or on an
  object that is not a submodule): refused, a replay would leave the first call's value there;
- host tensors that existed before the call, read or written (a CPU counter), and an
  optimizer's step in a module's call (learning rates are Python numbers): refused
  (``HostState``), a replay would keep the values of the capture. A compiled function's call
  may step Adam, AdamW or SGD and set gradients: step_state.py says how its replays redo that.

Tensors autograd saved for the backward are not kept by the call (they go with its graph): they
are found on the graph's nodes (``grad_fn._saved_*``). Python state that holds no
tensor made by the call (a global counter, a config object's field) is not seen: like the
submodules' plain attributes read by the call, it is taken as it was at the capture.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from lazy_core import live_storages
from lazy_torch import data, step_state
from lazy_torch.guards import changed_attribute, plain_attributes
from lazy_torch.tensor import LazyTensor, extension


class Effects:
    """Watches one call: the submodules' plain attributes before it, and, after it, what it
    left behind."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.modules = modules
        self.plain = [(m, plain_attributes(m)) for m in modules]

    def after(
        self, known: set[int], result: list[LazyTensor], grads: list[LazyTensor]
    ) -> tuple[list, str | None]:
        """After the call: the tensor attributes a replay sets again, as (submodule, name,
        tensor) triples, or why the call cannot be replayed. ``known`` holds the ids of the
        storages alive before the call (held by the caller), ``result`` the tensors it returned,
        ``grads`` the gradients it made (set again by a replay: step_state.py)."""
        returned = {id(t) for t in result}
        returned_storages = {id(t._lazy.storage) for t in result}
        writes = []
        for m in self.modules:
            for name, v in (*m.__dict__.items(), *m._buffers.items()):
                if type(v) is not LazyTensor or id(v._lazy.storage) in known:
                    continue
                if id(v._lazy.storage) in returned_storages and id(v) not in returned:
                    where = f"{type(m).__name__}.{name}"
                    return [], f"it stores as {where} a tensor sharing memory with its result"
                writes.append((m, name, v))
        tensors = [*result, *(v for _, _, v in writes), *grads]
        saved = _saved_by_autograd(tensors)  # held until the end of this check
        kept = {*saved, *(id(t._lazy.storage) for t in tensors)}
        if self._made(known, kept):
            gc.collect()  # a cycle may hold a temporary
            if self._made(known, kept):
                return [], (
                    "it keeps a tensor it made where its result does not hold it (in a list, a "
                    "global or an object other than its submodules), which a replay would not "
                    "update"
                )
        why = changed_attribute(self.plain)
        return ([], why) if why is not None else (writes, None)

    def _made(self, known: set[int], kept: set[int]) -> set[int]:
        """Storages made by the call and alive, other than ``kept`` (and than the batches a
        DeviceLoader's thread uploaded meanwhile)."""
        with data.prefetching:
            other = data.prefetched
            return {
                id(s)
                for s in live_storages()
                if id(s) not in known and id(s) not in kept and id(s) not in other
            }


def _saved_by_autograd(outputs: list[LazyTensor]) -> dict[int, Any]:
    """The storages of the lazy tensors that the autograd graph of ``outputs`` saved for the
    backward (``grad_fn._saved_*``, and a custom Function's ``saved_tensors`` and context
    attributes), by id."""
    found: dict[int, Any] = {}
    for fn in grad_fns(outputs):
        values: list = [getattr(fn, "__dict__", {}).values()]
        values.append([extension.linear_saved(fn)])  # linear.py's C++ node
        for name in dir(fn):
            if name.startswith("_saved_") or name == "saved_tensors":
                try:
                    values.append([getattr(fn, name)])
                except RuntimeError:  # freed by a backward, or never saved
                    continue
        for group in values:
            for v in group:
                for t in v if isinstance(v, (tuple, list)) else (v,):
                    if type(t) is LazyTensor:
                        storage = t._lazy.storage
                        found[id(storage)] = storage
    return found


def grad_fns(tensors: list[torch.Tensor], stop: Iterable = ()) -> Iterator[Any]:
    """Each node of the autograd graph of ``tensors`` once, not going past the nodes ``stop``."""
    seen = set(stop)
    stack = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        yield fn
        stack.extend(f for f, _ in fn.next_functions if f is not None)


# Ops whose tensor argument is made for them (torch.tensor's data), not read from outside.
_FRESH = {torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default}


class HostState:
    """Watches one call (a context manager around it) for state a replay would not touch: a
    tensor off the lazy device that existed before the call, read or written by an op (a CPU
    counter, whose value would be baked into the graph), and an optimizer's step (its learning
    rate and other hyperparameters are Python numbers read from its param groups). ``why`` says
    which, or is None; ``backward`` whether the call ran a backward.

    With ``steps`` (a compiled function's call, step_state.py), an optimizer's step is watched by
    it instead: the Adam, AdamW and SGD steps that fused.py records as graph scalars read from
    their param groups again, and Adam's CPU step counts it counts again, are replayed.

    Host tensors the call makes itself (``torch.tensor(...)``, a CPU copy it computes) are the
    same at every call under its guards, as any other value made inside."""

    def __init__(self, steps: step_state.Steps | None = None) -> None:
        self.steps = steps
        self.backward = False
        self._why: str | None = None
        self._mode = _HostOps(self)
        self._hooks: list = []

    @property
    def why(self) -> str | None:
        return self._why or (self.steps.why if self.steps is not None else None)

    def __enter__(self) -> HostState:  # noqa: PYI034
        self._hooks = [register_optimizer_step_pre_hook(self._stepped)]
        if self.steps is not None:
            self._hooks.append(register_optimizer_step_post_hook(self._done))
            self._hooks.append(register_module_forward_pre_hook(step_state.module_called))
        self._task = torch._C._current_graph_task_id()
        self._previous = step_state.watching
        if self.steps is not None:  # a module captured inside a function's capture: the
            step_state.watching = self.steps  # function's still watches the modules it calls
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        step_state.watching = self._previous
        for hook in self._hooks:
            hook.remove()

    def refuse(self, why: str) -> None:
        self._why = self._why or why

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.steps is not None:
            self.steps.begin(optimizer)
        else:
            self.refuse(
                f"it steps an optimizer ({type(optimizer).__name__}), whose learning rate and "
                "step counts a replay would not read again; compile the model or its loss and "
                "step outside, or the whole training step as a function"
            )

    def _done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps.end(optimizer)


class _HostOps(TorchDispatchMode):
    """Sees every op of the call: its host tensors that did not come from an op of the call.
    A control-flow operator (``torch.cond``, ``while_loop``) runs, and refuses the capture: its
    bodies are traced with this mode off, so a host tensor one reads would go unseen."""

    supports_higher_order_operators = True

    def __init__(self, state: HostState) -> None:
        super().__init__()
        self.state = state
        self.made: dict[int, weakref.ref] = {}  # id -> a host tensor an op of the call made

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        kwargs = kwargs or {}
        state = self.state
        if torch._C._current_graph_task_id() != state._task:
            state.backward = True
        if isinstance(func, HigherOrderOperator):
            state.refuse(f"it runs {func.name()}, whose bodies a capture cannot watch")
        elif state.why is None and func not in _FRESH:
            claimed = state.steps.claimed if state.steps is not None else ()
            for t in _host_tensors((args, kwargs)):
                ref = self.made.get(id(t))
                if (ref is None or ref() is not t) and id(t) not in claimed:
                    state.refuse(
                        f"its {func} reads or writes a {t.device.type} tensor of shape "
                        f"{tuple(t.shape)} that existed before it, which a replay would not"
                    )
                    break
        out = func(*args, **kwargs)
        for t in _host_tensors(out):
            self.made[id(t)] = weakref.ref(t)
        return out


def _host_tensors(tree: Any) -> list[torch.Tensor]:
    return [
        t
        for t in pytree.tree_leaves(tree)
        if isinstance(t, torch.Tensor) and type(t) is not LazyTensor and t.device.type != "meta"
    ]
