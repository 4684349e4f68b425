"""Hand-written handlers: factories, aliases, copies and transfers, sync points, random ops."""

from __future__ import annotations

from typing import Any

import torch

import runtime
from lazy_torch import eager_checks, indexing, rng, sites  # noqa: F401 (indexing registers its handlers)
from lazy_torch.dispatch import dispatch, recorded, special
from lazy_torch.recording import RECORD, SHARE, record
from lazy_torch.resize import fill_outs, resize, resized_as_meta, resized_meta, window
from lazy_torch.tensor import LazyTensor, from_cpu, meta_of, to_cpu, upload, wrap
from lazy_torch.variants import assign, assign_node

aten = torch.ops.aten

# Factories reach the backend through these two kernels of the Lazy dispatch key; everything
# after them (fill_, normal_, copy_, ...) arrives at LazyTensor.__torch_dispatch__.
_lib = torch.library.Library("aten", "IMPL")


def _device_exists(device: Any) -> None:
    """A factory's device must exist: the error for ``lazy:N`` past the last device comes at the
    call, not at the barrier that would compute it."""
    runtime.device(_lazy_index(device) or 0)


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _device_exists(device)
    kwargs = {"dtype": dtype or torch.get_default_dtype(), "device": device}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    return record(aten.empty.memory_format, (tuple(size),), kwargs)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _device_exists(device)
    kwargs = {"dtype": dtype or torch.get_default_dtype(), "device": device}
    return record(aten.empty_strided.default, (tuple(size), tuple(stride)), kwargs)


def _copy_from(src, dst, non_blocking=False):
    # Reached by copies that skip Python dispatch (tensor construction from data).
    if isinstance(dst, LazyTensor):
        return _copy_into(dst, src)
    return dst.copy_(to_cpu(src))


_lib.impl("_copy_from", _copy_from, "Lazy")
_lib.impl("empty.memory_format", _empty, "Lazy")
_lib.impl("empty_strided", _empty_strided, "Lazy")


def _factory(func):
    def kernel(*args, **kwargs):
        _device_exists(kwargs.get("device"))
        if sites.recording:
            return sites.call_attributed(record, func, args, kwargs)
        return record(func, args, kwargs)

    return kernel


# Factories whose eager implementation resizes an out= tensor are recorded directly instead.
_FACTORIES = ("arange", "arange.start", "arange.start_step", "linspace", "eye", "eye.m")
# ... and factories without a CompositeExplicit kernel that would reach __torch_dispatch__.
_FACTORIES += ("tril_indices", "triu_indices", "_efficientzerotensor")
for _name in _FACTORIES:
    _packet, _, _overload = _name.partition(".")
    _lib.impl(_name, _factory(getattr(getattr(aten, _packet), _overload or "default")), "Lazy")


@special(aten.detach.default, aten.alias.default, aten.lift_fresh.default, plan=SHARE)
def _share(func, args, kwargs):  # C does the same
    # Identity views share the storage: a write through either is seen by both. lift_fresh
    # (torch.tensor's data, made for it) too: its value stays the transferred data, not an op.
    t = args[0]
    return wrap(t._lazy, t._meta)


def _lazy_index(device: Any) -> int | None:
    if device is None:
        return None
    device = torch.device(device)
    return (device.index or 0) if device.type == "lazy" else None


@special(aten._to_copy.default, plan=RECORD)
def _to_copy(func, args, kwargs):
    x = args[0]
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "lazy":
        cpu_kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        return aten._to_copy.default(to_cpu(x), **cpu_kwargs).to(device)
    target = _lazy_index(device)
    if target is not None and target != x._lazy.device:
        return _to_copy(func, (upload(to_cpu(x), target, x._meta),), kwargs)
    return record(func, args, kwargs)


def _copy_into(self: LazyTensor, src: torch.Tensor) -> LazyTensor:
    """``self.copy_(src)``: broadcast, cast, and transfer when ``src`` lives elsewhere."""
    same_shape = src.shape == self.shape
    if not same_shape:
        with torch._C._DisableTorchDispatch():  # PyTorch's own broadcast error
            torch.empty(self.shape, dtype=self.dtype, device="meta").copy_(
                torch.empty(src.shape, dtype=src.dtype, device="meta")
            )
    if not isinstance(src, LazyTensor):
        if src.numel() == 0:  # nothing to transfer (a cache's torch.tensor([]) each step)
            assign(self, torch.empty(self.shape, dtype=self.dtype, device=self.device))
            return self
        value = src.detach()
        if value.dtype != self.dtype:
            value = value.to(self.dtype)
        # A whole storage laid out on a mesh (load_state_dict into a sharded model) gets its new
        # value in the same layout, straight from the host.
        placement = None if self._lazy.steps else self._lazy.storage.placement
        value = value if same_shape else value.expand(self.shape)
        if placement is not None and self._meta != meta_of(value.contiguous()):
            placement = None  # a strided view of the whole storage: laid out at the barrier
        storage = from_cpu(value, self._lazy.device, placement)
        assign_node(self, storage.node)
        return self
    if src._lazy.device != self._lazy.device:
        src = upload(to_cpu(src), self._lazy.device, src._meta)
    if not same_shape:
        src = record(aten.expand.default, (src, tuple(self.shape)), {})
    assign(self, src)
    return self


