"""Framework-neutral lazy IR: nodes, hashing, live values, the graph cut, text and dot dumps."""

try:  # the C extension (lazy_core/csrc) that holds the IR's types; built by pip install
    from lazy_core import _native  # noqa: F401
except ImportError as e:  # pragma: no cover - an install without its build step
    raise ImportError(
        "lazy_core's C extension (lazy_core._native) is not built. Install the package with a C++ "
        "compiler present, e.g. `apt install g++` (or `xcode-select --install` on macOS), then "
        "`pip install -e .`"
    ) from e

from lazy_core.digest import digest, digest_with, register_atoms
from lazy_core.dump import ir_dot, ir_text
from lazy_core.graph import Graph, cut_graph
from lazy_core.ir import Node, Operand, constant, data_leaf, getitem, scalar_leaf
from lazy_core.value import Storage, live_storages, pending_and_held, pending_storages
from lazy_core.view import NotWritable, View, ViewStep

__all__ = [
    "Graph",
    "Node",
    "NotWritable",
    "Operand",
    "Storage",
    "View",
    "ViewStep",
    "constant",
    "cut_graph",
    "data_leaf",
    "digest",
    "digest_with",
    "getitem",
    "ir_dot",
    "ir_text",
    "live_storages",
    "pending_and_held",
    "pending_storages",
    "register_atoms",
    "scalar_leaf",
]
