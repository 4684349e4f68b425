"""PyTorch's control-flow operators on lazy tensors: ``torch.cond``, ``while_loop``, ``scan``
and ``map`` (``torch._higher_order_ops``) record one node each, lowered to ``lax.cond``,
``lax.while_loop`` and ``lax.scan`` (runtime/program.py; ``map`` is a scan without a carry).
A lazy predicate or trip count never syncs, and one compiled program serves every predicate
value and trip count.

Each branch or body is traced once per call, on placeholder tensors for its explicit inputs (a
carry, a slice of ``xs``; ``cond``'s operands), into a graph registered with the runtime like a
captured region (``runtime.register_call``). Tensors a body reads from the enclosing scope
(parameters, captured tensors) become operands of the node. Writes are functionalized
(TensorSSA): a tensor of the enclosing scope that a body writes in place, directly or through a
view, gets the node's output as its new value, and in a loop it is carried from one iteration to
the next (``b[i] = b[i] + 1`` in a ``while_loop`` body updates ``b`` in every iteration). A
``cond`` branch that writes into one of its operands writes the operand.

The bodies must be pure tensor programs: a body that syncs (``.item()``, printing a value, a
data-dependent shape) raises, naming the operator. Random numbers may be drawn anywhere: the
device RNG state is one more storage a loop body writes (it re-keys the state at its end), so
it is carried and each iteration draws anew. ``torch.cond`` is
differentiable in its floating-point operands (its backward is another ``cond`` of the branches'
vector-Jacobian products); the loops record no autograd graph and raise where one is wanted. A
body that reads a tensor of the enclosing scope that requires grad raises (pass it as an
operand): its gradient would otherwise be lost.

PyTorch runs these operators in eager mode by compiling them with TorchDynamo, which cannot
fake-ify a lazy tensor; ``_install`` routes a call with lazy tensors straight to the operator,
whose lazy implementation is registered here (``py_impl(LazyTensor)``). It patches one function
of ``torch._higher_order_ops.utils`` (checked by tests/lazy_torch/test_control_flow.py) and
changes nothing for calls without lazy tensors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils import _pytree as pytree

import runtime
from lazy_core import Node, cut_graph, data_leaf, digest, getitem, live_storages
from lazy_core.rebase import substituted
from lazy_torch import rng as _rng
from lazy_torch import sync as _sync
from lazy_torch._dtypes import dtype_name
from lazy_torch.sites import user_site
from lazy_torch.tensor import LazyTensor, dense_meta, fresh
from lazy_torch.variants import assign

COND, WHILE, SCAN = runtime.COND, runtime.WHILE, runtime.SCAN


class _Slot:
    """The payload of a placeholder leaf (an explicit input of a body, or a value of the
    enclosing scope it reads), distinct by identity."""

    __slots__ = ()


class SyncInBody(RuntimeError):
    """A branch or loop body asked the device for a value while being traced (``.item()``, a
    data-dependent shape, an op run on the CPU): it is no pure tensor program."""


class _NoSync:
    """Stands in for ``lazy_torch.compile``'s watcher while a body is traced: any sync raises."""

    def __init__(self, what: str) -> None:
        self.what = what

    def on_sync(self, storages: list, cause: str) -> None:
        raise SyncInBody(
            f"{self.what} on lazy tensors: a branch or body must be a pure tensor program, but "
            f"it syncs ({cause}) at {user_site()}; compute the value outside the body or pass "
            "it as an operand"
        )


def tracing() -> bool:
    """Whether a branch or body is being traced: a ``lazy_torch.compile``d call inside runs op
    by op, recorded into the body like any other ops (its capture would hold the body's
    placeholders)."""
    return type(_sync.capture) is _NoSync


