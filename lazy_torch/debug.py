"""Graph dumps of pending lazy tensors: IR text and StableHLO."""

from __future__ import annotations

import runtime
from lazy_core import cut_graph
from lazy_core import ir_text as _ir_text
from lazy_torch.tensor import LazyTensor


def ir_text(*tensors: LazyTensor) -> str:
    """The pending IR graph of ``tensors``, one node a line.

    >>> import torch, lazy_torch
    >>> x = torch.zeros(2, device="lazy")
    >>> print(lazy_torch.debug.ir_text(x + 2).splitlines()[-2])
      ROOT 0: %3
    """
    return _ir_text([t._lazy.node for t in tensors])


def stablehlo_text(*tensors: LazyTensor) -> str:
    """The StableHLO module that would compute ``tensors`` (nothing is compiled or run)."""
    device = tensors[0]._lazy.device if tensors else 0
    graph = cut_graph([t._lazy.node for t in tensors], salt=("device", device))
    return runtime.stablehlo_text(graph, device)
