"""Sweep the aten overloads that PyTorch's Python API reaches on device='lazy' and list those that
still fall back to the CPU.

python -m tests.ops.overload_sweep        # the full sweep (a few minutes): tests/ops/overloads.md

Calls come from OpInfo samples (function, method, in-place, operator and out= variants, and
float32 gradients) and from probes: every public callable of ``torch.Tensor`` (operators and
properties included), ``torch``, ``torch.nn.functional``, ``torch.linalg``, ``torch.special`` and
``torch.fft``, tried on small float32, int64 and bool tensors with a few argument patterns, plus
indexing and Python protocol calls. Each call runs in eager CPU first, under a dispatch mode that
lists the top-level aten overloads it reaches (calls eager rejects are dropped), then on lazy
copies under the same mode, which reads the fallback counters (``fallback::<overload>``) around
each overload: a fallback inside a decomposition is charged to the overload that reached it.
Values are not compared here (tests/ops/test_opinfo.py does that).

Each overload gets one status: ``fallback`` (some call ran it, or an op of its decomposition, on the
CPU), ``lowered`` (recorded, a view, a hand-written handler, or an in-place/out= variant of one),
``decomposed`` (``torch._decomp`` or CompositeImplicitAutograd, into ops that did not fall back),
``failing`` (lazy raised where eager did not) or ``not exercised``. The overloads are the ones the
calls reached plus every overload of the aten op named like a probed callable (``x.add`` ->
``aten.add.*``, ``torch.linalg.svd`` -> ``aten.linalg_svd.*``), less the CompositeImplicitAutograd
ones, which decompose before any backend sees them.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import itertools
import operator
import pathlib
import re
import sys
import time
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import lazy_torch
import runtime.config
from lazy_torch import dispatch as _dispatch
from lazy_torch import fallback as _fallback
from lazy_torch.tensor import LazyTensor
from tests.ops.coverage import KNOWN_FALLBACKS
from tests.ops.harness import CPU_ARGS, OPS, SKIP, to_lazy

HERE = pathlib.Path(__file__).parent
STATUSES = ("lowered", "decomposed", "fallback", "failing", "not exercised")
DTYPES = (torch.float32, torch.int64, torch.bool)
SAMPLES = 3  # OpInfo samples per entry and dtype (function variant; other variants get one)
GRAD_SAMPLES = 2  # float32 samples differentiated per entry

# Python operators: dunder core -> symbol. Calls are written with ``{0}``, ``{1}``, ... for the
# arguments, ``{all}`` for all of them and ``{rest}`` for all but the first.
BINARY = {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "div": "/", "floordiv": "//",
    "mod": "%", "pow": "**", "matmul": "@", "and": "&", "or": "|", "xor": "^",
    "lshift": "<<", "rshift": ">>",
}  # fmt: skip
COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
UNARY = {"__neg__": "-{0}", "__pos__": "+{0}", "__invert__": "~{0}", "__abs__": "abs({0})"}
OPERATORS = (
    {f"__{n}__" for n in (*BINARY, *COMPARE)}
    | {f"__r{n}__" for n in BINARY}
    | {f"__i{n}__" for n in BINARY}
    | set(UNARY)
    | {"__getitem__", "__setitem__"}
)
# Public callables that change process state, need other hardware or are not tensor ops.
NOT_PROBED = {
    "backward", "register_hook", "register_post_accumulate_grad_hook", "share_memory_",
    "pin_memory", "is_pinned", "cuda", "xpu", "ipu", "hpu", "mtia", "record_stream", "apply_",
    "map_", "map2_", "storage", "untyped_storage", "data_ptr", "module_load", "to_mkldnn",
    "numpy", "dim_order", "set_", "retain_grad", "requires_grad_", "rename", "rename_",
    "refine_names", "align_to", "align_as", "grad", "data",
}  # fmt: skip
# Name fragments of callables for layouts or backends this device does not have.
NOT_PROBED_PARTS = (
    "sparse", "quantize", "q_", "qscheme", "int_repr", "mkldnn", "cudnn", "miopen", "fbgemm",
    "nested", "vulkan", "_padded", "ccol", "crow", "coalesce", "to_dense",
)  # fmt: skip
UNREACHED = (
    "no sample or probe reached it (some have no Python spelling at all: Python passes numbers "
    "as tensors to ``torch.add(x, 1, out=y)``, never reaching ``aten.add.Scalar_out``)"
)
# Fallbacks this sweep finds that are gaps, not design, with their cause: the allow-list of
# tests/ops/test_overload_sweep.py (a new fallback fails it; drop an entry once it is lowered).
GAPS = {
    "aten._native_batch_norm_legit.out": "its functional overload writes running_mean and "
    "running_var, so no out= variant is derived from it",
    "aten.polygamma_.default": "polygamma_(self, n) orders its arguments unlike "
    "polygamma(n, self), so no in-place variant is derived",
    "aten.range.step": "no lowering (torch.range, deprecated; torch.arange is lowered)",
    "aten.binomial.default": "no lowering (random sampling)",
    "aten.dense_dim.default": "sparse-layout metadata returning an int: no handler",
    "aten.is_set_to.default": "storage identity check returning a bool: no handler",
    "aten.slice_inverse.default": "no lowering",
}
NOT_PROBED_REASON = (
    "not probed (process state, cuDNN/MIOpen/mkldnn/FBGEMM/CUDA-only, or sparse, quantized or "
    "nested layouts)"
)


# ----------------------------------------------------------------------------------------------
# Calls


@dataclasses.dataclass
class Call:
    """One Python-level call: ``fn(*args, **kwargs)`` on fresh CPU copies of what ``make``
    returns, written as ``text`` (see BINARY); ``grad``: differentiate its float outputs too.
    Calls of one ``key`` that reach the same overloads in the same dtypes run on lazy once."""

    text: str
    fn: Callable
    make: Callable[[], tuple[tuple, dict]]
    grad: bool = False
    key: str = ""
    cpu_args: tuple[int, ...] = ()  # positions eager requires on the CPU for any device


def _fresh(x: Any) -> Any:
    def copy(v):
        if isinstance(v, torch.Tensor):
            return v.detach().clone().requires_grad_(v.requires_grad)
        return v

    return tree_map(copy, x)


def maker(args: tuple, kwargs: dict | None = None) -> Callable[[], tuple[tuple, dict]]:
    """A ``Call.make``: fresh copies of ``args`` and ``kwargs`` at each call."""
    return lambda: _fresh((args, dict(kwargs or {})))


def arity(text: str) -> int | None:
    """How many arguments an operator's ``text`` takes; None for ``{all}``/``{rest}`` calls."""
    if "{all}" in text or "{rest}" in text:
        return None
    return len(set(re.findall(r"\{(\d)\}", text)))