class _Traced:
    """One traced body: its results (lazy tensors) and their pytree spec, the storages of the
    enclosing scope it wrote (id -> (storage, value before, value after)), its explicit inputs'
    placeholder leaves and the values it left in them."""

    __slots__ = ("after", "leaves", "outer", "results", "spec", "writes")

    def __init__(
        self, results: list, spec: Any, writes: dict, leaves: list, after: list, outer: dict
    ) -> None:
        self.results, self.spec, self.writes = results, spec, writes
        self.leaves, self.after = leaves, after
        self.outer = outer  # id -> node: the values the enclosing scope's storages held

    def metas(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        return _metas(self.results)

    def written_inputs(self) -> list[int]:
        return [k for k, (a, b) in enumerate(zip(self.leaves, self.after)) if a is not b]

    def value_of(self, storage: Any, old: Node) -> Node:
        """The value ``storage`` (of the enclosing scope) has after the body."""
        found = self.writes.get(id(storage))
        return old if found is None else found[2]


def _metas(values: list) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [(tuple(v.shape), v.dtype) for v in values]


def _placeholders(metas: list[tuple[tuple[int, ...], torch.dtype]], device: int) -> list:
    return [
        fresh(data_leaf(_Slot(), dtype_name(dtype), shape), device, dense_meta(shape, dtype))
        for shape, dtype in metas
    ]


def _trace(fn: Callable, metas: list, device: int, what: str, loop: bool) -> _Traced:
    """Run ``fn`` on placeholder tensors of ``metas`` recording IR only; every storage of the
    enclosing scope it writes gets its value back afterwards."""
    if loop:  # draws before the loop keep their state; the body's re-key it (a carry)
        _rng.rekey(device)
        _rng.advance()
    inputs = _placeholders(metas, device)
    leaves = [t._lazy.storage.node for t in inputs]
    held = {id(t._lazy.storage) for t in inputs}
    before = {id(s): (s, s.node) for s in live_storages() if id(s) not in held}
    previous, _sync.capture = _sync.capture, _NoSync(what)
    indexing = LazyTensor.__getitem__, LazyTensor.__setitem__
    LazyTensor.__getitem__, LazyTensor.__setitem__ = _getitem, _setitem
    outer_copies, _copies[:] = list(_copies), []
    try:
        out = fn(*inputs)
        if loop:
            _rng.advance()
        if any(s.node is not node for s, node in _copies):
            raise NotImplementedError(
                f"{what} on lazy tensors: a body writes in place into b[i] indexed by a tensor, "
                "which in eager writes b; write b[i] = value instead"
            )
    finally:
        _sync.capture = previous
        LazyTensor.__getitem__, LazyTensor.__setitem__ = indexing
        _copies[:] = outer_copies
        # In the order their old values were recorded (not the storages' creation order), so the
        # node's operands are the same for the same program.
        written = sorted((i for i, (s, old) in before.items() if s.node is not old),
                         key=lambda i: before[i][1].seq)  # fmt: skip
        writes = {i: (before[i][0], before[i][1], before[i][0].node) for i in written}
        for s, old, _ in writes.values():
            s.set(old)
    flat, spec = pytree.tree_flatten(out)
    for v in flat:
        if not isinstance(v, LazyTensor):
            raise TypeError(
                f"{what} on lazy tensors: a body must return tensors on the lazy device, got "
                f"{type(v).__name__}"
            )
    after = [t._lazy.storage.node for t in inputs]
    outer = {id(old): old for _, old in before.values()}
    return _Traced(flat, spec, writes, leaves, after, outer)


# Indexing by a 0-d integer tensor (``b[i]``, ``b[i, 2:]``), which PyTorch turns into an int
# with ``.item()`` (a sync), is recorded inside a body as indexing by a one-element tensor, with
# that dimension dropped: a read gives a copy (as any tensor index does), a write writes ``b``.


def _tensor_index(index: Any) -> tuple | None:
    """``index`` with a leading 0-d integer lazy tensor made one-element, or None."""
    first, rest = (index[0], index[1:]) if isinstance(index, tuple) and index else (index, ())
    if not (isinstance(first, LazyTensor) and first.dim() == 0):
        return None
    if first.dtype == torch.bool or first.is_floating_point() or first.is_complex():
        return None
    if any(isinstance(r, torch.Tensor) for r in rest):
        return None
    return (first.reshape(1), *rest)


def _getitem(self: LazyTensor, index: Any) -> Any:
    found = _tensor_index(index)
    if found is None:
        return torch.Tensor.__getitem__(self, index)
    copy = torch.Tensor.__getitem__(self, found).squeeze(0)
    _copies.append((copy._lazy.storage, copy._lazy.storage.node))
    return copy


# The copies ``_getitem`` made in the body being traced, with their values: in eager each is a
# view, so a write into one writes the indexed tensor, which a copy cannot do; ``_trace`` raises.
_copies: list = []


def _setitem(self: LazyTensor, index: Any, value: Any) -> None:
    found = _tensor_index(index)
    torch.Tensor.__setitem__(self, index if found is None else found, value)


def _region(traced: _Traced, roots: list) -> tuple[int, list]:
    """Register the graph of ``traced`` computing ``roots`` with the runtime. Returns its key and
    each parameter's source: ``("in", k)`` for explicit input ``k``, ``("outer", node)`` for a
    value of the enclosing scope (or a leaf made in the body)."""
    stand_in: dict[int, Node] = {}  # id(placeholder) -> the value of the enclosing scope

    def replace(n: Node) -> Node | None:
        if id(n) not in traced.outer:
            return None
        p = data_leaf(_Slot(), n.dtype, n.shape)
        stand_in[id(p)] = n
        return p

    roots = substituted(roots, {}, replace)
    graph = cut_graph(roots)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    outputs = tuple(position[id(r)] for r in roots)
    key = digest((graph.key, outputs))
    runtime.register_call(key, graph.plan(), outputs)
    index = {id(leaf): k for k, leaf in enumerate(traced.leaves)}
    return key, [
        ("in", index[id(p)]) if id(p) in index else ("outer", stand_in.get(id(p), p))
        for p in graph.params
    ]


def _operands(regions: list[list], explicit: list, inputs: list[list[int]], carried: dict) -> tuple:
    """The node's operands, ``explicit`` nodes then each other value of the enclosing scope the
    regions read, and per region the operand index of each parameter: explicit input ``k`` of
    region ``r`` is operand ``inputs[r][k]``; an outer value in ``carried`` (id -> operand
    index: a storage a loop writes, read as its carry) is that operand."""
    nodes = list(explicit)
    at = dict(carried)
    maps = []
    for r, region in enumerate(regions):
        m = []
        for kind, what in region:
            if kind == "in":
                m.append(inputs[r][what])
                continue
            if id(what) not in at:
                at[id(what)] = len(nodes)
                nodes.append(what)
            m.append(at[id(what)])
        maps.append(tuple(m))
    return nodes, maps


def _nodes(tensors: list) -> list:
    return [t._lazy.node for t in tensors]


def _on_device(values: list, device: int) -> list:
    """Tensors not on the lazy device (a CPU predicate, as CUDA takes) moved onto it."""
    return [v if isinstance(v, LazyTensor) else v.to(torch.device("lazy", device)) for v in values]


def _device_of(values: list) -> int:
    return next((v._lazy.device for v in values if isinstance(v, LazyTensor)), 0)


def _node(op: str, operands: list, arg: tuple, roots: list) -> Node:
    """A node of ``op`` whose outputs are of ``roots``' dtypes and shapes."""
    return Node(
        op, tuple(operands), arg, tuple(r.dtype for r in roots), tuple(r.shape for r in roots)
    )


def _wrap(node: Node, metas: list, device: int, start: int) -> list:
    """Lazy tensors on outputs ``start...`` of ``node``, of ``metas``."""
    return [
        fresh(getitem(node, k), device, dense_meta(shape, dtype))
        for k, (shape, dtype) in enumerate(metas, start)
    ]


def _check_same(what: str, a: str, b: str, x: Any, y: Any) -> None:
    if x != y:
        raise RuntimeError(f"{what}: {a} and {b} must match, but {a} are {x} and {b} are {y}")


# ----------------------------------------------------------------------------------------------
# The operators (``py_impl(LazyTensor)`` of PyTorch's higher-order operators).


def _branches(true_fn: Callable, false_fn: Callable, flat: list, spec: Any, device: int) -> list:
    """Both branches of a ``cond`` on ``flat`` operands, traced."""
    return [
        _trace(lambda *a, fn=fn: fn(*pytree.tree_unflatten(list(a), spec)), _metas(flat),
               device, "torch.cond", loop=False)
        for fn in (true_fn, false_fn)
    ]  # fmt: skip


def cond(
    pred: Any, true_fn: Callable, false_fn: Callable, operands: Any, branches: list | None = None
) -> Any:
    """``branches``: both branches traced already (``_cond_autograd``), or None."""
    flat, spec = pytree.tree_flatten(tuple(operands))
    device = _device_of([pred, *flat])
    flat = _on_device(flat, device)
    if not isinstance(pred, torch.Tensor):
        return (true_fn if pred else false_fn)(*pytree.tree_unflatten(flat, spec))
    (pred,) = _on_device([pred], device)
    if branches is None:
        branches = _branches(true_fn, false_fn, flat, spec, device)
    t, f = branches
    _check_same("torch.cond", "true_fn's outputs", "false_fn's", t.spec, f.spec)
    _check_same("torch.cond", "true_fn's output shapes and dtypes", "false_fn's", t.metas(),
                f.metas())  # fmt: skip
    # What either branch writes, a storage of the enclosing scope or an operand, is an output of
    # both (the value it had where a branch leaves it).
    writes = list({**t.writes, **f.writes}.values())
    written = sorted(set(t.written_inputs()) | set(f.written_inputs()))
    keys, regions = [], []
    for b in branches:
        roots = [v._lazy.node for v in b.results] + [b.value_of(s, old) for s, old, _ in writes]
        key, region = _region(b, roots + [b.after[k] for k in written])
        keys.append(key)
        regions.append(region)
    explicit = [v._lazy.node for v in flat]
    identity = list(range(len(flat)))
    nodes, maps = _operands(regions, explicit, [identity, identity], {})
    roots = [v._lazy.node for v in t.results] + [old for _, old, _ in writes]
    roots += [flat[k]._lazy.node for k in written]
    node = _node(COND, [pred._lazy.node, *nodes], (keys[0], maps[0], keys[1], maps[1]), roots)
    results = _wrap(node, t.metas(), device, 0)
    for j, (s, _, _) in enumerate(writes, len(results)):
        s.set(getitem(node, j))
    start = len(results) + len(writes)
    for v, k in zip(_wrap(node, _metas([flat[k] for k in written]), device, start), written):
        assign(flat[k], v)
    return pytree.tree_unflatten(results, t.spec)


class _CondGrad(torch.autograd.Function):
    """``torch.cond`` with autograd: the forward is the lazy ``cond``; the backward is another
    ``cond`` on the same predicate whose branches compute each branch's vector-Jacobian product
    (traced with autograd on placeholders, so the backward is one node too). Gradients reach the
    explicit floating-point operands; a branch that reads a tensor of the enclosing scope that
    requires grad is refused (pass it as an operand)."""

    @staticmethod
    def forward(ctx, pred, true_fn, false_fn, info, *flat):  # type: ignore[override]
        ctx.fns, ctx.spec = (true_fn, false_fn), info["spec"]
        ctx.save_for_backward(pred, *flat)
        operands = pytree.tree_unflatten(list(flat), ctx.spec)
        with torch._C._AutoDispatchBelowAutograd():
            out = cond(pred, true_fn, false_fn, operands, info["branches"])
        flat_out, info["out_spec"] = pytree.tree_flatten(out)  # for the caller, to rebuild it
        return tuple(flat_out)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        pred, *flat = ctx.saved_tensors
        wanted = [k for k, v in enumerate(flat) if v.is_floating_point() or v.is_complex()]
        spec, n = ctx.spec, len(flat)

        def vjp(fn: Callable) -> Callable:
            def branch(*args: Any) -> tuple:
                ops, outer_grads = list(args[:n]), args[n:]
                with torch.enable_grad():
                    for k in wanted:
                        ops[k] = ops[k].detach().requires_grad_()
                    outs = pytree.tree_leaves(fn(*pytree.tree_unflatten(ops, spec)))
                    pairs = [(o, g) for o, g in zip(outs, outer_grads) if o.requires_grad]
                    found = torch.autograd.grad(
                        [o for o, _ in pairs], [ops[k] for k in wanted],
                        [g for _, g in pairs], allow_unused=True,
                    )  # fmt: skip
                return tuple(
                    torch.zeros_like(ops[k]) if g is None else g for k, g in zip(wanted, found)
                )

            return branch

        true_fn, false_fn = ctx.fns
        with torch.no_grad():
            found = cond(pred, vjp(true_fn), vjp(false_fn), (*flat, *grads))
        out: list = [None] * n
        for k, g in zip(wanted, found):
            out[k] = g
        return (None, None, None, None, *out)


def _grad_free(what: str, bodies: list[_Traced]) -> list[_Traced]:
    """``bodies`` (traced with grad enabled), after raising where one reads a tensor of the
    enclosing scope that requires grad: its gradient would be lost without a word."""
    for traced in bodies:
        if any(v.requires_grad for v in traced.results):
            raise NotImplementedError(
                f"{what} on lazy tensors: a body reads a tensor of the enclosing scope that "
                "requires grad (a parameter, say); pass it as an operand"
                + ("" if what == "torch.cond" else ", under torch.no_grad()")
            )
    return bodies


def _cond_autograd(pred: Any, true_fn: Callable, false_fn: Callable, operands: Any) -> Any:
    """``cond`` at lazy tensors' autograd key: recorded with its backward (``_CondGrad``) where
    an operand requires grad."""
    flat, spec = pytree.tree_flatten(tuple(operands))
    if not torch.is_grad_enabled():
        with torch._C._AutoDispatchBelowAutograd():
            return cond(pred, true_fn, false_fn, operands)
    if any(not isinstance(v, torch.Tensor) for v in flat):
        raise TypeError("torch.cond on lazy tensors with grad enabled takes tensor operands only")
    device = _device_of([pred, *flat])
    flat = _on_device(flat, device)
    branches = _grad_free("torch.cond", _branches(true_fn, false_fn, flat, spec, device))
    if not isinstance(pred, torch.Tensor):
        return (true_fn if pred else false_fn)(*pytree.tree_unflatten(flat, spec))
    if not any(v.requires_grad for v in flat):
        with torch._C._AutoDispatchBelowAutograd():
            return cond(pred, true_fn, false_fn, operands, branches)
    (pred,) = _on_device([pred], device)
    info = {"spec": spec, "branches": branches}
    out = _CondGrad.apply(pred, true_fn, false_fn, info, *flat)
    return pytree.tree_unflatten(list(out), info["out_spec"])


def _loop_autograd(what: str, impl: Callable) -> Callable:
    """A loop at lazy tensors' autograd key: no autograd graph is recorded through it, so it
    refuses to run where one is wanted (an input, or a tensor its body reads, requires grad)."""

    def kernel(*args: Any) -> Any:
        if torch.is_grad_enabled():
            leaves = [v for v in pytree.tree_leaves(args) if isinstance(v, torch.Tensor)]
            if any(v.requires_grad for v in leaves):
                raise NotImplementedError(
                    f"{what} on lazy tensors records no autograd graph: call it under "
                    "torch.no_grad() or on tensors that do not require grad"
                )
            device = _device_of(leaves)
            if what == "while_loop":  # (cond_fn, body_fn, carried_inputs, additional_inputs)
                extra = list(args[3])
                body = (lambda *c: args[1](*c, *extra), _metas(list(args[2])))
            elif what == "map":  # (f, xs, pos_args)
                extra = list(args[2])
                metas = [(tuple(x.shape[1:]), x.dtype) for x in args[1]]
                body = (lambda *a: args[0](*a, *extra), metas)
            else:  # scan: (combine_fn, init, xs, additional_inputs)
                extra = list(args[3])
                metas = _metas(list(args[1])) + [(tuple(x.shape[1:]), x.dtype) for x in args[2]]
                body = (lambda *a: args[0](*a, *extra), metas)
            _grad_free(what, [_trace(*body, device, what, loop=True)])
        with torch._C._AutoDispatchBelowAutograd():
            return impl(*args)

    return kernel


def _loop_carries(body: _Traced, what: str) -> list:
    """The storages of the enclosing scope a loop body writes, carried after the explicit
    carries: (storage, value before, value after) each."""
    if body.written_inputs():
        raise RuntimeError(
            f"{what} on lazy tensors: the body writes into a carried input in place; return the "
            "new value instead"
        )
    return list(body.writes.values())


def while_loop(cond_fn: Callable, body_fn: Callable, carried_inputs: tuple,
               additional_inputs: tuple) -> Any:  # fmt: skip
    what = "while_loop"
    flat = list(carried_inputs)
    if any(not isinstance(v, torch.Tensor) for v in flat):
        raise TypeError(f"{what} on lazy tensors carries tensors only, got {flat}")
    device = _device_of([*flat, *additional_inputs])
    flat = _on_device(flat, device)
    extra_in = list(additional_inputs)
    metas = _metas(flat)
    body = _trace(lambda *c: body_fn(*c, *extra_in), metas, device, what, loop=True)
    _check_same(what, "body_fn's output shapes and dtypes", "the carried inputs'",
                body.metas(), metas)  # fmt: skip
    writes = _loop_carries(body, what)
    check = _trace(lambda *c: cond_fn(*c, *extra_in), metas, device, what, loop=True)
    if check.writes or check.written_inputs():
        raise RuntimeError(
            f"{what} on lazy tensors: cond_fn writes a tensor in place or draws random numbers"
        )
    if check.metas() not in ([((), torch.bool)], [((1,), torch.bool)]):
        raise RuntimeError(
            f"{what}: cond_fn must return a boolean tensor of one element, got {check.metas()}"
        )
    n = len(flat) + len(writes)
    body_key, body_region = _region(body, _nodes(body.results) + [new for _, _, new in writes])
    cond_key, cond_region = _region(check, _nodes(check.results))
    explicit = [v._lazy.node for v in flat] + [old for _, old, _ in writes]
    carried = {id(old): len(flat) + j for j, (_, old, _) in enumerate(writes)}
    identity = list(range(len(flat)))
    nodes, (cond_map, body_map) = _operands(
        [cond_region, body_region], explicit, [identity, identity], carried
    )
    node = _node(WHILE, nodes, (cond_key, cond_map, body_key, body_map, n), explicit)
    results = _wrap(node, metas, device, 0)
    for j, (s, _, _) in enumerate(writes, len(flat)):
        s.set(getitem(node, j))
    return pytree.tree_unflatten(results, body.spec)


def scan(combine_fn: Callable, init: list, xs: list, additional_inputs: tuple) -> Any:
    what = "scan"
    device = _device_of([*init, *xs, *additional_inputs])
    init, xs = _on_device(list(init), device), _on_device(list(xs), device)
    extra_in = list(additional_inputs)
    length = xs[0].shape[0]
    metas = _metas(init) + [(tuple(x.shape[1:]), x.dtype) for x in xs]
    body = _trace(lambda *a: combine_fn(*a, *extra_in), metas, device, what, loop=True)
    _check_same(what, "combine_fn's next carry shapes and dtypes", "init's",
                body.metas()[: len(init)], _metas(init))  # fmt: skip
    writes = _loop_carries(body, what)
    n = len(init) + len(writes)
    # The body's outputs: its next carries (the written storages' after the explicit ones), then
    # its ys.
    outs = _nodes(body.results)
    key, region = _region(
        body, outs[: len(init)] + [new for _, _, new in writes] + outs[len(init) :]
    )
    # Operands: the carries (explicit, then the written storages), then xs, then the rest.
    explicit = [v._lazy.node for v in init] + [old for _, old, _ in writes]
    explicit += [x._lazy.node for x in xs]
    carried = {id(old): len(init) + j for j, (_, old, _) in enumerate(writes)}
    inputs = list(range(len(init))) + [n + k for k in range(len(xs))]
    nodes, (body_map,) = _operands([region], explicit, [inputs], carried)
    # The node's outputs: the final carries (the written storages' among them), then each y
    # stacked over the iterations.
    ys = body.metas()[len(init) :]
    carries = explicit[:n]
    dtypes = tuple(c.dtype for c in carries) + tuple(dtype_name(d) for _, d in ys)
    shapes = tuple(c.shape for c in carries) + tuple((length, *s) for s, _ in ys)
    node = Node(SCAN, tuple(nodes), (key, body_map, n, len(xs)), dtypes, shapes)
    results = _wrap(node, _metas(init), device, 0)
    for j, (s, _, _) in enumerate(writes, len(init)):
        s.set(getitem(node, j))
    results += _wrap(node, [((length, *s), d) for s, d in ys], device, n)
    return pytree.tree_unflatten(results, body.spec)


def map_(f: Callable, xs: list, pos_args: list) -> Any:
    """``torch._higher_order_ops.map``: a ``scan`` without a carry."""
    return scan(lambda *a: ((), f(*a)), [], list(xs), tuple(pos_args))[1]


def _lazy_call(args: Any, kwargs: Any) -> bool:
    return any(type(x) is LazyTensor for x in pytree.tree_leaves((args, kwargs)))


def _install() -> None:
    """Route eager calls of PyTorch's control-flow operators with lazy tensors straight to the
    operator (module docstring): torch 2.12 on compiles them in ``_hop_compile_and_call``, torch
    2.11 calls ``torch.compile`` itself inside ``setup_compilation_env``."""
    from torch._higher_order_ops import utils

    original = getattr(utils, "_hop_compile_and_call", None)
    if original is None:
        _install_compile_env(utils)
        return
    if getattr(original, "_lazy_patch", False):
        return

    @functools.wraps(original)
    def _hop_compile_and_call(fn: Callable, args: tuple, kwargs: dict | None = None) -> Any:
        if not _lazy_call(args, kwargs):
            return original(fn, args, kwargs)
        return fn(*args, **(kwargs or {}))

    _hop_compile_and_call._lazy_patch = True
    utils._hop_compile_and_call = _hop_compile_and_call


def _install_compile_env(utils: Any) -> None:
    """Inside ``setup_compilation_env`` (where torch 2.11's operators compile themselves),
    ``torch.compile(fn, ...)`` gives a function that calls ``fn`` itself when given lazy tensors
    (other calls compile as before)."""
    env = getattr(utils, "setup_compilation_env", None)
    if env is None or getattr(env, "_lazy_patch", False):
        return

    def compile_or_call(compile_: Callable, fn: Callable, *options: Any, **more: Any) -> Any:
        compiled = compile_(fn, *options, **more)

        def call(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs) if _lazy_call(args, kwargs) else compiled(*args, **kwargs)

        return call

    @contextlib.contextmanager
    @functools.wraps(env)
    def setup_compilation_env(*args: Any, **kwargs: Any) -> Any:
        with env(*args, **kwargs) as backend:
            compile_ = torch.compile
            torch.compile = functools.partial(compile_or_call, compile_)
            try:
                yield backend
            finally:
                torch.compile = compile_

    setup_compilation_env._lazy_patch = True
    utils.setup_compilation_env = setup_compilation_env


def _register() -> None:
    from torch._higher_order_ops.cond import cond_op
    from torch._higher_order_ops.map import map_impl
    from torch._higher_order_ops.scan import scan_op
    from torch._higher_order_ops.while_loop import while_loop_op

    ops = ((cond_op, cond), (while_loop_op, while_loop), (scan_op, scan), (map_impl, map_))
    for op, impl in ops:
        if LazyTensor not in op.python_key_table:
            op.py_impl(LazyTensor)(impl)
    autograd = DispatchKey.AutogradLazy
    if autograd not in cond_op.py_kernels:
        cond_op.py_impl(autograd)(_cond_autograd)
        while_loop_op.py_impl(autograd)(_loop_autograd("while_loop", while_loop_op))
        scan_op.py_impl(autograd)(_loop_autograd("scan", scan_op))
        map_impl.py_impl(autograd)(_loop_autograd("map", map_impl))
    _install()


_register()
