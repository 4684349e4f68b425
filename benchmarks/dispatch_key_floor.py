"""Host cost per op of a C++ backend on a dispatch key of its own, against eager, the Python
tensor-subclass floor and lazy.

PYTHONPATH=. python benchmarks/dispatch_key_floor.py [--repeats 9] [--length 2000]

Lazy tensors are a Python subclass: every op goes through PyTorch's Python key and returns a new
wrapper tensor, views included. PyTorch/XLA instead registers C++ kernels on a dispatch key of
its own, and its tensors are C++ TensorImpls. To measure what that design would cost, this script
builds a small C++ extension (``torch.utils.cpp_extension.load_inline``: a C++ compiler and
ninja, about a minute the first time) that registers one boxed kernel on ``PrivateUse1`` for a
few elementwise and view ops. The kernel records nothing: it only pops the arguments and pushes a
storage-less output tensor of the first argument's shape, so its figure is a floor for such a
backend, as the subclass's figure is for ours. Each is timed on a chain of elementwise ops (``x * 1.001 + x``, ``relu``, ``- 0.5``) and
on a chain of views (``view``, ``t``, ``transpose``, ``unsqueeze``), all on 4x4 tensors (eager's
compute is next to nothing) under ``torch.no_grad()``; medians of ``--repeats`` runs, µs per op.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.cpp_extension import load_inline

import lazy_torch
from benchmarks.trace_overhead import SubclassFloor, op_chain

_SOURCE = r"""
#include <torch/extension.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace {

// PrivateUse1 needs a device guard to dispatch at all; one device, one default stream.
struct Guard final : public c10::impl::DeviceGuardImplInterface {
  c10::Device device() const { return c10::Device(c10::DeviceType::PrivateUse1, 0); }
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return device(); }
  c10::Device getDevice() const override { return device(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

at::Tensor opaque(c10::IntArrayRef sizes, caffe2::TypeMeta dtype) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype,
      c10::Device(c10::DeviceType::PrivateUse1, 0));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return t;
}

// Pops the arguments; pushes one output per return, shaped like the first PrivateUse1 tensor.
void kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  at::Tensor first;
  for (size_t i = stack->size() - n; i < stack->size() && !first.defined(); i++) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().device().type() == c10::DeviceType::PrivateUse1)
      first = v.toTensor();
  }
  torch::jit::drop(*stack, n);
  for (size_t r = 0; r < op.schema().returns().size(); r++)
    torch::jit::push(*stack, opaque(first.sizes(), first.dtype()));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"mul.Tensor", "add.Tensor", "sub.Tensor", "relu", "view", "t",
                           "transpose.int", "unsqueeze"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&kernel>());
}

at::Tensor make(std::vector<int64_t> sizes) {
  return opaque(sizes, caffe2::TypeMeta::Make<float>());
}
"""


def _elementwise(x: torch.Tensor, length: int) -> float:
    return op_chain(x, length)[0]


def _views(x: torch.Tensor, length: int) -> float:
    start = time.perf_counter()
    for _ in range(length // 4):
        x.view(-1)
        x.t()
        x.transpose(0, 1)
        x.unsqueeze(0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--length", type=int, default=2000)
    args = parser.parse_args()
    ext = load_inline("lazy_dispatch_key_floor", cpp_sources=_SOURCE, functions=["make"])
    tensors: dict[str, Callable[[], torch.Tensor]] = {
        "eager CPU": lambda: torch.randn(4, 4),
        "C++ kernel on PrivateUse1": lambda: ext.make([4, 4]),
        "Python subclass floor": lambda: torch.Tensor._make_wrapper_subclass(
            SubclassFloor, (4, 4), dtype=torch.float32
        ),
        "lazy": lambda: torch.randn(4, 4, device="lazy"),
    }
    print(f"us per op, medians of {args.repeats} chains of {args.length} ops")
    print(f"{'':28s}{'elementwise':>12s}{'views':>8s}")
    with torch.no_grad():
        for name, make in tensors.items():
            x = make()
            lazy_torch.mark_step(wait=True)
            row = []
            for chain in (_elementwise, _views):
                chain(x, args.length)  # warm memos and caches
                times = []
                for _ in range(args.repeats):
                    times.append(chain(x, args.length))
                    lazy_torch.mark_step(wait=True)  # lazy's pending chain, outside the timing
                row.append(statistics.median(times) / args.length * 1e6)
            print(f"{name:28s}{row[0]:12.2f}{row[1]:8.2f}")


if __name__ == "__main__":
    main()