def spelled(call: Call, args: tuple, kwargs: dict) -> str:
    """The call written out: tensors as ``x``, ``y``, ... with their dtypes and shapes."""
    names: dict[int, str] = {}
    notes: dict[str, str] = {}

    def show(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            name = names.setdefault(id(v), "xyzwvuts"[len(names) % 8])
            notes.setdefault(name, f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}")
            return name
        if isinstance(v, torch.device) or (isinstance(v, str) and v == "cpu"):
            return "'lazy'"  # as the lazy call has it
        if isinstance(v, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in v):
            inner = ", ".join(show(t) for t in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner},)"
        text = repr(v)
        return text if len(text) <= 40 else text[:37] + "..."

    shown = [show(a) for a in args]
    named = [f"{k}={show(v)}" for k, v in kwargs.items()]
    text = call.text.format(
        *shown, all=", ".join(shown + named), rest=", ".join(shown[1:] + named)
    )
    if named and arity(call.text) is not None:
        text += " with " + ", ".join(named)
    if call.grad:
        text = f"grad of {text}"
    note = ", ".join(f"{n}: {d}" for n, d in notes.items())
    return f"{text}  ({note})" if note else text


def operator_text(name: str) -> str | None:
    """How a Tensor dunder is written in Python, or None for other names."""
    if name in UNARY:
        return UNARY[name]
    core = name[2:-2] if name.startswith("__") and name.endswith("__") else ""
    if core in BINARY:
        return "{0} " + BINARY[core] + " {1}"
    if core in COMPARE:
        return "{0} " + COMPARE[core] + " {1}"
    if core[:1] == "r" and core[1:] in BINARY:
        return "{1} " + BINARY[core[1:]] + " {0}"
    if core[:1] == "i" and core[1:] in BINARY:
        return "{0} " + BINARY[core[1:]] + "= {1}"
    if name == "__getitem__":
        return "{0}[{1}]"
    if name == "__setitem__":
        return "{0}[{1}] = {2}"
    return None


