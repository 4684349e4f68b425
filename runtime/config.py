"""Environment-backed settings, read once at import."""

from __future__ import annotations

import os


def _flag(name: str, default: bool | None = False) -> bool | None:
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in ("0", "false", "no", "off")


# PJRT platform: cpu, gpu (cuda/rocm) or tpu; empty means JAX's default backend.
PLATFORM: str = os.environ.get("LAZY_PLATFORM", "").strip().lower()
# How many devices the CPU platform has (lazy:0 .. lazy:N-1), set in JAX before its first use of a
# device; 0 keeps JAX's count (one, or XLA_FLAGS=--xla_force_host_platform_device_count=N).
CPU_DEVICES: int = max(0, int(os.environ.get("LAZY_CPU_DEVICES", "0").strip() or 0))
# One stderr line per compile and execution, with its cause.
DEBUG: bool = _flag("LAZY_DEBUG")
# Decode transformers' generate() on a lazy model as one in-graph loop where its settings have
# in-graph rules (lazy_torch/hf_generate.py); 0 keeps transformers' Python loop, a graph a token.
HF_GENERATE: bool = _flag("LAZY_HF_GENERATE", default=True)
# Directory that receives every newly compiled graph: IR text and StableHLO, named by its hash.
DUMP_DIR: str = os.environ.get("LAZY_DUMP_DIR", "").strip()
# Directory of the persistent executable cache; empty turns it off.
CACHE_DIR: str = os.environ.get("LAZY_CACHE_DIR", "").strip()
# Donate the buffers a mark_step overwrites (parameters, optimizer state) to its outputs.
DONATE: bool = _flag("LAZY_DONATE", default=True)
# With DONATE, also give each mark_step the outputs of the previous one that no tensor holds any
# more (gradients set to None) to write its outputs into (runtime/donation.py), so a training loop's
# outputs stay in the same buffers: 1 or 0; unset means on for GPUs, whose command buffers (CUDA
# graphs) re-record every kernel that touches a moved buffer, and off elsewhere, where it saved no
# step time and costs a loop whose first step is its steady one a second compile. A dead output's
# memory is released at the next mark_step instead of at once.
RECYCLE: bool | None = _flag("LAZY_RECYCLE", default=None)
# Where lazy_torch/_wrapper.py keeps the C++ wrapper module it builds at first import; empty means
# $XDG_CACHE_HOME/lazy_torch, else ~/.cache/lazy_torch.
EXTENSION_DIR: str = os.environ.get("LAZY_EXTENSION_DIR", "").strip()
# Call executables from a thread of their own (launcher.py), so that an asynchronous barrier
# returns before the call does: 1 or 0; unset means on for GPUs and TPUs and off on the CPU
# platform, where the call runs the program itself on the host's cores and a thread only adds
# handoffs (figures: benchmarks/RESULTS.md, "Launch thread").
LAUNCH_THREAD: bool | None = _flag("LAZY_LAUNCH_THREAD", default=None)
# Run the foreach steps of PyTorch's Adam, AdamW and SGD (their default on lazy parameters) as their
# fused step, one node per call, where it computes the same (float32 and float64 parameters):
# the foreach path records one node per arithmetic step and parameter list (lazy_torch/fused.py).
FUSE_FOREACH_STEPS: bool = _flag("LAZY_FUSE_FOREACH_STEPS", default=True)
# Record a linear layer (F.linear; under lazy autocast also addmm) as one node, and its backward as
# one (lazy_torch/linear.py), instead of its transposes, products and their backward ops (and the
# casts under autocast).
FUSE_LINEAR: bool = _flag("LAZY_FUSE_LINEAR", default=True)
# Time two consecutive executions on the device in every this many launches, for the metric
# execute_time (runtime/executor.py); 1 times every one. Each timed execution wakes a thread that
# takes the GIL from tracing: timing every execution made a small CPU training step measurably
# slower (figures: benchmarks/RESULTS.md, "Execution timing").
TIME_EXECUTIONS: int = max(1, int(os.environ.get("LAZY_TIME_EXECUTIONS", "8").strip() or 8))
# The most compiled executables kept in memory (least recently used ones go first; a later use
# compiles again). On the CPU platform each holds memory mappings of JIT code: 3 for an add, over
# 100 for a sort; a process that reaches Linux's limit (vm.max_map_count, 65,530 by default)
# crashes inside XLA's compiler, as two CI runs did. So the cache also sheds its older half
# whenever the process holds more than MAPPINGS mappings (default: half the limit; checked every
# 16 compiles, on Linux).
EXECUTABLES: int = max(1, int(os.environ.get("LAZY_EXECUTABLES", "4096").strip() or 4096))


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0  # not Linux: no such limit


MAPPINGS: int = int(os.environ.get("LAZY_MAPPINGS", "").strip() or _map_limit() // 2)

# Op-by-op execution (runtime/interpret.py): once this many different graphs have been compiled
# for one user call site with none of its graphs coming back in between (the line of a mark_step
# or .item() in a loop whose graphs keep changing: episodes of new lengths, a longer sequence each
# token), a new graph there runs node by node on executables shared by every graph instead of
# being compiled whole; a graph that comes back is then compiled. 0 turns it off.
INTERPRET_AFTER: int = max(0, int(os.environ.get("LAZY_INTERPRET_AFTER", "4").strip() or 4))

# Compute a partial sync's small graph (an input check's .item(), a short sequence read at the end:
# lazy_torch/host_reads.py says which) on the host by eager PyTorch instead of compiling it: 1 or 0.
HOST_READS: bool = _flag("LAZY_HOST_READS", default=True)

# Automatic graph cuts (lazy_torch/sync.py): once a program has recorded this many IR nodes since
# its last barrier (a loop that never calls mark_step()), the next op first dispatches the
# pending graph, so its memory and compile time stay bounded. A GPT-2 training step records about
# 300 nodes a layer. 0 turns it off.
CUT_NODES: int = max(0, int(os.environ.get("LAZY_CUT_NODES", "").strip() or 20_000))

# Multi-process runs (runtime/processes.py): seconds a process waits for the others to join, and
# to reach the same execution over several processes' devices, before it raises.
DISTRIBUTED_TIMEOUT: float = float(os.environ.get("LAZY_DISTRIBUTED_TIMEOUT", "").strip() or 300)
