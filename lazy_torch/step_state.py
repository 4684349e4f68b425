"""What a compiled training step reads from its parameters' gradients and its optimizers, and what
it leaves there, so that each replay of ``lazy_torch.compile(step)`` redoes it (capture.py).

A step function (``zero_grad``, the forward and loss, ``backward``, ``optimizer.step()``) is
captured as one region like any other call: the parameters, their gradients and the optimizer's
moments it reads are inputs, the values it writes into them outputs written back. Five things
besides make its replay compute what the call would:

- Paths. A replay reads each such tensor where the call would find it: a parameter, the
  parameter's ``.grad``, or ``optimizer.state[p][key]``, checking that it is still a whole
  tensor of the captured dtype and shape (``load_state_dict`` swaps the moments for new tensors,
  a ``zero_grad`` outside the step leaves no gradient: either recaptures).
- Gradients set. A gradient the call made (its backward's, after ``zero_grad(set_to_none=True)``)
  is an output, set as the parameter's ``.grad`` by each replay; one it set to None is set to None.
- Hyperparameters and step counts. Adam's, AdamW's and SGD's steps run as one fused node per
  parameter group (fused.py); inside a capture its learning rate, betas, epsilon, weight decay,
  momentum and dampening are graph scalars read from the param group again by each replay, and
  Adam's CPU step counts are counted again and read (``Steps``). So a scheduler's new learning
  rate and Adam's bias correction never recapture; the group's other entries (``amsgrad``,
  ``maximize``, its parameters) are guards.
- Modules. The modules the call calls (a global forward pre-hook lists them during the capture;
  a compiled module, with all its submodules) are guards, as a compiled module's are
  (guards.ModuleSet): ``eval()`` recaptures. A plain attribute of one that the call changes
  after first calling it (``self.calls += 1``) makes it run op by op.
- What a replay cannot redo makes the call run op by op, with one warning: an optimizer other
  than these three, or one with step hooks, or whose step does not run as one fused step per
  group (mixed dtypes); a change of any optimizer's param groups inside the call (a scheduler's
  ``step()``: step it outside). A call that makes optimizer state (the first step) is not
  captured, and the next call is.

Which tensors are parameters and which are optimizers is found once per capture, by a scan of
the heap for lazy leaf tensors requiring grad and for optimizers (``Snapshot``, cheap beside a
capture's compiling; figures: benchmarks/RESULTS.md, "Capture and replay"): their gradients and
param groups before the call are what a replay's checks compare against.
"""

from __future__ import annotations

import functools
import gc
import itertools
import operator
from typing import Any

import torch
from torch.optim import optimizer as _optimizer

from lazy_core import scalar_leaf
from lazy_torch.guards import PLAIN, ModuleSet, plain_attributes, plain_value
from lazy_torch.recording import SCALAR_DTYPES
from lazy_torch.tensor import LazyTensor, extension

# The tensors a path names.
PARAM, GRAD, STATE = range(3)


