"""Capture once, replay: ``lazy_torch.compile`` (compiled.py) makes a module's forward, and its
backward, one node each in the lazy graph; a whole training step function, one node
(step_state.py).

The first call under new guards runs op by op as always, and is watched: every storage it reads
that existed before the call (parameters, buffers, the arguments' storages, the RNG state) becomes
an input of the region, every such storage it writes (BatchNorm's running statistics) an output,
and its backward is recorded once more, from placeholder gradients. Both are registered as graphs
(``runtime.register_call``). Later calls under the same guards record one ``lazy.call`` node for
the forward and, through an autograd Function, one for the backward; so does the watched call
itself, once its writes are rewound (unless it stepped an optimizer or set gradients, whose host
state is not), so its graph is the one later calls record. Their lowering inlines the
registered graph, so a step is still one program per ``mark_step`` with the loss and the
optimizer. Activations the backward reads are outputs of the forward node, read through
``getitem`` nodes, never wrapped as tensors.

What the call leaves besides its result is replayed too (side_effects.py: tensors it stores on
its submodules), and its result is rebuilt around each replay's outputs (results.py); a call
whose effects a replay cannot redo runs op by op. A call that syncs (``.item()``, a CPU
fallback, a data-dependent shape) is not pure IR: the next call under its guards is watched once
more in a compile session (``torch.compiler.is_compiling()`` True, where libraries skip such
checks), and if that one cannot be captured either, its guards run op by op for good, with one
warning naming the cause and the user's line, still in a compile session: every later call
takes the library paths that one took, and so records the same IR (one compile for them all).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils import _pytree as pytree

import runtime
from lazy_core import Node, cut_graph, data_leaf, digest, getitem, live_storages
from lazy_core.ir import GETITEM
from lazy_core.rebase import substituted
from lazy_torch import guards, results, step_state
from lazy_torch import rng as _rng
from lazy_torch import sync as _sync
from lazy_torch._dtypes import torch_dtype
from lazy_torch.guards import changed_attribute
from lazy_torch.side_effects import Effects, HostState, grad_fns
from lazy_torch.sites import user_site
from lazy_torch.tensor import LazyTensor, dense_meta, fresh

CAPTURE_LIMIT = 64  # captures per compiled object; then it runs op by op for good
EAGER = "op by op"  # a guard set whose calls cannot be captured
SESSION = "in a compile session"  # a guard set whose next call captures in a compile session
# A guard set whose capture in a compile session failed: its calls run op by op in one, taking
# the library paths that capture took, so each call records the IR the one before did.
EAGER_IN_SESSION = "op by op in a compile session"


@contextlib.contextmanager
def compile_session() -> Iterator[None]:
    """``torch.compiler.is_compiling()`` is True inside, as in a compile session of PyTorch's own.

    ``lazy_torch.compile`` watches a call in one after the previous call under the same guards
    synced: a trace whose Python never runs again. Libraries take their traceable paths there:
    transformers builds the attention mask instead of asking ``attention_mask.all()`` whether
    it may skip it, a sync that kept every model given an attention mask from being captured.
    It sets ``torch.compiler``'s ``_is_compiling_flag``, which ``is_compiling()`` returns
    outside TorchScript (torch 2.11 and 2.13; tests/lazy_torch/test_dynamo.py checks that it
    still does)."""
    compiler = torch.compiler
    before = compiler._is_compiling_flag
    compiler._is_compiling_flag = True
    try:
        yield
    finally:
        compiler._is_compiling_flag = before


class _Slot:
    """The payload of a placeholder leaf: a parameter of a captured graph, distinct by identity."""

    __slots__ = ()


def _placeholder(node: Node) -> Node:
    return data_leaf(_Slot(), node.dtype, node.shape)


# How a call node gets each operand (``_Region.reads``): forward nodes read a tensor argument's
# storage, a parameter's or buffer's, another storage, the RNG state or a fixed leaf; backward
# nodes an operand of the forward node, one of its outputs, an incoming gradient or a fixed leaf.
# A compiled step's forward node also reads a tensor through a path (step_state.py: a parameter,
# its gradient, an optimizer's state) and a graph scalar each replay reads from host state.
_ARG, _TENSOR, _STORAGE, _RNG, _FIXED, _OPERAND, _OUTPUT, _TANGENT, _PATH, _HOST = range(10)


class _Region:
    """One captured graph, registered with the runtime: its key, the role of each of its
    parameters, how a call node reads each (``reads``: (kind, what) pairs), and its outputs'
    dtypes and shapes.

    A role is ``("arg", k)`` (the storage value of tensor argument ``k``), ``("tensor", t)`` (that
    of tensor ``t``: a parameter, a buffer), ``("storage", s)`` (storage ``s``, another tensor the
    function reads), ``("rng",)`` (the device RNG state past the draws so far), ``("node", n)`` (a
    leaf of its own: a Python number, a tensor made inside), ``("saved", k)`` (activation ``k`` of
    the forward node), ``("tangent", k)`` (the gradient of differentiable output ``k``),
    ``("path", path)`` (the tensor a step_state path names) or ``("host", k)`` (graph scalar ``k``
    of a compiled step's host reads)."""

    __slots__ = ("dtypes", "key", "reads", "roles", "shapes")

    def __init__(self, roots: list[Node], roles: dict[int, tuple]):
        graph = cut_graph(roots)
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        outputs = tuple(position[id(r)] for r in roots)
        self.key = digest((graph.key, outputs))
        runtime.register_call(self.key, graph.plan(), outputs)
        self.roles = tuple(roles.get(id(p), ("node", p)) for p in graph.params)
        self.dtypes = tuple(r.dtype for r in roots)
        self.shapes = tuple(r.shape for r in roots)
        kinds = {
            "arg": _ARG, "tensor": _TENSOR, "storage": _STORAGE, "rng": _RNG, "node": _FIXED,
            "path": _PATH, "host": _HOST,
        }  # fmt: skip
        self.reads = tuple(
            (_PATH, (r[1], p.dtype, p.shape)) if r[0] == "path" else
            (kinds.get(r[0]), r[1] if len(r) > 1 else None)
            for r, p in zip(self.roles, graph.params)
        )  # fmt: skip

    def node(self, operands: list[Node]) -> Node:
        return Node(runtime.CALL, tuple(operands), self.key, self.dtypes, self.shapes)


def _storage_of(role: tuple, tensors: list) -> Any:
    kind = role[0]
    if kind == "arg":
        return tensors[role[1]]._lazy.storage
    if kind == "tensor":
        return role[1]._lazy.storage
    return role[1]


class _Capture:
    """What one capture found, and how to replay it."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.forward: _Region | None = None
        self.backward: _Region | None = None
        self.out_spec: Any = None  # how the result is rebuilt around the outputs (results.py)
        self.outputs: list[tuple[int | None, tuple]] = []  # (position in the result, Meta)
        self.mutated: list[tuple] = []  # the role of each storage the forward writes
        self.mutated_at: list[int | None] = []  # per mutated path: its place in ``storages``
        self.written: list[tuple] = []  # (path, dtype, shape) per path written and not read
        self.paths: step_state.Paths | None = None  # set by prepare, with the operands' places
        self.writes: list[tuple] = []  # (submodule, name, output) per tensor attribute it sets
        self.draws = 0  # random draws the forward makes
        self.diff_outputs: list[int] = []  # tensor outputs whose gradients the backward takes
        self.diff_inputs: list[tuple] = []  # ("arg", k) or ("tensor", t) per gradient it gives
        self.grads: list[int | None] = []  # per diff input: its output of the backward node
        self.grad_metas: list[tuple | None] = []  # per diff input: (output, Meta) or None
        self.step: step_state.Replay | None = None  # a compiled step's host reads and grads

    def link(self) -> str | None:
        """Say how the backward node reads each operand (in terms of the forward node), and the
        Meta of each gradient; or why it cannot."""
        index = {r: i for i, r in enumerate(self.forward.roles) if r[0] != "node"}
        base = len(self.outputs) + len(self.mutated)
        reads = []
        for role in self.backward.roles:
            kind = role[0]
            if kind == "saved":
                reads.append((_OUTPUT, base + role[1]))
            elif kind == "tangent":
                reads.append((_TANGENT, self.diff_outputs[role[1]]))
            elif kind == "node":
                reads.append((_FIXED, role[1]))
            elif role in index:
                reads.append((_OPERAND, index[role]))
            else:
                return "its backward reads a tensor its forward does not"
        self.backward.reads = tuple(reads)
        back = self.backward
        self.grad_metas = [
            None
            if slot is None
            else (slot, dense_meta(back.shapes[slot], torch_dtype(back.dtypes[slot])))
            for slot in self.grads
        ]
        return None

    def replay(self, flat: list) -> Any:
        """The outputs of a call whose argument leaves are ``flat`` (``guards.arguments``), or a
        ``Miss`` (before any effect) where a compiled step's paths or host reads differ from the
        capture's."""
        tensors = [v for v in flat if type(v) is LazyTensor]
        step = self.step
        if step is not None:
            why = step.check()
            if why is not None:
                return Miss(why)
        storages: list[Any] = []  # per path: the storage it names, written back below
        operands = list(self.template)  # the fixed operands in place
        if self.paths is not None:
            found = self.paths.storages()
            if isinstance(found, str):
                return Miss(found)
            storages, nodes = found
            for k, n in zip(self.path_at, nodes):
                operands[k] = n
        leaves = None
        if step is not None and step.size:
            leaves = step.host_leaves()  # counts Adam's steps: the last check
            if isinstance(leaves, str):
                return Miss(leaves)
        for k, kind, what in self.others:
            if kind == _TENSOR:
                operands[k] = what._lazy.storage.node
            elif kind == _ARG:
                operands[k] = tensors[what]._lazy.storage.node
            elif kind == _STORAGE:
                operands[k] = what.node
            elif kind == _HOST:
                operands[k] = leaves[what]
        if self.draws:
            state = _rng._rng(self.device)
            rng_node = state.moved(_rng._SKIP)
            state.draws += self.draws
            for k in self.rng_at:
                operands[k] = rng_node
        node = self.forward.node(operands)
        if self.backward is not None and torch.is_grad_enabled():
            diff = [tensors[r[1]] if r[0] == "arg" else r[1] for r in self.diff_inputs]
            outs = _Call.apply(self, node, *diff)
        else:
            outs = self.wrap(node)
        base = len(self.outputs)
        dtypes, shapes = self.forward.dtypes, self.forward.shapes
        for k, (role, at) in enumerate(zip(self.mutated, self.mutated_at), base):
            storage = _storage_of(role, tensors) if at is None else storages[at]
            storage.set(Node(GETITEM, (node,), k, dtypes[k], shapes[k]))  # getitem(node, k)
        for module, name, k in self.writes:
            setattr(module, name, outs[k])
        if step is not None:
            step.set_grads(outs)
        return results.unflatten(self.out_spec, outs, flat)

    def prepare(self) -> None:
        """Sort the forward node's operands by how a replay gets them: fixed ones in a
        template, path reads (with the paths only written) resolved together
        (step_state.Paths), the RNG state's places, and the rest one by one."""
        reads = self.forward.reads
        self.template = [what if kind == _FIXED else None for kind, what in reads]
        self.path_at = [k for k, (kind, _) in enumerate(reads) if kind == _PATH]
        self.rng_at = [k for k, (kind, _) in enumerate(reads) if kind == _RNG]
        self.others = [
            (k, kind, what)
            for k, (kind, what) in enumerate(reads)
            if kind in (_TENSOR, _ARG, _STORAGE, _HOST)
        ]
        paths = [reads[k][1] for k in self.path_at] + self.written
        self.paths = step_state.Paths(*map(list, zip(*paths))) if paths else None

    def wrap(self, node: Node) -> tuple:
        """The tensors of the forward node's outputs (getitem nodes, made inline)."""
        device, dtypes, shapes = self.device, self.forward.dtypes, self.forward.shapes
        return tuple(
            fresh(Node(GETITEM, (node,), k, dtypes[k], shapes[k]), device, meta)
            for k, (_, meta) in enumerate(self.outputs)
        )


class Miss:
    """Why a compiled step's replay cannot run (step_state.py): the call is captured again."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class _Call(torch.autograd.Function):
    """A replayed forward node for autograd; its backward records the backward node."""

    @staticmethod
    def forward(ctx, capture, node, *diff):
        ctx.capture, ctx.node = capture, node
        outs = capture.wrap(node)
        diff = set(capture.diff_outputs)  # as at the capture: a buffer it stores needs no grad
        ctx.mark_non_differentiable(*(t for k, t in enumerate(outs) if k not in diff))
        return outs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        capture, node = ctx.capture, ctx.node
        src = node.src
        operands = []
        for kind, what in capture.backward.reads:
            if kind == _OPERAND:
                operands.append(src[what])
            elif kind == _OUTPUT:
                operands.append(getitem(node, what))
            elif kind == _FIXED:
                operands.append(what)
            else:
                operands.append(grads[what]._lazy.node)
        back = capture.backward.node(operands)
        device = capture.device
        out: list[Any] = [None, None]
        for entry in capture.grad_metas:
            out.append(None if entry is None else fresh(getitem(back, entry[0]), device, entry[1]))
        return tuple(out)


# ----------------------------------------------------------------------------------------------
# Capturing: one watched call.


class _Watch:
    """Watches one call: the storages alive before it (with the node each held), the RNG state
    it draws from, and its syncs.

    A sync of values computed from nothing that existed before the call (a mask built from
    ``arange`` positions, as Hugging Face's masking checks for packed sequences) gives the same
    answer at every call with these guards: the capture keeps its result, as it keeps any other
    value made inside. A sync of anything else (a parameter, an argument, a random draw) or a
    ``mark_step`` means the call is not pure IR."""

    def __init__(self, device: int) -> None:
        self.device = device
        state = _rng._rng(device)
        if state.draws:  # draws count from 0 in the region: its state input is moved past them
            state.storage.set(state.moved(_rng._SKIP))
            state.draws = 0
        self.rng = state
        self.before = {id(s.node): (s.node, s) for s in live_storages()}
        self.others = {d: s.draws for d, s in _rng._states.items() if d != device}

    def __enter__(self) -> _Watch:  # noqa: PYI034
        self.previous = _sync.capture
        self.breaks: list[tuple[str, str]] = []
        _sync.capture = self
        return self

    def on_sync(self, storages: list, cause: str) -> None:
        """Told of each sync the call makes, before it runs."""
        if self.breaks:
            return
        if cause == "mark_step" or _reads(self.before, [s.node for s in storages]):
            self.breaks.append((cause, user_site()))

    def __exit__(self, *exc: object) -> None:
        _sync.capture = self.previous

    @property
    def synced(self) -> bool:
        """Whether the call synced on a value (a mark_step aside)."""
        return any(cause != "mark_step" for cause, _ in self.breaks)

    def broken(self) -> str | None:
        """Why the call cannot be replayed from IR, or None."""
        if self.breaks:
            cause, site = self.breaks[0]
            return f"it syncs ({cause}) at {site}"
        if any(_rng._states[d].draws != n for d, n in self.others.items() if d in _rng._states):
            return "it draws random numbers on another device"
        return None


def _reads(before: dict[int, tuple], roots: list[Node]) -> bool:
    """Whether computing ``roots`` reads a value that existed before the call."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        found = before.get(id(n))
        if found is not None and found[0] is n:
            return True
        stack.extend(n.src)
    return False


def capture_call(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    flat_in: list,
    described: tuple,
    owned: dict[int, LazyTensor],
    device: int,
    modules: list[torch.nn.Module],
    session: bool,
    function: bool,
) -> tuple[Any, _Capture | str, bool]:
    """Run ``fn(*args, **kwargs)`` op by op, watched; its result, the capture (or why there is
    none), and whether it synced. ``flat_in`` holds the argument leaves and ``described`` their
    guards (``guards.arguments``: the tensors inside objects given too, which a replay reads as
    arguments), ``owned`` maps
    storage ids to the tensors owning them (parameters, buffers), ``modules`` lists the
    submodules whose attributes the call may set (side_effects.py). A ``function``'s call may
    also run a backward and step optimizers (step_state.py).

    With ``session``, the call runs in a compile session (``torch.compiler.is_compiling()``
    True), where libraries take their traceable paths: transformers then builds its attention
    mask instead of syncing on ``attention_mask.all()`` to see whether it may skip it. Only
    after a call synced: the mask it builds makes attention slower than sdpa's ``is_causal``
    path, which a model that never syncs keeps (figures: benchmarks/RESULTS.md, "Capture and
    replay")."""
    tensors = [t for t in flat_in if isinstance(t, LazyTensor)]
    given = _given(flat_in, described)
    watch = _Watch(device)
    effects = Effects(modules)
    snapshot = step_state.Snapshot() if function else None
    host = HostState(step_state.Steps() if function else None)
    with watch, host, compile_session() if session else contextlib.nullcontext():
        result = fn(*args, **kwargs)
    why = watch.broken()
    if why is not None:
        return result, why, watch.synced
    after = guards.arguments(pytree.tree_leaves((args, kwargs)), [])
    why = host.why or _changed_given(given, _given(*after))
    if why is None and snapshot is not None:
        why = snapshot.changed() or changed_attribute(host.steps.attributes)
    if why is not None:
        return result, why, False
    objects = {id(v): k for k, v in enumerate(flat_in) if guards.opened(v)}
    result, capture = _captured(result, watch, effects, host, snapshot, tensors, owned, objects)
    step = getattr(capture, "step", None)  # a string says why there is no capture
    if type(capture) is _Capture and (step is None or not step.touches_host):
        # The first call's result is the replay's too, so the graph around it is the one every
        # later call records (no compile for the first call's op-by-op IR alone). Not where it
        # set gradients or stepped optimizers: its host state (step counts) is not rewound.
        undo = _rewind(watch)
        replayed = capture.replay(flat_in)
        if type(replayed) is Miss:  # keep the op-by-op result and what it wrote
            undo()
        else:
            result = replayed
    return result, capture, False


def _rewind(watch: _Watch) -> Callable[[], None]:
    """Give every storage the call wrote the value it held before, and the RNG state its draws,
    for a replay to write them again; returns what puts back what the call left. IR is
    immutable: what the op-by-op run left elsewhere keeps its value."""
    left = [(s, s.node, node) for node, s in watch.before.values() if s.node is not node]
    draws = watch.rng.draws
    for s, _, before in left:
        s.set(before)
    watch.rng.draws = 0

    def undo() -> None:
        for s, after, _ in left:
            s.set(after)
        watch.rng.draws = draws

    return undo


def _given(flat: list, described: tuple) -> tuple[tuple, list]:
    """What a call is given, to see whether it changed it: the guards of its argument leaves
    ``flat`` (``guards.arguments``: the objects it is given, read through), and every leaf
    that is not a plain value, by identity."""
    return described, [v for v in flat if type(v) not in guards.PLAIN]


def _changed_given(before: tuple, after: tuple) -> str | None:
    """Why a call cannot be replayed if it changed an object it was given (set an attribute,
    put another tensor in it): a replay would not. Writes into the tensors themselves are
    replayed (they are arguments)."""
    (old, old_leaves), (new, new_leaves) = before, after
    if old == new and all(map(operator.is_, old_leaves, new_leaves)):
        return None
    return (
        "it changes an object it is given (sets an attribute, or puts another tensor in it), "
        "which a replay would not"
    )


def _captured(
    result: Any,
    watch: _Watch,
    effects: Effects,
    host: HostState,
    snapshot: step_state.Snapshot | None,
    tensors: list[LazyTensor],
    owned: dict[int, LazyTensor],
    objects: dict[int, int],
) -> tuple[Any, _Capture | str]:
    """The capture of a watched call that did not sync, or why there is none. ``objects``
    maps the objects given, read through (``guards.arguments``), to their argument leaves:
    a result holding one returns the one each replay is given."""
    device = watch.device
    capture = _Capture(device)
    capture.draws = watch.rng.draws
    try:
        flat_out, capture.out_spec = results.flatten(result, objects)
    except results.Unrebuildable as e:
        return result, str(e)
    outs = list(enumerate(flat_out))
    if any(type(v) is not LazyTensor for _, v in outs):
        return result, "it returns a tensor that is not on the lazy device"
    before = watch.before
    if any(id(v._lazy.storage.node) in before for _, v in outs):
        return result, "it returns a tensor that shares memory with one that existed before"
    known = {id(s) for _, s in before.values()}
    grads = []  # (parameter, the gradient the call left it, whether it had none before)
    if snapshot is not None:
        grads = [(p, p.grad, g is None) for p, g in snapshot.grads if p.grad is not g]
        why = _grads_made([(p, g) for p, g, _ in grads if g is not None], known, outs)
        if why is not None:
            return result, why
    elif host.backward:
        return result, "it runs a backward: compile the function that calls it instead"
    made_grads = [g for _, g, _ in grads if g is not None]
    writes, why = effects.after(known, [v for _, v in outs], made_grads)
    if why is not None:
        return result, why
    # A tensor the call stored on a submodule is an output too (unless it is one already),
    # assigned again by each replay.
    number = {id(v): j for j, (_, v) in enumerate(outs)}
    for m, name, v in writes:
        if id(v) not in number:
            number[id(v)] = len(outs)
            outs.append((None, v))
        capture.writes.append((m, name, number[id(v)]))
    for g in made_grads:  # and so is a gradient the call made, set again by each replay
        if id(g) not in number:
            number[id(g)] = len(outs)
            outs.append((None, g))
    capture.outputs = [(k, v._meta) for k, v in outs]

    # Where each storage read comes from.
    sources: dict[int, tuple] = {}
    roles: dict[int, tuple] = {}
    for s_id, t in owned.items():
        sources[s_id] = ("tensor", t)
    for k, t in enumerate(tensors):
        if id(t._lazy.storage) in owned:
            return result, "an argument shares memory with a parameter or buffer of the module"
        sources.setdefault(id(t._lazy.storage), ("arg", k))
    if snapshot is not None:
        _step_sources(sources, snapshot, host.steps)
        for j, leaf in enumerate(host.steps.leaves):
            roles[id(leaf)] = ("host", j)
    # A call that ran its own backward has none to record: its outputs come without autograd
    # history (a second backward through them fails in eager too, the graph being freed).
    differentiable = torch.is_grad_enabled() and not host.backward
    leaves = _grad_leaves([v for _, v in outs], tensors)
    if differentiable and _upstream_of_arguments(tensors, leaves):
        return result, "an argument is computed from a tensor it reads (a parameter or argument)"
    for t in leaves:
        sources.setdefault(id(t._lazy.storage), ("tensor", t))
    sources[id(watch.rng.storage)] = ("rng",)

    placeholders: dict[int, Node] = {}  # id(storage) -> its placeholder

    def replace(n: Node) -> Node | None:
        found = before.get(id(n))
        if found is None or found[0] is not n:
            return None
        storage = found[1]
        p = placeholders.get(id(storage))
        if p is None:
            p = placeholders[id(storage)] = _placeholder(n)
            roles[id(p)] = sources.get(id(storage), ("storage", storage))
        return p

    # Storages written: their new value is an output, written back by each replay.
    mutated = [
        s for node, s in before.values() if s.node is not node and s is not watch.rng.storage
    ]
    for s in mutated:
        role = sources.get(id(s), ("storage", s))
        owner = (
            tensors[role[1]] if role[0] == "arg" else role[1] if role[0] == "tensor"
            else step_state.resolve(role[1]) if role[0] == "path" else None
        )  # fmt: skip
        if owner is not None and owner.requires_grad and differentiable:
            return result, "it writes in place into a tensor that requires grad"
        capture.mutated.append(role)
    memo: dict[int, Node] = {}
    forward = substituted(
        [v._lazy.node for _, v in outs] + [s.node for s in mutated], memo, replace
    )

    backward_roots: list[Node] = []
    if differentiable:
        backward_roots = _record_backward(capture, outs, tensors, leaves, roles)
        backward_roots = substituted(backward_roots, memo, replace)
    if backward_roots:
        inside = {id(n) for n in cut_graph(forward).nodes}
        saved: dict[int, Node] = {}
        backward_roots = substituted(backward_roots, {}, lambda n: _saved(n, inside, saved, roles))
        forward += [n for n, _ in saved.values()]
    capture.forward = _Region(forward, roles)
    at = {id(r[1]): k for k, r in enumerate(r for r in capture.forward.roles if r[0] == "path")}
    old = {id(s): n for n, s in before.values()}
    for role, s in zip(capture.mutated, mutated):
        if role[0] == "path" and id(role[1]) not in at:  # written, not read
            at[id(role[1])] = len(at)
            capture.written.append((role[1], old[id(s)].dtype, old[id(s)].shape))
    capture.mutated_at = [at.get(id(r[1])) if r[0] == "path" else None for r in capture.mutated]
    capture.prepare()
    if snapshot is not None:
        number_of = {id(g): number[id(g)] for g in made_grads}
        grad_writes = [(p, number_of.get(id(g)), none) for p, g, none in grads]
        capture.step = step_state.Replay(host.steps, snapshot, grad_writes)
    if backward_roots:
        capture.backward = _Region(backward_roots, roles)
        why = capture.link()
        if why is not None:
            return result, why
    return result, capture


def _grads_made(grads: list[tuple], known: set[int], outs: list[tuple]) -> str | None:
    """Why gradients ``grads`` (parameter, gradient pairs), which the call set, cannot be set
    again from outputs of its replays; or None. Each must have its own storage, made by the
    call and held by nothing else (a bias's gradient may be a view of the summed one), and its
    parameter's layout."""
    returned = {id(v._lazy.storage): v for _, v in outs}
    storages: set[int] = set()
    for p, g in grads:
        if type(g) is not LazyTensor or id(g._lazy.storage) in known:
            return "it sets a gradient to a tensor that existed before"
        storage = id(g._lazy.storage)
        if storage in storages or returned.get(storage, g) is not g:
            return "it sets gradients that share memory with each other or its result"
        storages.add(storage)
        if g._meta[:3] != (p._meta.shape, p._meta.stride, 0):
            return "it sets a gradient whose layout differs from its parameter's"
    return None


def _step_sources(sources: dict[int, tuple], snapshot: Any, steps: Any) -> None:
    """A compiled function's parameters, their gradients and its optimizers' state, as paths
    (step_state.py) that each replay reads again."""
    for p, g in snapshot.grads:
        if step_state.whole(p):
            sources.setdefault(id(p._lazy.storage), ("path", (step_state.PARAM, p)))
        if step_state.whole(g):
            sources.setdefault(id(g._lazy.storage), ("path", (step_state.GRAD, p)))
    for optimizer in steps.optimizers:
        for p, state in optimizer.state.items():
            for key, v in state.items():
                if step_state.whole(v):
                    path = (step_state.STATE, optimizer, p, key)
                    sources.setdefault(id(v._lazy.storage), ("path", path))


def _saved(n: Node, inside: set[int], saved: dict[int, tuple], roles: dict[int, tuple]) -> Any:
    """The placeholder of forward activation ``n`` in the backward graph (numbered in the order
    the backward meets them), or None for a node of the backward's own or a leaf.

    An output of a multi-output forward node that the backward reads through a getitem of its
    own (a saved tensor's) is the activation, not the whole node: a call's operands and outputs
    are single arrays."""
    if not n.src:
        return None
    if id(n) not in inside and not (n.op == GETITEM and id(n.src[0]) in inside):
        return None
    entry = saved.get(id(n))
    if entry is None:
        p = _placeholder(n)
        roles[id(p)] = ("saved", len(saved))
        entry = saved[id(n)] = (n, p)
    return entry[1]


def _grad_leaves(outs: list[LazyTensor], tensors: list[LazyTensor]) -> list[LazyTensor]:
    """The leaf tensors requiring grad that a backward from ``outs`` reaches (parameters), not
    looking past the arguments ``tensors`` and not counting them."""
    stop = {t.grad_fn for t in tensors if t.grad_fn is not None}
    arguments = {id(t) for t in tensors}
    found: dict[int, LazyTensor] = {}
    for fn in grad_fns(outs, stop):
        variable = getattr(fn, "variable", None)
        if isinstance(variable, LazyTensor) and id(variable) not in arguments:
            found.setdefault(id(variable), variable)
    return list(found.values())


def _upstream_of_arguments(tensors: list[LazyTensor], leaves: list[LazyTensor]) -> bool:
    """Whether a differentiable input of the call (an argument, a parameter ``leaves``) is one
    that an argument was computed from. The backward node gives each input the gradient
    ``autograd.grad`` found at the capture, the total one; autograd then also carries the
    argument's gradient back to that input, which would count the path through it twice."""
    inputs = {id(t) for t in (*tensors, *leaves) if t.requires_grad}
    functions = {t.grad_fn for t in tensors if t.grad_fn is not None}
    seen: set = set()
    stack = [f for g in functions for f, _ in g.next_functions if f is not None]
    while stack:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        if fn in functions or id(getattr(fn, "variable", None)) in inputs:
            return True
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return False


def _record_backward(
    capture: _Capture, outs: list, tensors: list, leaves: list, roles: dict[int, tuple]
) -> list[Node]:
    """Record the backward once from placeholder gradients; its gradient nodes, one per
    differentiable input that gets one (``capture.grads`` says which)."""
    diff_out = [i for i, (_, v) in enumerate(outs) if v.requires_grad and v.is_floating_point()]
    first = {id(t): k for k, t in reversed(list(enumerate(tensors)))}
    args = [("arg", k) for k, t in enumerate(tensors) if t.requires_grad and first[id(t)] == k]
    inputs = args + [("tensor", t) for t in leaves]
    if not diff_out or not inputs:
        return []
    tangents = []
    for j, i in enumerate(diff_out):
        v = outs[i][1]
        leaf = data_leaf(_Slot(), v._lazy.node.dtype, v._lazy.node.shape)
        roles[id(leaf)] = ("tangent", j)
        tangents.append(fresh(leaf, capture.device, dense_meta(tuple(v.shape), v.dtype)))
    targets = [tensors[r[1]] if r[0] == "arg" else r[1] for r in inputs]
    with torch.enable_grad():
        grads = torch.autograd.grad(
            [outs[i][1] for i in diff_out], targets, tangents, retain_graph=True, allow_unused=True
        )
    capture.diff_outputs = diff_out
    capture.diff_inputs = inputs
    roots: list[Node] = []
    for g in grads:
        if g is None:
            capture.grads.append(None)
        else:
            capture.grads.append(len(roots))
            roots.append(g._lazy.node)
    return roots
