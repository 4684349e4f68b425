"""Framework-neutral lazy IR: nodes, hashing, live values, the graph cut and text dumps."""

from lazy_core.dump import ir_text
from lazy_core.view import NotWritable, View, ViewStep
from lazy_core.graph import Graph, cut_graph
from lazy_core.ir import Node, Operand, constant, data_leaf, getitem, scalar_leaf
from lazy_core.value import Storage, live_storages, pending_storages

__all__ = [
    "Graph",
    "NotWritable",
    "Node",
    "Operand",
    "Storage",
    "View",
    "ViewStep",
    "constant",
    "cut_graph",
    "data_leaf",
    "getitem",
    "ir_text",
    "live_storages",
    "pending_storages",
    "scalar_leaf",
]