_OPERATOR_FUNCS = {getattr(operator, n): n for n in dir(operator) if not n.startswith("_")}


def _variant_text(fn: Callable, entry: str) -> str:
    """How an OpInfo variant is written: an operator, a method, or a function of ``torch``."""
    name = _OPERATOR_FUNCS.get(fn)
    if name is not None:
        text = operator_text(f"__{name.rstrip('_')}__")
        if text is not None:
            return text
    fname = getattr(fn, "__name__", "<lambda>")
    if getattr(fn, "__qualname__", "").startswith(("TensorBase.", "Tensor.")):
        return operator_text(fname) or "{0}." + fname + "({rest})"
    target: Any = torch
    for part in entry.split("."):
        target = getattr(target, part, None)
    if fname != "<lambda>" and target is not None:
        return f"torch.{entry}({{all}})"
    return f"op_db[{entry!r}]({{all}})"


def _samples(op: Any, dtype: torch.dtype, n: int, requires_grad: bool = False) -> list:
    """The first ``n`` samples of ``op``, from its generator directly: ``op.sample_inputs`` looks
    for the calling test in the stack at each call, which costs more than the rest of the sweep."""
    torch.manual_seed(0)
    try:
        samples = op.sample_inputs_func(op, "cpu", dtype, requires_grad)
        return list(itertools.islice(samples, n))
    except Exception:
        return []


def opinfo_calls() -> Iterator[Call]:
    """Calls from OpInfo samples: each entry's variants, an out= call and float32 gradients."""
    for entry, op in sorted(OPS.items()):
        if entry in SKIP or not op.supported_dtypes("cpu"):
            continue
        key = f"op_db:{entry}"
        text = _variant_text(op.op, entry)
        cpu = tuple(CPU_ARGS.get(entry, ()))
        for dtype in DTYPES:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            samples = _samples(op, dtype, SAMPLES)
            for i, sample in enumerate(samples):
                make = maker((sample.input, *sample.args), sample.kwargs)
                yield Call(text, op.op, make, key=key, cpu_args=cpu)
                if i:
                    continue
                variants = (
                    op.method_variant,
                    op.inplace_variant,
                    op.operator_variant,
                    op.inplace_operator_variant,
                )
                for fn in variants:
                    if fn is not None:
                        variant = _variant_text(fn, entry)
                        yield Call(variant, fn, make, key=f"{key}:{fn}", cpu_args=cpu)
                if op.supports_out:
                    yield _out_call(Call(text, op.op, make, key=key, cpu_args=cpu))
            if dtype == torch.float32 and op.supports_autograd:
                for sample in _samples(op, dtype, GRAD_SAMPLES, requires_grad=True):
                    make = maker((sample.input, *sample.args), sample.kwargs)
                    yield Call(text, op.op, make, grad=True, key=f"{key}:grad", cpu_args=cpu)


def _out_call(call: Call) -> Call:
    """``call`` with ``out=`` empty tensors of the dtypes of eager's results (None: eager's
    result is not a tensor or a tuple of them, and the call is dropped)."""

    def make() -> tuple[tuple, dict]:
        args, kwargs = call.make()
        try:
            result = call.fn(*_fresh(args), **_fresh(kwargs))
        except Exception:
            result = None
        if isinstance(result, torch.Tensor):
            kwargs["out"] = torch.empty(0, dtype=result.dtype)
        elif isinstance(result, tuple) and all(isinstance(r, torch.Tensor) for r in result):
            kwargs["out"] = tuple(torch.empty(0, dtype=r.dtype) for r in result) or None
        else:
            kwargs["out"] = None
        return args, kwargs

    return Call(call.text, call.fn, make, key=call.key + ":out", cpu_args=call.cpu_args)


