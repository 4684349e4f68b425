"""The C++ extension that links against torch: lazy tensors' wrappers and the fused linear
layer's autograd node.

- ``make_wrapper`` (``csrc/wrapper.cpp``) is ``torch.Tensor._make_wrapper_subclass`` for lazy
  tensors. Every op on a lazy tensor makes one or more wrapper tensors, and PyTorch's version
  spends most of its time in its general argument parser (figures: benchmarks/RESULTS.md, "Host
  time per op"); this one reads exactly the arguments lazy_torch passes.
- ``set_detach`` (``csrc/wrapper.cpp``): the wrappers' TensorImpl calls the class's
  ``__torch_dispatch__`` with ``aten.detach`` itself when autograd detaches a lazy tensor (saving
  an output, unpacking it), where PyTorch's route imports torch and looks the op up on each call.
- ``linear`` and ``set_linear_backward`` (``csrc/linear.cpp``) give linear.py's fused layer a C++
  autograd node instead of a ``torch.autograd.Function``.
- ``count_steps`` (``csrc/steps.cpp``) counts Adam's CPU step tensors for fused.py's step, as
  ``torch._foreach_add_`` and ``item`` would, without a dispatch per tensor.
- ``module_guards`` (``csrc/guards.cpp``) reads the guards of a module compiled by
  ``lazy_torch.compile`` (capture.py) on each call.

It compiles against the installed torch's headers and libraries, and
``pip install -e .`` builds in an isolated environment without torch, so it is built here instead:
the first time a given torch, Python and source meet, in 30-60 s, into a cache directory
(``$LAZY_EXTENSION_DIR``, else ``$XDG_CACHE_HOME/lazy_torch`` or ``~/.cache/lazy_torch``), under a
file lock so that parallel processes build it once. A failed build leaves its compiler output
beside it and is not retried for the same key: ``import lazy_torch`` then raises an ImportError
naming that file. It is required, as the install's C extensions are.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

import runtime

_SOURCES = [
    Path(__file__).with_name("csrc") / name
    for name in ("wrapper.cpp", "linear.cpp", "steps.cpp", "guards.cpp")
]
_NAME = "lazy_torch_wrapper"  # the module name its PyInit_ function is named after


def _cache_dir() -> Path:
    if runtime.config.EXTENSION_DIR:
        return Path(runtime.config.EXTENSION_DIR)
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or Path.home() / ".cache"
    return Path(base) / "lazy_torch"


def _command(sources: list[Path], output: Path) -> list[str]:
    from torch.utils import cpp_extension

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    includes = [sysconfig.get_paths()["include"], *cpp_extension.include_paths()]
    return [
        os.environ.get("CXX", "c++"), *map(str, sources), "-o", str(output),
        "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{p}" for p in includes),
        f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{lib}",
    ]  # fmt: skip


def _target() -> Path:
    """The built module's path: keyed by the source, torch, Python and the command."""
    key = hashlib.sha256()
    for source in _SOURCES:
        key.update(source.read_bytes())
    key.update(f"{torch.__version__}|{sys.version}|{_command([], Path())}".encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return _cache_dir() / f"{_NAME}-{key.hexdigest()[:16]}{suffix}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _build(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    failed = target.with_suffix(".failed")
    with _locked(target.with_suffix(".lock")):
        if target.exists() or failed.exists():
            return
        print(
            f"lazy_torch: building {_NAME} for torch {torch.__version__} into "
            f"{target.parent} (once)",
            file=sys.stderr,
        )
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        try:
            done = subprocess.run(
                _command(_SOURCES, partial), check=False, capture_output=True, text=True
            )
        except OSError as e:  # no compiler
            failed.write_text(f"{type(e).__name__}: {e}\n")
            return
        if done.returncode != 0:
            failed.write_text(done.stdout + done.stderr)
            partial.unlink(missing_ok=True)
            return
        os.replace(partial, target)


def load() -> ModuleType | None:
    """The extension, built if need be; an ImportError that says why where it cannot be."""
    target = _target()
    if not target.exists():
        _build(target)
    if not target.exists():
        failed = target.with_suffix(".failed")
        raise ImportError(
            f"lazy_torch: building its torch-linked extension {_NAME} for torch "
            f"{torch.__version__} failed; the compiler's output is in {failed}. It needs the C++ "
            "compiler the install used (CXX picks another) and torch's headers; remove that file "
            "to try again."
        )
    spec = importlib.util.spec_from_file_location(_NAME, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
