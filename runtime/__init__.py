"""Runtime: cut graph -> StableHLO -> cached XLA executable; device buffers, transfers, metrics."""

from runtime import config, metrics, processes, spmd
from runtime.device import (
    device,
    devices,
    global_devices,
    platform_of,
    stage,
    to_device,
    to_host,
)
from runtime.executor import (
    GraphError,
    check_errors,
    executable_memory,
    raise_interrupt,
    reused_buffers,
    run_graph,
    set_cache_dir,
    stablehlo_text,
    wait_device_ops,
)
from runtime.launcher import resolve
from runtime.program import (
    CALL,
    COND,
    SCAN,
    WHILE,
    has_lowering,
    op_category,
    register_call,
    rng_state,
)

__all__ = [
    "CALL",
    "COND",
    "SCAN",
    "WHILE",
    "GraphError",
    "check_errors",
    "config",
    "device",
    "devices",
    "executable_memory",
    "global_devices",
    "has_lowering",
    "metrics",
    "op_category",
    "platform_of",
    "processes",
    "raise_interrupt",
    "register_call",
    "resolve",
    "reused_buffers",
    "rng_state",
    "run_graph",
    "set_cache_dir",
    "spmd",
    "stablehlo_text",
    "stage",
    "to_device",
    "to_host",
    "wait_device_ops",
]