# Python namespace -> (module, how its callables are written, prefix of their aten names)
NAMESPACES = {
    "torch.Tensor": (torch.Tensor, "{0}.NAME({rest})", ""),
    "torch": (torch, "torch.NAME({all})", ""),
    "torch.nn.functional": (F, "torch.nn.functional.NAME({all})", ""),
    "torch.linalg": (torch.linalg, "torch.linalg.NAME({all})", "linalg_"),
    "torch.special": (torch.special, "torch.special.NAME({all})", "special_"),
    "torch.fft": (torch.fft, "torch.fft.NAME({all})", "fft_"),
}
_NOT_OPS = {"handle_torch_function", "has_torch_function", "has_torch_function_unary",
            "has_torch_function_variadic", "boolean_dispatch", "assert_int_or_pair"}  # fmt: skip


def _is_tensor_op(ns: str, name: str, fn: Any) -> bool:
    """Whether ``fn``, public ``name`` of namespace ``ns``, is a tensor op of PyTorch's API."""
    if ns == "torch.Tensor":
        return True
    if inspect.isclass(fn) or not callable(fn) or name in _NOT_OPS:
        return False
    module = getattr(fn, "__module__", None) or ""
    if ns == "torch":
        builtin = getattr(torch._C._VariableFunctions, name, None) is fn
        return builtin or module in ("torch.functional", "torch._lowrank")
    return module.startswith("torch")


def api_callables() -> Iterator[tuple[str, str, Any, bool]]:
    """(namespace, name, callable or descriptor, whether probed) for each public tensor op of the
    API (on ``torch.Tensor``: its methods, operators and properties)."""
    for ns, (module, _, _) in NAMESPACES.items():
        for name in sorted(dir(module)):
            if name.startswith("_") and not (ns == "torch.Tensor" and name in OPERATORS):
                continue
            if ns == "torch.Tensor":
                fn = inspect.getattr_static(module, name, None)
            else:
                fn = getattr(module, name, None)
            if fn is None or not _is_tensor_op(ns, name, fn):
                continue
            probed = name not in NOT_PROBED and not any(p in name for p in NOT_PROBED_PARTS)
            yield ns, name, fn, probed