@special(aten.copy_.default)
def _copy_(func, args, kwargs):
    self, src = args[0], args[1]
    if not isinstance(src, torch.Tensor):  # x.copy_(1): a number, as eager wraps it
        src = torch.tensor(src)
    if isinstance(self, LazyTensor):
        eager_checks.check_inplace_overlap(func, args, kwargs)  # x[1:].copy_(x[:-1]) raises
        return _copy_into(self, src)
    return self.copy_(to_cpu(src), *args[2:], **kwargs)


_SHIFTS = [
    getattr(getattr(aten, name), overload)
    for name in ("bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__")
    for overload in getattr(aten, name).overloads()
    if "out" not in overload
]


@special(*_SHIFTS, plan=RECORD)
def _shift(func, args, kwargs):
    """Shifts: eager promotes a bool tensor to the result's integer dtype (``mask >> 1`` is
    int64), where the meta kernels refuse a bool input; bool with bool stays eager's error."""
    dtype = torch.result_type(args[0], args[1])
    if dtype != torch.bool:
        operands = [
            v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == torch.bool else v
            for v in args[:2]
        ]
        args = (*operands, *args[2:])
    return recorded(func, args, kwargs)


@special(aten._local_scalar_dense.default, aten.item.default)
def _item(func, args, kwargs):
    return to_cpu(args[0], cause="item").item()


def _rng_operands(device: int) -> tuple:
    """The runtime keywords of a random op on ``device``: its RNG state (an operand) and draw."""
    state, index = rng.draw(device)
    return (("_rng", state), ("_rng_index", index))


@special(
    aten.normal_.default,
    aten.uniform_.default,
    aten.bernoulli_.float,
    aten.bernoulli_.Tensor,
    aten.random_.default,
    aten.random_.to,
    getattr(aten.random_, "from"),
    aten.exponential_.default,
    aten.geometric_.default,
)
def _random_inplace(func, args, kwargs):
    self = args[0]
    assign(self, record(func, args, kwargs, extra=_rng_operands))
    return self


@special(
    aten.bernoulli.default,
    aten.bernoulli.p,
    aten.bernoulli.Tensor,
    aten.native_dropout.default,
    aten.uniform.default,
    aten.normal.Tensor_float,
    aten.normal.float_Tensor,
    aten.normal.Tensor_Tensor,
    aten.rand_like.default,
    aten.rand_like.generator,
    aten.randn_like.default,
    aten.randn_like.generator,
    aten.randint_like.default,
    aten.randint_like.generator,
    aten.randint_like.Tensor,
    aten.randint_like.Tensor_generator,
    aten.randint_like.low_dtype,
    aten.randint_like.low_generator_dtype,
)
def _random(func, args, kwargs):
    return record(func, args, kwargs, extra=_rng_operands)


@special(aten.multinomial.default)
def _multinomial(func, args, kwargs):
    # Eager's argument checks; the meta kernel makes none of them. Checks of the values
    # (negative, non-finite or all-zero weights) would need a sync and are not made.
    self, num_samples = args[0], args[1]
    replacement = args[2] if len(args) > 2 else kwargs.get("replacement", False)
    if self.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not self.is_floating_point():
        raise RuntimeError(
            f"multinomial only supports floating-point dtypes for input, got: {self.dtype}"
        )
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    if not replacement and num_samples > self.shape[-1]:
        raise RuntimeError(
            "cannot sample n_sample > prob_dist.size(-1) samples without replacement"
        )
    if self.shape[-1] > 2**24:
        raise RuntimeError("number of categories cannot exceed 2^24")
    return record(func, args, kwargs, extra=_rng_operands)


@special(aten.randperm.default, aten.randperm.generator, aten.normal.float_float)
def _random_factory(func, args, kwargs):
    # A factory: the RNG state is that of the device it creates on (record's device).
    return record(func, args, kwargs, extra=_rng_operands)