# The optimizers whose steps (by identity: a subclass that overrides step is none of them) run as
# fused.py's fused steps, and how each scalar of a fused step is read from a param group.
def _innermost(function: Any) -> Any:
    """``function`` past its decorators (the optimizer's profiling hook that PyTorch sets on the
    class when the first instance is made, its grad-mode wrapper)."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


_STEPS = {_innermost(o.step) for o in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)}
_GROUP_KEYS = {
    "lr": ("lr", None),
    "beta1": ("betas", 0),
    "beta2": ("betas", 1),
    "weight_decay": ("weight_decay", None),
    "eps": ("eps", None),
    "momentum": ("momentum", None),
    "dampening": ("dampening", None),
}
_READ = frozenset(key for key, _ in _GROUP_KEYS.values())

watching: Steps | None = None  # the Steps of the capture in progress (HostState sets it)


def module_called(module: torch.nn.Module, args: Any) -> None:
    """A global forward pre-hook while a function's call is captured: the modules it calls,
    whose ``training``, parameters and plain attributes each replay checks (guards.ModuleSet)."""
    if watching is not None:
        # A compiled module may replay without calling its submodules: guard them all.
        inner = module.modules() if "_lazy_compiled" in module.__dict__ else (module,)
        for m in inner:
            if id(m) not in watching.modules:
                watching.modules[id(m)] = m
                watching.attributes.append((m, plain_attributes(m)))


_LAZY = operator.attrgetter("_lazy")
_STORAGE = operator.attrgetter("storage")
_NODE = operator.attrgetter("node")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def _state_entry(optimizer: Any, p: Any, key: str) -> Any:
    state = optimizer.state.get(p)
    return None if state is None else state.get(key)


def resolve(path: tuple) -> Any:
    """The tensor ``path`` names now: ``(PARAM, p)``, ``(GRAD, p)`` or ``(STATE, opt, p, key)``."""
    return _getter(path)()


def _getter(path: tuple) -> Any:
    """A callable (C-level where it can be) that returns the tensor ``path`` names now."""
    if path[0] == PARAM:
        return itertools.repeat(path[1]).__next__
    if path[0] == GRAD:
        return functools.partial(getattr, path[1], "grad")
    return functools.partial(_state_entry, *path[1:])


class Paths:
    """The tensors a replay reads or writes through paths, resolved and checked together: a step
    has hundreds (each parameter, and Adam's two moments of each)."""

    def __init__(self, paths: list[tuple], dtypes: list[str], shapes: list[tuple]) -> None:
        self.paths, self.dtypes, self.shapes = paths, dtypes, shapes
        self.getters = [_getter(p) for p in paths]

    def storages(self) -> tuple[list, list] | str:
        """Each path's storage and its value (node), or why one is not a whole lazy tensor of
        the captured dtype and shape."""
        try:
            storages = list(map(_LAZY, [get() for get in self.getters]))
        except AttributeError:  # None, or a tensor off the lazy device
            return self._why()
        if list(map(_STORAGE, storages)) != storages:  # a view
            return self._why()
        nodes = list(map(_NODE, storages))
        if list(map(_SHAPE, nodes)) != self.shapes or list(map(_DTYPE, nodes)) != self.dtypes:
            return self._why()
        return storages, nodes

    def _why(self) -> str:
        for path, get, dtype, shape in zip(self.paths, self.getters, self.dtypes, self.shapes):
            t = get()
            if not whole(t) or (t._lazy.node.dtype, t._lazy.node.shape) != (dtype, shape):
                return f"the {describe(path)}"
        return "a path"


def describe(path: tuple) -> str:
    """What ``path`` names, for a recapture's reason."""
    kind = ("parameter", "gradient of a parameter", "state of its optimizer")[path[0]]
    return f"{kind} ({path[3]})" if path[0] == STATE else kind


def whole(t: Any) -> bool:
    """Whether ``t`` is a lazy tensor that is its storage's whole value (no view)."""
    return type(t) is LazyTensor and t._lazy is t._lazy.storage


def _unreadable(optimizer: Any) -> str | None:
    """Why a replay could not check the optimizer's param groups: an entry that is no plain
    value (nor a tuple of them, nor a number a replay reads again); or None."""
    for group in optimizer.param_groups:
        for key, v in group.items():
            if key == "params" or key in _READ and type(v) in (int, float, tuple):
                continue
            if type(v) not in PLAIN and not (type(v) is tuple and all(type(x) in PLAIN for x in v)):
                return f"its optimizer's param group holds {key} = {type(v).__name__}"
    return None


def _form(v: Any) -> tuple:
    """What a replay assumes of a value it reads again: its type, and whether it is 0 (SGD
    without momentum has no momentum buffers)."""
    if type(v) is tuple:
        return tuple(map(_form, v))
    return (type(v), type(v) in (int, float) and v == 0)


def _group_check(group: dict) -> tuple:
    """What a replay checks of a param group it read at the capture (``_unreadable`` held)."""
    return (
        tuple(map(id, group["params"])),
        tuple((k, _value(v)) for k, v in group.items() if k not in _READ and k != "params"),
        tuple((k, _form(group[k])) for k in _READ if k in group),
    )


def _attributes(optimizer: Any) -> tuple[dict, tuple[int, int]]:
    """The optimizer's plain attributes, and the size of its state."""
    plain = {k: plain_value(v) for k, v in vars(optimizer).items() if type(v) in PLAIN}
    return plain, (len(optimizer.state), sum(map(len, optimizer.state.values())))


def _values(optimizer: Any) -> list:
    """Every value of the optimizer's param groups (their parameters by identity)."""
    return [[(k, _value(v)) for k, v in g.items()] for g in optimizer.param_groups]


def _value(v: Any) -> Any:
    """``v`` type-exact where it is plain or a tuple or list of plain values (betas, a group's
    parameters by identity), else by identity."""
    if type(v) in PLAIN:
        return plain_value(v)
    if type(v) in (tuple, list):
        return type(v), tuple(map(_value, v))
    return type(v), id(v)


class Snapshot:
    """Before a call: every lazy leaf tensor requiring grad with its gradient, and every
    optimizer with its param groups' values, plain attributes and state size."""

    def __init__(self) -> None:
        optimizer = torch.optim.Optimizer
        self.grads: list[tuple[LazyTensor, Any]] = []
        self.optimizers: list[tuple[Any, list, tuple]] = []
        for o in gc.get_objects():
            if type(o) is LazyTensor:
                if o.requires_grad and o.grad_fn is None:
                    self.grads.append((o, o.grad))
            elif issubclass(type(o), optimizer):
                self.optimizers.append((o, _values(o), _attributes(o)))

    def changed(self) -> str | None:
        """After the call: what it changed in an optimizer that a replay would not redo, or
        ``AGAIN`` where it made optimizer state (its first step)."""
        for optimizer, values, (plain, size) in self.optimizers:
            name = type(optimizer).__name__
            if _values(optimizer) != values:
                return (
                    f"it changes its {name}'s param groups (a learning-rate scheduler's step?), "
                    "which a replay would not; do that outside"
                )
            plain_after, size_after = _attributes(optimizer)
            # Optimizer state made, or a flag set (``_opt_called``): once, at a first step.
            if size_after != size or plain_after.items() > plain.items():
                return AGAIN
            if plain_after != plain:
                return f"it changes its {name}'s attributes, which a replay would not"
        return None


AGAIN = "it makes optimizer state"  # not captured this time; the next call is


class Steps:
    """Watches the optimizer steps of one call: HostState's hooks call ``begin`` and ``end``
    around each, fused.py's steps call ``read_scalars`` and ``counted`` as they record a fused step
    inside one. ``why`` says what a replay could not redo, or is None."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.current: Any = None  # the optimizer whose step runs
        self.optimizers: list[Any] = []  # those stepped, once each
        self.claimed: set[int] = set()  # ids of host step tensors the routes count
        self.leaves: list[Any] = []  # the graph scalars each replay reads, in order
        # Per graph scalar of a param group: (leaf number, group, key, index, the value's type,
        # the kernel's type).
        self.scalars: list[tuple] = []
        self.counts: list[tuple] = []  # per route's step counts: (optimizer, params, leaf index)
        self.modules: dict[int, torch.nn.Module] = {}  # the modules the call calls
        self.attributes: list[tuple] = []  # each one's plain attributes when first called
        self._groups: dict[int, dict] = {}
        self._recorded = 0

    def begin(self, optimizer: Any) -> None:
        if self.why is not None:
            return
        name = type(optimizer).__name__
        if _innermost(type(optimizer).step) not in _STEPS:
            self.why = (
                f"it steps a {name}, whose hyperparameters a replay would not read again; "
                "compile the model or its loss and step outside"
            )
        elif (
            optimizer._optimizer_step_pre_hooks
            or optimizer._optimizer_step_post_hooks
            or len(_optimizer._global_optimizer_pre_hooks) > 1  # HostState's own
            or len(_optimizer._global_optimizer_post_hooks) > 1
        ):
            self.why = f"its {name} has step hooks, which a replay would not call"
        else:
            self.why = _unreadable(optimizer)
        if self.why is None:
            self.current, self._recorded = optimizer, 0
            self._groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
            if all(o is not optimizer for o in self.optimizers):
                self.optimizers.append(optimizer)

    def end(self, optimizer: Any) -> None:
        if self.current is not optimizer:
            return
        self.current = None
        groups = optimizer.param_groups
        stepped = sum(1 for g in groups if any(p.grad is not None for p in g["params"]))
        if self.why is None and self._recorded != stepped:
            self.why = (
                f"its {type(optimizer).__name__} step does not run as one fused step per "
                "param group (parameters of several dtypes or devices in a group, foreach=False, "
                "capturable, a grad scaler?), whose hyperparameters a replay would not read again"
            )

    def read_scalars(self, b: dict, names: tuple, params: list) -> None:
        """Make each scalar ``names`` of fused step arguments ``b`` (over ``params``) a graph
        scalar that each replay reads from its param group again."""
        group = self._groups.get(id(params[0])) if self.current is not None else None
        if group is None:
            self.why = self.why or "it runs a fused optimizer step outside an optimizer's step()"
            return
        self._recorded += 1
        for name in names:
            key, index = _GROUP_KEYS[name]
            v = group[key] if index is None else group[key][index]
            kind = type(b[name])  # the kernel's: a fused kernel's schema makes 0 a float
            if type(v) not in (int, float) or kind not in (int, float):
                v = None
            elif plain_value(kind(v)) != plain_value(b[name]):
                v = None
            if v is None:
                self.why = self.why or f"its fused step's {name} is not its param group's {key}"
                return
            leaf = scalar_leaf(kind(v), SCALAR_DTYPES[kind])
            self.scalars.append((len(self.leaves), group, key, index, type(v), kind))
            self.leaves.append(leaf)
            b[name] = leaf

    def claim(self, steps: list) -> None:
        """Host step tensors a route is about to count (HostState lets it read and write them)."""
        self.claimed.update(map(id, steps))

    def counted(self, steps: list, leaves: list) -> None:
        """A route counted host step tensors ``steps`` and made ``leaves`` (one per step, shared
        by equal counts) of their new values: each replay counts them again."""
        owner = (
            {id(s.get("step")): p for p, s in self.current.state.items()} if self.current else {}
        )
        params = [owner.get(id(s)) for s in steps]
        if any(p is None for p in params):
            self.why = self.why or "it counts optimizer steps outside an optimizer's step()"
            return
        index: dict[int, int] = {}
        for leaf in leaves:
            if id(leaf) not in index:
                index[id(leaf)] = len(self.leaves)
                self.leaves.append(leaf)
        dtype = leaves[0].dtype
        self.counts.append((self.current, params, tuple(index[id(x)] for x in leaves), dtype))


class Replay:
    """What each replay of a step checks, reads and sets besides the region's own inputs and
    outputs (capture.py calls ``check``, ``host_leaves`` and ``set_grads`` in that order)."""

    def __init__(self, steps: Steps, snapshot: Snapshot, grads: list[tuple]) -> None:
        self.scalars = steps.scalars
        self.counts = steps.counts
        self.size = len(steps.leaves)
        self.grads = grads  # (parameter, its output or None, whether it had no grad before)
        self.modules = ModuleSet(list(steps.modules.values()))
        self.module_guards = self.modules.read()
        # Per stepped optimizer: its param groups (by identity: ``load_state_dict`` makes new
        # ones) with their parameters' ids, the keys a replay does not read and their values,
        # and the form of those it reads again.
        self.optimizers = [
            (o, [(g, _group_check(g)) for g in o.param_groups]) for o in steps.optimizers
        ]
        # Whether each parameter had a gradient before the call: those it set (a backward
        # accumulates into one that exists) and every parameter of a stepped optimizer (which
        # steps those that have one).
        before = {id(p): g is None for p, g in snapshot.grads}
        params = {id(p): p for p, _, _ in grads}
        for o in steps.optimizers:
            params.update((id(p), p) for g in o.param_groups for p in g["params"])
        self.params = list(params.values())
        self.none = [before.get(id(p), p.grad is None) for p in self.params]

    @property
    def touches_host(self) -> bool:
        """Whether the call stepped optimizers or set gradients (host state a replay redoes)."""
        return bool(self.optimizers or self.grads)

    def check(self) -> str | None:
        """Why this call's modules, optimizers or gradients differ from the capture's, or
        None."""
        try:
            if self.modules.read() != self.module_guards:
                return "the training flags, parameters or attributes of the modules it calls"
        except KeyError:
            return "the attributes of the modules it calls"
        for optimizer, groups in self.optimizers:
            now = optimizer.param_groups
            if len(now) != len(groups) or any(
                g is not group or _group_check(g) != check for g, (group, check) in zip(now, groups)
            ):
                return f"its {type(optimizer).__name__}'s param groups"
        if [p.grad is None for p in self.params] != self.none:
            return "whether a parameter has a gradient"
        return None

    def host_leaves(self) -> list | str:
        """The graph scalars of this replay: each param group's values as they stand, then the
        step counts, counted (a call that cannot be replayed counts nothing: why, instead)."""
        leaves: list[Any] = [None] * self.size
        for j, group, key, index, kind, to in self.scalars:
            v = group[key] if index is None else group[key][index]
            if type(v) is not kind:
                return f"the type of its param group's {key}"
            leaves[j] = scalar_leaf(to(v), SCALAR_DTYPES[to])
        counted = []
        for optimizer, params, at, dtype in self.counts:
            steps = [optimizer.state.get(p, {}).get("step") for p in params]
            values = _count(steps)
            if values is None:
                _uncount(counted)
                return "its optimizer's step counts"
            counted.append(steps)
            for j, v in zip(at, values):
                if leaves[j] is None:
                    leaves[j] = scalar_leaf(v, dtype)
                elif leaves[j].payload != v:  # counts that were equal no longer are
                    _uncount(counted)
                    return "its optimizer's step counts"
        return leaves

    def set_grads(self, outs: tuple) -> None:
        for p, k, _ in self.grads:
            p.grad = None if k is None else outs[k]


def _count(steps: list) -> list | None:
    """Add 1 to each of host step tensors ``steps`` and return their new values; None (counting
    nothing) where one is not a 0-dim CPU tensor."""
    values = extension.count_steps(steps)  # None where not all of one dtype on the CPU
    if values is not None:
        return values
    if not all(type(s) is torch.Tensor and s.device.type == "cpu" and not s.dim() for s in steps):
        return None
    torch._foreach_add_(steps, 1)
    return [s.item() for s in steps]


def _uncount(counted: list) -> None:
    for steps in counted:
        torch._foreach_sub_(steps, 1)