def probe_tensors(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 3x3 tensors of ``dtype`` (int64 ones hold negative values too)."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return tuple(torch.randint(0, 2, (3, 3), generator=g).bool() for _ in range(2))
    if dtype == torch.int64:
        return tuple(torch.randint(-4, 5, (3, 3), generator=g) for _ in range(2))
    return tuple(torch.randn(3, 3, generator=g) for _ in range(2))


INDEX = torch.tensor([[0, 2, 1], [1, 0, 2], [2, 1, 0]])


def patterns(t: torch.Tensor, u: torch.Tensor) -> list[tuple]:
    """Argument patterns a probe tries: unary, binary with a tensor or a Python number, a dim, a
    shape, an index tensor, a Python number first."""
    return [
        (t,), (t, u), (t, 1), (t, 1.5), (t, -1), (t, u, u), (t, 0, 1), (t, 1, INDEX),
        (t, INDEX), (t, [3, 3]), (2, t), (t, torch.int32),
    ]  # fmt: skip


# Factory calls (``torch.hann_window(3, device=...)``): the device becomes the lazy one on lazy.
FACTORY_PATTERNS = [(3,), (3, 3), (1, 3), ([1.0, 2.0],)]


def probe_calls(names: set[str] | None = None) -> Iterator[Call]:
    """Each probed public callable (or those of ``names``: ``torch.Tensor.__rshift__``) on each
    argument pattern that fits it, in each dtype; out= too for functions."""
    for ns, name, fn, probed in api_callables():
        key = f"{ns}.{name}"
        if not probed or (names is not None and key not in names):
            continue
        if ns == "torch.Tensor" and not callable(fn):  # a property: x.T, x.mT, x.real, ...
            get = (lambda n: lambda x: getattr(x, n))(name)
            for dtype in DTYPES:
                yield Call("{0}." + name, get, maker(probe_tensors(dtype)[:1]), key=key)
            continue
        template = NAMESPACES[ns][1].replace("NAME", name)
        text = (operator_text(name) if ns == "torch.Tensor" else None) or template
        fn = getattr(NAMESPACES[ns][0], name)
        for dtype in DTYPES:
            for pattern in patterns(*probe_tensors(dtype)):
                if arity(text) not in (None, len(pattern)):
                    continue
                call = Call(text, fn, maker(pattern), key=key)
                yield call
                if ns != "torch.Tensor" and not name.endswith("_"):
                    yield _out_call(call)
        if ns != "torch.Tensor":
            for pattern in FACTORY_PATTERNS:
                yield Call(text, fn, maker(pattern, {"device": "cpu"}), key=key)


def _on(x: torch.Tensor, index: Any) -> Any:
    """``index`` with its tensors on ``x``'s device, as a user writes them."""
    return tree_map(lambda v: v.to(x.device) if isinstance(v, torch.Tensor) else v, index)


def python_calls() -> Iterator[Call]:
    """Indexing and Python protocol calls: ``x[mask]``, ``x[idx] = y``, ``len(x)``, ``bool(x)``,
    ``x in y``, iteration, ``float(x)``, ``x.item()``, ``x.tolist()``."""

    def get(index):
        return lambda x: x[_on(x, index(x))]

    def put(index):
        def run(x, v):
            x[_on(x, index(x))] = v if not isinstance(v, torch.Tensor) else v[_on(v, index(v))]
            return x

        return run

    indices = {
        "0": 0, "1:": slice(1, None), "::2": slice(None, None, 2), "..., None": (..., None),
        "[0, 2]": [0, 2], "idx": INDEX[0], ":, idx": (slice(None), INDEX[0]), "-1": -1,
        "idx, idx": (INDEX[0], INDEX[1]), "True": True, "x > 0": None,
    }  # fmt: skip
    for dtype in DTYPES:
        t, u = probe_tensors(dtype)
        one = t[:1, :1].clone()
        value = True if dtype == torch.bool else u[0, 0].item()
        for text, index in indices.items():
            idx = (lambda i: lambda x: i)(index) if index is not None else (lambda x: x > 0)
            yield Call(f"{{0}}[{text}]", get(idx), maker((t,)), key=f"[{text}]")
            yield Call(f"{{0}}[{text}] = {{1}}", put(idx), maker((t, value)), key=f"[{text}]=")
            yield Call(
                f"{{0}}[{text}] = {{1}}[{text}]", put(idx), maker((t, u)), key=f"[{text}]=y"
            )
        protocol = [
            ("len({0})", len, (t,)), ("bool({0})", bool, (one,)), ("float({0})", float, (one,)),
            ("int({0})", int, (one,)), ("{0} in {1}", lambda x, y: x in y, (one, t)),
            ("list({0})", list, (t,)), ("{0}.item()", lambda x: x.item(), (one,)),
            ("{0}.tolist()", lambda x: x.tolist(), (t,)),
        ]  # fmt: skip
        for text, fn, args in protocol:
            yield Call(text, fn, maker(args), key=text)


def all_calls() -> Iterator[Call]:
    """Every call of the full sweep: probes, Python protocol calls, OpInfo samples."""
    yield from probe_calls()
    yield from python_calls()
    yield from opinfo_calls()


# ----------------------------------------------------------------------------------------------
# Running calls


def fallback_counts() -> dict[str, int]:
    """The ``fallback::<overload>`` counters, by overload."""
    return {
        k.removeprefix("fallback::"): v
        for k, v in lazy_torch.metrics.counters().items()
        if k.startswith("fallback::")
    }


def _touches(kind: type, *values: Any) -> bool:
    """Whether a tensor of type ``kind`` is among ``values`` (``aten.can_cast`` takes none)."""
    return any(isinstance(v, kind) for v in tree_flatten(values)[0])


class Reached(TorchDispatchMode):
    """Lists the top-level aten overloads a call reaches on tensors. With ``lazy``, only those on
    lazy tensors (not ops on CPU copies the call makes), each with the overloads that ran on the CPU
    fallback during it (its own, or ops of its decomposition), and those that raised."""

    def __init__(self, lazy: bool = False):
        super().__init__()
        self.lazy = lazy
        self.ops: dict[Any, set[str]] = {}
        self.raised: dict[Any, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.lazy:
            out = func(*args, **kwargs)
            if _touches(torch.Tensor, args, kwargs, out):
                self.ops.setdefault(func, set())
            return out
        before = fallback_counts()
        out = None
        try:
            out = func(*args, **kwargs)
            return out
        except Exception as e:
            self.raised.setdefault(func, _error(e))
            raise
        finally:
            fell = {k for k, v in fallback_counts().items() if v > before.get(k, 0)}
            lazy = _touches(LazyTensor, args, kwargs, out) or _on_lazy(kwargs.get("device"))
            if fell or lazy or func in self.raised:
                self.ops.setdefault(func, set()).update(fell)


def _on_lazy(device: Any) -> bool:
    return device is not None and torch.device(device).type == "lazy"


def _error(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def _differentiable(values: Any) -> list[torch.Tensor]:
    return [
        v for v in tree_flatten(values)[0]
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad
    ]  # fmt: skip


def _run(call: Call, args: tuple, kwargs: dict) -> Any:
    out = call.fn(*args, **kwargs)
    if call.grad:
        outs, inputs = _differentiable(out), _differentiable((args, kwargs))
        if not outs or not inputs:
            raise ValueError("nothing to differentiate")
        cotangents = [torch.ones_like(o) for o in outs]
        out = torch.autograd.grad(outs, inputs, cotangents, allow_unused=True)
    return out


def run_eager(call: Call, args: tuple, kwargs: dict) -> set[str] | None:
    """The overloads ``call`` reaches in eager CPU, or None when eager rejects it."""
    if kwargs.get("out", 0) is None:
        return None
    eager = Reached()
    args, kwargs = _fresh((args, kwargs))
    try:
        with eager:
            _run(call, args, kwargs)
    except Exception:
        return None
    return {str(f) for f in eager.ops}


@dataclasses.dataclass
class Observed:
    """What one call did on lazy tensors: the overloads it reached, each with the fallbacks it
    ran; those that raised, with the error; fallbacks outside any overload; the call's error."""

    spelling: str
    ops: dict[str, set[str]]
    raised: dict[str, str]
    stray: set[str]
    error: str | None


def run_lazy(call: Call, args: tuple, kwargs: dict) -> Observed:
    """Run ``call`` on lazy copies of its arguments and say what it reached and ran on the CPU."""
    args, kwargs = _fresh((args, kwargs))
    lazy_args = tuple(a if i in call.cpu_args else to_lazy(a) for i, a in enumerate(args))
    lazy_kwargs = to_lazy(kwargs)
    lazy = Reached(lazy=True)
    before = fallback_counts()
    error = None
    try:
        with lazy:
            _run(call, lazy_args, lazy_kwargs)
    except Exception as e:
        error = _error(e)
    charged = set().union(*lazy.ops.values())
    stray = {k for k, v in fallback_counts().items() if v > before.get(k, 0)} - charged
    return Observed(
        spelled(call, args, kwargs),
        {str(f): fell for f, fell in lazy.ops.items()},
        {str(f): e for f, e in lazy.raised.items()},
        stray,
        error,
    )


# ----------------------------------------------------------------------------------------------
# Classifying overloads


def _overload(name: str) -> Any:
    """The OpOverload named ``name`` (``aten.add.Tensor``), or None."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.rpartition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    except (AttributeError, RuntimeError):
        return None


def handling(func: Any) -> str:
    """How dispatch handled ``func`` when it ran: 'decomposed' (a ``torch._decomp`` or
    CompositeImplicitAutograd decomposition, or an in-place/out= variant of one), 'fallback', or
    'lowered' (recorded, a view, a hand-written handler, a variant of a recorded op)."""
    for _ in range(3):  # an in-place or out= variant: how its functional op is handled
        handler = _dispatch.handler_of(func)
        if handler is _fallback.run:
            return "fallback"
        qual = getattr(handler, "__qualname__", "").lstrip("_")
        if qual.startswith("decomposed."):
            return "decomposed"
        if qual.startswith("fallback_out_variant."):
            return "fallback"
        if not qual.startswith(("inplace.", "inplace_view.", "out_variant.")):
            return "lowered"
        func = inspect.getclosurevars(handler).nonlocals.get("functional")
        if func is None:
            break
    return "lowered"


_EAGER_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def _has_kernel(func: Any, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)


def named_overloads() -> tuple[dict[str, str], dict[str, str]]:
    """Overloads of the aten ops named like the API's callables: {overload: callable} for those
    that reach a backend, and {overload: reason} for those that cannot be exercised here."""
    reach, cannot = {}, {}
    for ns, name, _, probed in api_callables():
        prefix = NAMESPACES[ns][2]
        packet = getattr(torch.ops.aten, prefix + name, None)
        if packet is None or not hasattr(packet, "overloads"):
            continue
        for overload in packet.overloads():
            func = getattr(packet, overload)
            try:
                if _has_kernel(func, "CompositeImplicitAutograd"):
                    continue  # decomposes before any backend sees it
            except RuntimeError:
                continue  # a TorchScript-only overload (``aten.__and__.bool``): no dispatcher op
            key = str(func)
            reach.setdefault(key, f"{ns}.{name}")
            if not probed:
                cannot.setdefault(key, NOT_PROBED_REASON)
            elif not any(_has_kernel(func, k) for k in _EAGER_KEYS):
                cannot.setdefault(key, "no eager CPU kernel")
    return reach, cannot


@dataclasses.dataclass
class Report:
    """The sweep's findings, by overload."""

    status: dict[str, str]  # overload -> one of STATUSES
    fallbacks: dict[str, list[str]]  # overload that ran on the CPU -> spellings that reached it
    failing: dict[str, list[str]]  # overload -> '`spelling`: error' where lazy raised
    not_exercised: dict[str, str]  # overload -> why
    calls: int = 0
    lazy_calls: int = 0
    seconds: float = 0.0

    @property
    def counts(self) -> collections.Counter:
        return collections.Counter(self.status.values())


def sweep(calls: Iterable[Call], named: bool = True, log: bool = False) -> Report:
    """Exercise ``calls`` and classify every overload they reach on lazy tensors (with ``named``,
    also every overload the API names, see ``named_overloads``)."""
    start = time.perf_counter()
    torch.manual_seed(0)
    # OpInfo's random ops call torch._lazy.mark_step() to compare values, which this sweep does
    # not; graphs run whole, as under tests/conftest.py (runtime/interpret.py is for long loops).
    saved = torch._lazy, runtime.config.INTERPRET_AFTER
    torch._lazy = types.SimpleNamespace(mark_step=lambda *a, **k: None)
    runtime.config.INTERPRET_AFTER = 0
    try:
        found = _sweep(calls, log, start)
    finally:
        torch._lazy, runtime.config.INTERPRET_AFTER = saved
    return _classify(*found, named, time.perf_counter() - start)


def _sweep(calls: Iterable[Call], log: bool, start: float) -> tuple:
    done: set[tuple] = set()
    ok: set[str] = set()
    eager_only: dict[str, str] = {}
    fell: dict[str, list[str]] = collections.defaultdict(list)
    raised: dict[str, list[str]] = collections.defaultdict(list)
    n = n_lazy = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in calls:
            n += 1
            if log and n % 5000 == 0:
                print(f"{n} calls, {n_lazy} on lazy, {time.perf_counter() - start:.0f} s")
            args, kwargs = call.make()
            eager = run_eager(call, args, kwargs)
            if not eager:
                continue
            dtypes = tuple(
                t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
            )
            key = (call.key or id(call), frozenset(eager), dtypes, call.grad)
            if key in done:
                continue
            done.add(key)
            n_lazy += 1
            seen = run_lazy(call, args, kwargs)
            for op, fallbacks in seen.ops.items():
                if op in seen.raised:
                    _note(raised[op], f"`{seen.spelling}`: {seen.raised[op]}")
                else:
                    ok.add(op)
                for f in sorted(fallbacks):
                    via = "" if f == op else f" -> ... -> {f}"
                    _note(fell[f], f"`{seen.spelling}` -> {op}{via}")
            for f in sorted(seen.stray):
                _note(fell[f], f"`{seen.spelling}` -> {f} (outside any aten op)")
            if seen.error and not seen.raised:
                _note(raised["no aten op raised: the call"], f"`{seen.spelling}`: {seen.error}", 10)
            for op in eager - set(seen.ops):
                eager_only.setdefault(op, seen.spelling)
    return ok, fell, raised, eager_only, n, n_lazy


def _note(spellings: list[str], text: str, most: int = 3) -> None:
    if text not in spellings and len(spellings) < most:
        spellings.append(text)


def _classify(ok, fell, raised, eager_only, n, n_lazy, named, seconds) -> Report:
    status: dict[str, str] = {}
    not_exercised: dict[str, str] = {}
    for op in ok:
        func = _overload(op)
        # A fallback handler that never ran (an overload only some other argument reaches).
        status[op] = "lowered" if func is None else handling(func).replace("fallback", "lowered")
    for op in raised:
        if op not in ok and _overload(op) is not None:
            status[op] = "failing"
    for op in fell:
        status[op] = "fallback"
    reach, cannot = named_overloads() if named else ({}, {})
    for op, spelling in eager_only.items():
        if op not in status:
            status[op] = "not exercised"
            not_exercised[op] = f"eager reached it (`{spelling}`), lazy reached other overloads"
    for op in reach:
        if op not in status:
            status[op] = "not exercised"
            not_exercised[op] = cannot.get(op, UNREACHED)
    return Report(status, dict(fell), dict(raised), not_exercised, n, n_lazy, seconds)


# ----------------------------------------------------------------------------------------------
# The report


def markdown(report: Report) -> str:
    """The report as tests/ops/overloads.md has it."""
    counts = report.counts
    total = sum(counts.values())
    lines = [
        "# aten overloads reached from PyTorch's Python API on device='lazy'",
        "",
        "Generated by `python -m tests.ops.overload_sweep` (tests/ops/overload_sweep.py says how): "
        f"{report.calls} calls tried, {report.lazy_calls} accepted by eager CPU and run on lazy "
        "tensors. Statuses: `lowered` (recorded, a view, a hand-written handler, or an in-place or "
        "out= variant of one), `decomposed` (into ops that did not fall back), `fallback` (some "
        "call ran it, or an op of its decomposition, on the CPU), `failing` (raised on lazy "
        "tensors where eager did not, on every call that reached it), `not exercised`.",
        "",
        "| status | overloads | share |",
        "| --- | --- | --- |",
    ]
    for s in STATUSES:
        lines.append(f"| {s} | {counts[s]} | {100 * counts[s] / max(total, 1):.1f}% |")
    lines += [f"| total | {total} | |", ""]
    gaps = {op: s for op, s in report.fallbacks.items() if op not in KNOWN_FALLBACKS}
    lines += ["## Overloads that still fall back to the CPU", ""]
    for op, spellings in sorted(gaps.items()):
        cause = f" ({GAPS[op]})" if op in GAPS else " (new: not in GAPS of overload_sweep.py)"
        lines.append(f"- `{op}`{cause}: " + "; ".join(spellings))
    lines += ["none"] if not gaps else []
    lines += ["", "## Known design fallbacks (KNOWN_FALLBACKS of tests/ops/coverage.py)", ""]
    for op, reason in sorted(KNOWN_FALLBACKS.items()):
        seen = "seen" if op in report.fallbacks else "not reached by this sweep"
        lines.append(f"- `{op}` ({seen}): {reason}")
    lines += ["", "## Failing: lazy raised where eager CPU did not", ""]
    for op, errors in sorted(report.failing.items()):
        status = report.status.get(op, "")
        other = f" ({status} on other calls)" if status and status != "failing" else ""
        lines.append(f"- `{op}`{other}: " + "; ".join(errors))
    lines += ["none"] if not report.failing else []
    lines += ["", "## Not exercised", ""]
    by_reason: dict[str, list[str]] = collections.defaultdict(list)
    for op, reason in report.not_exercised.items():
        by_reason[reason.split(" (`")[0] if "eager reached" not in reason else reason].append(op)
    for reason, ops in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"- {reason}: " + ", ".join(f"`{o}`" for o in sorted(ops)))
    return "\n".join(lines) + "\n"


def main() -> None:
    report = sweep(all_calls(), log=True)
    (HERE / "overloads.md").write_text(markdown(report))
    counts = report.counts
    print(", ".join(f"{s}: {counts[s]}" for s in STATUSES), f"({report.seconds:.0f} s)")
    for op, spellings in sorted(report.fallbacks.items()):
        print(f"fallback {op}: {spellings[0]}")


if __name__ == "__main__":
    sys.exit(main())