_RRELU_ARGS = ("self", "noise", "lower", "upper", "training", "generator")


@special(
    aten.rrelu_with_noise.default,
    aten.rrelu_with_noise_.default,
    aten.rrelu_with_noise_functional.default,
)
def _rrelu_with_noise(func, args, kwargs):
    # The mutating forms write the noise tensor: record the functional op and substitute its
    # outputs.
    bound = {"lower": 0.125, "upper": 1.0 / 3.0, "training": False}
    bound.update(zip(_RRELU_ARGS, args), **kwargs)
    self, noise, lower, upper = (bound[k] for k in _RRELU_ARGS[:4])
    if bound["training"]:
        out, noise_out = record(
            aten.rrelu_with_noise_functional.default,
            (self, noise, lower, upper, True),
            {},
            extra=_rng_operands,
        )
    else:
        out = dispatch(aten.leaky_relu.default, (self, (lower + upper) / 2), {})
        noise_out = dispatch(aten.clone.default, (noise,), {})
    if func is aten.rrelu_with_noise_functional.default:
        return out, noise_out
    if bound["training"]:
        assign(noise, noise_out)
    if func is aten.rrelu_with_noise_.default:
        assign(self, out)
        return self
    return out


@special(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(func, args, kwargs):
    # Eager returns empty saved statistics in evaluation; the meta kernels give (C,).
    out = record(aten._native_batch_norm_legit_no_training.default, args, kwargs)[0]
    stats_dtype = torch.float32 if out.dtype in (torch.float16, torch.bfloat16) else out.dtype
    empty = {"dtype": stats_dtype, "device": out.device}
    return out, _empty((0,), **empty), _empty((0,), **empty)


@special(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def _native_batch_norm(func, args, kwargs):
    # Training updates running stats in place: record the functional form, then substitute.
    input, weight, bias, running_mean, running_var, training, momentum, eps = args  # no defaults
    if not training and running_mean is not None:
        return _batch_norm_eval(
            None, (input, weight, bias, running_mean, running_var, momentum, eps), {}
        )
    if running_mean is None:
        return record(func, args, kwargs)
    out, mean, invstd, new_mean, new_var = dispatch(
        aten._native_batch_norm_legit_functional.default,
        (input, weight, bias, running_mean, running_var, training, momentum, eps),
        {},
    )
    assign(running_mean, new_mean)
    assign(running_var, new_var)
    return out, mean, invstd


@special(aten.resize_.default, aten.resize.default)
def _resize(func, args, kwargs):
    # ``resize`` is the functional form PyTorch's decompositions call.
    self = args[0]
    meta = resized_meta(self, args[1], kwargs.get("memory_format"))
    return _resized(self, meta, in_place=func is aten.resize_.default)


@special(aten.resize_as_.default, aten.resize_as.default)
def _resize_as(func, args, kwargs):
    # Only the template's sizes and strides count: eager takes a template on any device.
    self, template = args[0], args[1]
    meta = resized_as_meta(self, template, kwargs.get("memory_format"))
    return _resized(self, meta, in_place=func is aten.resize_as_.default)


def _resized(self: LazyTensor, meta: tuple, in_place: bool) -> LazyTensor:
    if in_place:
        return resize(self, meta)
    return dispatch(aten.clone.default, (window(self, meta) if meta != self._meta else self,), {})


# Composite out= kernels that run above the Lazy key and, for tensor subclasses, compute their
# result without writing it into ``out`` (linalg_matrix_rank: eager CPU tensors under a
# TorchDispatchMode are left unwritten too), which left ``out`` silently unchanged. At
# AutogradLazy, where the composite would run, they are the functional op and then ``out`` filled
# as every out= op's is.
def _composite_out(func, functional):
    out_names = [a.name for a in func._schema.arguments if a.is_out]

    def kernel(*args, **kwargs):
        inputs = {k: v for k, v in kwargs.items() if k not in out_names}
        fill_outs(func, args, kwargs, out_names, functional(*args, **inputs))
        return kwargs[out_names[0]]

    return kernel


for _out_name, _functional_name in (
    ("out", "default"),
    ("out_tol_tensor", "tol_tensor"),
    ("atol_rtol_tensor_out", "atol_rtol_tensor"),
    ("atol_rtol_float_out", "atol_rtol_float"),
):
    _lib.impl(
        f"linalg_matrix_rank.{_out_name}",
        _composite_out(
            getattr(aten.linalg_matrix_rank, _out_name),
            getattr(aten.linalg_matrix_rank, _functional_name),
        ),
        "AutogradLazy",
    )
