"""Run the OpInfo harness over op_db (or some ops) in parallel; print and save the outcomes.

python -m tests.ops.sweep                    # everything; results saved to /tmp/opinfo_sweep.json
python -m tests.ops.sweep sort argsort       # just these op_db entries, with details
"""

from __future__ import annotations

import json
import multiprocessing as mp
import sys


def _work(names: list[str]) -> dict[str, list]:
    import torch

    from tests.ops.harness import OPS, dtypes_of, run_op

    out = {}
    for name in names:
        op = OPS[name]
        for dtype in dtypes_of(name):
            grads = dtype == torch.float32 and op.supports_autograd
            try:
                o = run_op(op, dtype, grads=grads)
                out[f"{name}|{dtype}"] = [o.status, o.detail, list(o.fallbacks)]
            except BaseException as e:  # a crash is a failing outcome, not a stop
                out[f"{name}|{dtype}"] = ["failing", f"crash {type(e).__name__}: {e}"[:300], []]
    return out


def main() -> None:
    from tests.ops.harness import OPS

    names = sys.argv[1:] or sorted(OPS)
    workers = 2 if len(names) > 1 else 1
    with mp.get_context("spawn").Pool(workers) as pool:
        parts = pool.map(_work, [names[i::workers] for i in range(workers)])
    results = {k: v for part in parts for k, v in part.items()}
    for key, (status, detail, fallbacks) in sorted(results.items()):
        if len(names) <= 40 or status == "failing":
            print(f"{status:9s} {key} {detail[:200]} {' '.join(fallbacks)}")
    if not sys.argv[1:]:
        with open("/tmp/opinfo_sweep.json", "w") as f:
            json.dump(results, f, indent=0)


if __name__ == "__main__":
    main()
