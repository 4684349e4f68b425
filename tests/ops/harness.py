"""Run PyTorch OpInfo samples on device='lazy' and on eager CPU and classify each op.

An op is "lowered" when every sample matches eager without touching the CPU fallback, "fallback"
when every sample matches but some sample ran an op on the fallback, and "failing" otherwise.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import lazy_torch

# OpInfo's wrapper_set_seed calls torch._lazy.mark_step() for tensors of device type 'lazy'
# (PyTorch's legacy lazy-tensor core, which this backend never initializes): point it at ours.
torch._lazy = types.SimpleNamespace(mark_step=lambda *a, **k: lazy_torch.mark_step())

MAX_SAMPLES = 6
DTYPES = (torch.float32, torch.int64, torch.bool)
# A representative subset also runs in bfloat16.
BF16_OPS = {
    "add",
    "mul",
    "sub",
    "div.no_rounding_mode",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "softmax",
    "log_softmax",
    "nn.functional.linear",
    "nn.functional.conv2d",
    "nn.functional.layer_norm",
    "nn.functional.gelu",
    "nn.functional.relu",
    "nn.functional.silu",
    "sum",
    "mean",
    "exp",
    "tanh",
    "sigmoid",
    "cat",
    "where",
    "nn.functional.embedding",
    "nn.functional.cross_entropy",
    "rsqrt",
    "pow",
    "amax",
    "nn.functional.scaled_dot_product_attention",
}
# Values of random ops are not comparable with eager's; their shapes and dtypes are.
RANDOM_OPS = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "normal.in_place",
    "normal.number_mean",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "uniform",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train",
    "nn.functional.rrelu",
    "randperm",
    "empty",
    "empty_like",
    "new_empty",
    "new_empty_strided",
    "empty_strided",
    "empty_permuted",
    "torch.empty",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
}


def op_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


OPS = {op_name(op): op for op in op_db}


def dtypes_of(name: str) -> tuple[torch.dtype, ...]:
    """The dtypes an entry runs in: DTYPES, bfloat16 for BF16_OPS, and complex64 for complex-only
    entries (imag, view_as_real, istft, ...), which support none of DTYPES."""
    supported = OPS[name].supported_dtypes("cpu")
    dtypes = DTYPES + ((torch.bfloat16,) if name in BF16_OPS else ())
    if not supported & set(DTYPES) and torch.complex64 in supported:
        dtypes += (torch.complex64,)
    return dtypes


@dataclasses.dataclass
class Outcome:
    status: str  # "lowered", "fallback", "failing", "skipped"
    detail: str = ""
    fallbacks: tuple[str, ...] = ()


# Entries that cannot run on this device at all, with the reason.
SKIP = {
    "to_sparse": "sparse layouts: not supported by XLA",
    "sparse.mm.reduce": "sparse layouts: not supported by XLA",
    "sparse.sampled_addmm": "sparse layouts: not supported by XLA",
    "chalf": "complex32 has no XLA element type",
    "torch._scaled_mm": "float8-only entry: float8 tensors cannot be transferred yet",
    "torch._scaled_mm_v2": "float8-only entry: float8 tensors cannot be transferred yet",
    "as_strided.partial_views": "reads the sample's base storage beyond the view, which "
    ".to('lazy') does not copy (as for any device)",
}

SKIP.update(
    {name: "jiterator: CUDA-only JIT kernels" for name in OPS if name.startswith("jiterator_")}
)

# Positional arguments that eager requires on the CPU for any device (as for CUDA tensors).
CPU_ARGS = {"tensor_split": {1}}
# Ops whose indices may name any of equal elements (PyTorch leaves the choice open: unstable sort,
# topk, kthvalue, median, mode): their indices are compared through the input's values at them.
# Each maps to the position of ``dim`` among the positional arguments after the input.
TIED_INDICES = {
    "sort": 0, "argsort": 0, "topk": 1, "kthvalue": 1, "median": 0, "nanmedian": 0, "mode": 0,
}  # fmt: skip


def _lazy_args(name: str, args: tuple) -> tuple:
    keep = CPU_ARGS.get(name, ())
    return tuple(a if i in keep else to_lazy(a) for i, a in enumerate(args))


def to_lazy(x: Any) -> Any:
    """Tensors (and CPU devices) in ``x`` moved to the lazy device, keeping requires_grad."""

    def move(v):
        if isinstance(v, torch.Tensor):
            t = v.detach().to("lazy")
            return t.requires_grad_(v.requires_grad) if v.is_floating_point() else t
        if (isinstance(v, torch.device) and v.type == "cpu") or v == "cpu":
            return torch.device("lazy")
        return v

    return tree_map(move, x)


def _tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.bfloat16, torch.float16):
        return {"atol": 2e-2, "rtol": 2e-2}
    return {"atol": 1e-4, "rtol": 1.3e-5 * 10}


def _compare(got: Any, expected: Any, random: bool) -> None:
    g_leaves, g_spec = tree_flatten(got)
    e_leaves, e_spec = tree_flatten(expected)
    assert len(g_leaves) == len(e_leaves), (len(g_leaves), len(e_leaves))
    for g, e in zip(g_leaves, e_leaves):
        if isinstance(e, torch.Tensor):
            assert isinstance(g, torch.Tensor), type(g)
            assert g.shape == e.shape, (g.shape, e.shape)
            assert g.dtype == e.dtype, (g.dtype, e.dtype)
            if not random:
                g_cpu = g.detach().cpu() if g.device.type == "lazy" else g.detach()
                torch.testing.assert_close(g_cpu, e.detach(), equal_nan=True, **_tolerance(e.dtype))
        elif isinstance(e, (int, float, bool)) and not random:
            assert g == e or (g != g and e != e), (g, e)


def _picked(name: str, sample, out: Any) -> Any:
    """``out`` with the indices of an op in TIED_INDICES replaced by the input's values at them
    (``out`` on the CPU)."""
    if name not in TIED_INDICES or sample.kwargs.get("stable"):
        return out
    x, args = sample.input.detach(), sample.args
    at = TIED_INDICES[name]
    dim = sample.kwargs.get("dim", args[at] if len(args) > at else -1)

    def values_at(idx: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0:
            return x.expand(idx.shape)
        kept = idx if idx.dim() == x.dim() else idx.unsqueeze(dim)
        return x.gather(dim, kept).reshape(idx.shape)

    if isinstance(out, torch.Tensor):  # argsort, or median/nanmedian of all elements
        return values_at(out) if name == "argsort" else out
    return (out[0], values_at(out[1]), *out[2:])


def _fallbacks(before: dict) -> tuple[str, ...]:
    after = lazy_torch.metrics.counters()
    return tuple(
        sorted(k for k, v in after.items() if k.startswith("fallback::") and v > before.get(k, 0))
    )


def run_op(op, dtype: torch.dtype, grads: bool = False) -> Outcome:
    """Run up to MAX_SAMPLES samples of ``op`` in ``dtype``, eagerly and lazily, and compare."""
    if op_name(op) in SKIP:
        return Outcome("skipped", SKIP[op_name(op)])
    if not op.supported_dtypes("cpu"):
        return Outcome("skipped", "no eager CPU kernel (a CUDA-only entry)")
    if dtype not in op.supported_dtypes("cpu"):
        return Outcome("skipped", f"{dtype} unsupported in eager")
    random = op_name(op) in RANDOM_OPS
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=grads))[:MAX_SAMPLES]
    except Exception as e:
        return Outcome("skipped", f"no samples: {type(e).__name__}")
    before = lazy_torch.metrics.counters()
    traced = []  # (sample, got, expected, gradient pairs, random) per sample, computed by one graph
    for sample in samples:
        args = (sample.input, *sample.args)
        # Dropout inside a sample draws from the device RNG: compare shapes and dtypes only.
        random_sample = (
            random
            or sample.kwargs.get("dropout_p", 0) > 0
            or (sample.kwargs.get("training") is True and "attention" in op_name(op))
        )
        try:
            expected = op(*args, **sample.kwargs)
        except Exception as eager_error:
            failure = _expect_error(op, args, sample.kwargs, eager_error)
            if failure is not None:
                return failure
            continue
        try:
            lazy_args, lazy_kwargs = _lazy_args(op_name(op), args), to_lazy(sample.kwargs)
            got = op(*lazy_args, **lazy_kwargs)
            # OpInfo's own view for comparison, e.g. sign-independent |U|, |V| for decompositions.
            process = sample.output_process_fn_grad
            got, expected = process(got), process(expected)
            pairs = (
                _gradients(args, expected, lazy_args, got) if grads and not random_sample else []
            )
        except Exception as e:
            lazy_torch.mark_step(wait=True)
            return Outcome("failing", f"{type(e).__name__}: {str(e)[:300]}")
        traced.append((sample, got, expected, pairs, random_sample))
    try:
        lazy_torch.mark_step()  # every sample's outputs and gradients: one graph, one compile
        for sample, got, expected, pairs, random_sample in traced:
            got = tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got)
            got, expected = (_picked(op_name(op), sample, o) for o in (got, expected))
            _compare(got, expected, random_sample)
            for e, g in pairs:
                assert g is not None, "missing gradient"
                torch.testing.assert_close(g.cpu(), e, equal_nan=True, atol=1e-3, rtol=1e-3)
    except Exception as e:
        return Outcome("failing", f"{type(e).__name__}: {str(e)[:300]}")
    finally:
        lazy_torch.mark_step(wait=True)
    if not traced:
        return Outcome("skipped", "eager CPU rejects every sample")
    fallbacks = _fallbacks(before)
    return Outcome("fallback" if fallbacks else "lowered", "", fallbacks)


def _expect_error(op, args: tuple, kwargs: dict, eager_error: Exception) -> Outcome | None:
    """Eager rejected a sample: lazy must raise the same type (None), else a failing outcome."""
    try:
        op(*_lazy_args(op_name(op), args), **to_lazy(kwargs))
        lazy_torch.mark_step(wait=True)
    except type(eager_error):
        return None
    except Exception as e:
        return Outcome(
            "failing",
            f"eager raised {type(eager_error).__name__}, lazy {type(e).__name__}: {str(e)[:200]}",
        )
    return Outcome("failing", f"eager raised {type(eager_error).__name__}, lazy did not")


def _float_leaves(x: Any) -> list[torch.Tensor]:
    return [
        t
        for t in tree_flatten(x)[0]
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.requires_grad
    ]


def _gradients(args, expected, lazy_args, got) -> list[tuple[torch.Tensor, Any]]:
    """(eager, lazy) gradients of the float outputs for one random cotangent, the lazy ones
    still pending."""
    inputs, lazy_inputs = _float_leaves(args), _float_leaves(lazy_args)
    outs, lazy_outs = _float_leaves(expected), _float_leaves(got)
    if not inputs or not outs:
        return []
    torch.manual_seed(0)
    cotangents = [torch.randn_like(o) for o in outs]
    eager_grads = torch.autograd.grad(outs, inputs, cotangents, allow_unused=True)
    lazy_grads = torch.autograd.grad(
        lazy_outs, lazy_inputs, [c.to("lazy") for c in cotangents], allow_unused=True
    )
    return [(e, g) for e, g in zip(eager_grads, lazy_grads) if e is not None]
