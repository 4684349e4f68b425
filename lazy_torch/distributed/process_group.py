"""``torch.distributed`` on lazy tensors: the process-group backend "lazy".

``torch.distributed.init_process_group("lazy")`` (torchrun's environment, before any lazy device
is used) joins the processes' JAX runtimes (``initialize``). Its collectives on lazy tensors are
recorded like any op, one node each, and lowered to XLA's collectives over a mesh of one device
per process (lowerings/collectives.py); the graph runs at the next barrier, on every process at
once. Nothing waits when a collective is called: its ``Work`` is complete, and its value is
computed with the rest of the step, so ``DistributedDataParallel``'s bucketed all-reduces become
part of the training step's one program.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

import runtime
from lazy_core import Node, Operand
from lazy_torch import views
from lazy_torch.distributed.processes import initialize
from lazy_torch.sync import mark_step
from lazy_torch.tensor import LazyTensor, dense_meta, fresh

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
}


def _op(op: dist.ReduceOp) -> str:
    for kind, name in _OPS.items():  # a ReduceOp equals its kind, but hashes otherwise
        if op == kind:
            return name
    raise NotImplementedError(f"the 'lazy' process group reduces with {list(_OPS.values())}")


def _lazy(t: torch.Tensor) -> LazyTensor:
    if not isinstance(t, LazyTensor):
        raise TypeError(
            f"the 'lazy' process group takes lazy tensors, not one on {t.device} (give CPU tensors "
            "a group of their own: init_process_group('cpu:gloo,lazy:lazy'))"
        )
    return t


def _collective(op: str, t: torch.Tensor, extra: tuple, shape: tuple[int, ...]) -> Node:
    """The node of ``op`` on ``t``'s value with arguments ``extra``, over the group of this
    process's device that holds ``t``."""
    t = _lazy(t)
    node = t._lazy.node
    group = runtime.processes.group_mesh(t._lazy.device)
    return Node(op, (node,), ((Operand(0), *extra, group), ()), node.dtype, shape)


def _tensor(node: Node, like: torch.Tensor) -> LazyTensor:
    return fresh(node, like._lazy.device, dense_meta(tuple(node.shape), like.dtype))


def _done(result: object) -> dist.Work:
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class ProcessGroupLazy(dist.ProcessGroup):
    """The world of a multi-process run: every process, one device each (the one holding the
    tensors a collective is given)."""

    def __init__(self, rank: int, size: int):
        super().__init__(rank, size)
        self._size = size

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "lazy"

    def allreduce(self, tensors: Sequence[torch.Tensor], opts=None) -> dist.Work:
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for t in tensors:
            views.write(t, _collective("lazy.all_reduce", t, (op,), tuple(t.shape)))
        return _done(list(tensors))

    allreduce_coalesced = allreduce

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> dist.Work:
        views.write(output, self._gather(input))
        return _done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> dist.Work:
        for output, input in zip(outputs, inputs, strict=True):
            views.write(output, self._gather(input))
        return _done(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather(self, output_lists, inputs, opts=None) -> dist.Work:
        for outputs, input in zip(output_lists, inputs, strict=True):
            stacked = _tensor(self._gather(input.reshape(1, *input.shape)), input)
            for r, out in enumerate(outputs):
                out.copy_(stacked[r])
        return _done(output_lists)

    def _gather(self, input: torch.Tensor) -> Node:
        shape = (input.shape[0] * self._size, *input.shape[1:])
        return _collective("lazy.all_gather", input, (), shape)

    def _reduce_scatter_base(self, output, input, opts=None) -> dist.Work:
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        views.write(output, self._scatter(input, op))
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None) -> dist.Work:
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for output, input in zip(outputs, inputs, strict=True):
            views.write(output, self._scatter(input, op))
        return _done(list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outputs, input_lists, opts=None) -> dist.Work:
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        for output, inputs in zip(outputs, input_lists, strict=True):
            stacked = torch.stack(list(inputs))
            part = _tensor(self._scatter(stacked, op), stacked)
            output.copy_(part.reshape(output.shape))
        return _done(list(outputs))

    def _scatter(self, input: torch.Tensor, op: str) -> Node:
        if input.shape[0] % self._size:
            raise ValueError(
                f"reduce_scatter splits dimension 0 ({input.shape[0]}) over {self._size} processes"
            )
        shape = (input.shape[0] // self._size, *input.shape[1:])
        return _collective("lazy.reduce_scatter", input, (op,), shape)

    def broadcast(self, tensors: Sequence[torch.Tensor], opts=None) -> dist.Work:
        source = opts.rootRank if opts is not None else 0
        for t in tensors:
            views.write(t, _collective("lazy.broadcast", t, (source,), tuple(t.shape)))
        return _done(list(tensors))

    def barrier(self, opts=None) -> dist.Work:
        """Every process's pending work dispatched, then every process here."""
        mark_step()
        runtime.processes.barrier()
        return _done([])


def _create(store, rank: int, size: int, timeout) -> ProcessGroupLazy:
    if size > 1 and not runtime.processes.joined():
        initialize(num_processes=size, process_id=rank, store=store)
    if size != runtime.processes.process_count():
        raise NotImplementedError(
            f"a 'lazy' process group spans every process ({runtime.processes.process_count()}), "
            f"not {size}"
        )
    runtime.spmd.enable()
    return ProcessGroupLazy(rank, size)


dist.Backend.register_backend("lazy", _create, devices=["lazy"])
