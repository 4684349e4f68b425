"""Scale-out: SPMD sharding of lazy tensors over a mesh of devices (GSPMD, XLA's partitioner,
inserts the collectives), multi-process runs, and torch.distributed's backend "lazy".

>>> import torch, lazy_torch
>>> from lazy_torch.distributed import Mesh, mark_sharding, get_sharding
>>> mesh = Mesh(range(lazy_torch.device_count()), (lazy_torch.device_count(),), ("data",))
>>> x = mark_sharding(torch.ones(8, 2, device="lazy"), mesh, ("data", None))
>>> get_sharding(x)[1]
('data', None)
"""

import torch.distributed

from lazy_torch.data import DeviceLoader
from lazy_torch.distributed.processes import initialize
from lazy_torch.distributed.spmd import Mesh, clear_sharding, fsdp, get_sharding, mark_sharding
from runtime.processes import GraphMismatch, process_count, process_index

if torch.distributed.is_available():  # registers torch.distributed's backend "lazy"
    from lazy_torch.distributed import process_group  # noqa: F401

__all__ = [
    "DeviceLoader",
    "GraphMismatch",
    "Mesh",
    "clear_sharding",
    "fsdp",
    "get_sharding",
    "initialize",
    "mark_sharding",
    "process_count",
    "process_index",
]
