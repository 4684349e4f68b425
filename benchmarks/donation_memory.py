"""Peak memory of an SGD step on a >= 100 MB model, with and without buffer donation.

Each setting runs in a fresh process (``LAZY_DONATE=1`` / ``0``). On an accelerator the figure is
the device allocator's peak; on the XLA CPU platform, where device memory is host memory, it is the
peak resident set during the steady-state steps (the high-water mark is reset after the compiling
warm-up steps) minus the resident set before the model was built.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys

MB = 1 << 20


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give back what compilation freed
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


def _child(width: int, layers: int, steps: int) -> None:
    import jax
    import torch
    from torch import nn

    import lazy_torch
    import runtime

    base_rss = _rss("VmRSS")
    device = lazy_torch.device()
    torch.manual_seed(0)
    # Built on the device (random init is a lazy op): no host copy of the parameters.
    model = nn.Sequential(*[nn.Linear(width, width, device=device) for _ in range(layers)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, width, device=device)
    lazy_torch.mark_step(wait=True)
    for step in range(steps + 2):
        if step == 2:  # the first two steps compile
            lazy_torch.wait_device_ops()
            _reset_peak_rss()
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()
        lazy_torch.mark_step()
    lazy_torch.wait_device_ops()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    step = max(runtime.executable_memory(), key=lambda m: m["arguments"])  # the training step
    stats = jax.devices(os.environ.get("LAZY_PLATFORM") or None)[0].memory_stats()
    if stats and "peak_bytes_in_use" in stats:
        peak, kind = stats["peak_bytes_in_use"], "device allocator peak"
    else:
        peak = _rss("VmHWM") - base_rss
        kind = "peak RSS over the pre-model baseline"
    counters = lazy_torch.metrics.counters()
    print(
        json.dumps(
            {
                "params": params,
                "peak": peak,
                "kind": kind,
                "step": step,
                "donated": counters.get("donated_buffers", 0),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)  # 6 x 2048^2 fp32 = 100.7 MB
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.width, args.layers, args.steps)
        return
    results = {}
    for donate in ("1", "0"):
        env = dict(os.environ, LAZY_DONATE=donate)
        cmd = [
            sys.executable,
            __file__,
            "--child",
            f"--width={args.width}",
            f"--layers={args.layers}",
            f"--steps={args.steps}",
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        results[donate] = json.loads(out.strip().splitlines()[-1])
    on, off = results["1"], results["0"]
    p = on["params"]
    print(f"XLA's accounting of the SGD step executable (fp32 parameters {p / MB:.1f} MB):")
    for name, r in (("with donation", on), ("without donation", off)):
        s = r["step"]
        print(
            f"  {name:17s} peak {s['peak'] / MB:7.1f} MB = {s['peak'] / p:.2f} x params "
            f"(arguments {s['arguments'] / MB:.1f}, outputs {s['outputs'] / MB:.1f}, "
            f"aliased {s['aliased'] / MB:.1f}, temporaries {s['temporaries'] / MB:.1f} MB)"
        )
    print(f"parameters {p / MB:.1f} MB (gradients the same), measuring {on['kind']}")
    print(
        f"  with donation:    peak {on['peak'] / MB:8.1f} MB = {on['peak'] / p:.2f} x params "
        f"({on['donated']} buffers donated)"
    )
    print(f"  without donation: peak {off['peak'] / MB:8.1f} MB = {off['peak'] / p:.2f} x params")
    print(
        f"  saved by donation: {(off['peak'] - on['peak']) / MB:.1f} MB "
        f"= {(off['peak'] - on['peak']) / p:.2f} x params"
    )


if __name__ == "__main__":
    main()
