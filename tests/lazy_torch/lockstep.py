"""The checker of the differential test: a program (differential.py) runs on eager CPU and on the
lazy device in lockstep, statement by statement, and every live value, layout, identity and error
is compared."""

from __future__ import annotations

import math
import re
from collections import Counter

import torch

from lazy_torch.tensor import materialize
from tests.lazy_torch.differential import (
    HELPERS,
    SYNC_KINDS,
    Known,
    Program,
    _shares_memory,
    generate,
    namespace,
    run_statement,
)


class Mismatch(AssertionError):
    pass


def _tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.float16,):
        return {"rtol": 5e-3, "atol": 5e-3}
    if dtype == torch.bfloat16:
        return {"rtol": 3e-2, "atol": 3e-2}
    if dtype == torch.float32:
        return {"rtol": 2e-5, "atol": 2e-5}
    if dtype == torch.float64:
        return {"rtol": 1e-9, "atol": 1e-9}
    return {"rtol": 0, "atol": 0}


def _same_python(e, z, tol: dict) -> bool:
    if type(e) is not type(z):
        return False
    if isinstance(e, list):
        return len(e) == len(z) and all(_same_python(a, b, tol) for a, b in zip(e, z))
    if isinstance(e, float):
        close = math.isclose(e, z, rel_tol=tol["rtol"], abs_tol=tol["atol"])
        return (math.isnan(e) and math.isnan(z)) or close
    return e == z


def _layout(t: torch.Tensor) -> tuple:
    """What the user sees of a tensor's layout: shape, dtype, strides, offset, contiguity."""
    return (tuple(t.shape), t.dtype, t.stride(), t.storage_offset(), t.is_contiguous())


def compare(eager: dict, lazy: dict, tols: dict | None = None) -> list[str]:
    """Differences between the two namespaces' variables (values, metadata, identities);
    ``tols``: Python numbers' tolerances."""
    problems, tols = [], tols or {}
    names = [k for k in eager if k not in HELPERS and not k.startswith("__")]
    if sorted(names) != sorted(k for k in lazy if k not in HELPERS and not k.startswith("__")):
        problems.append(
            f"variables differ: {sorted(names)} vs {sorted(k for k in lazy if k not in HELPERS)}"
        )
        names = [k for k in names if k in lazy]
    tensors = [k for k in names if isinstance(eager[k], torch.Tensor)]
    for k in names:
        if k not in tensors and not _same_python(eager[k], lazy[k], tols.get(k, _tolerance(0))):
            problems.append(f"{k}: eager {eager[k]!r}, lazy {lazy[k]!r}")
    for k in tensors:
        e, z = eager[k], lazy[k]
        if not isinstance(z, torch.Tensor):
            problems.append(f"{k}: lazy gave {type(z).__name__}")
            continue
        meta_e, meta_z = _layout(e), _layout(z)
        if meta_e != meta_z:
            problems.append(
                f"{k}: (shape, dtype, stride, offset, contiguous) eager {meta_e}, lazy {meta_z}"
            )
    for i, a in enumerate(tensors):  # out= and in-place results are their input, as in eager
        for b in tensors[i + 1 :]:
            if (eager[a] is eager[b]) != (lazy[a] is lazy[b]):
                problems.append(
                    f"{a} is {b}: eager {eager[a] is eager[b]}, lazy {lazy[a] is lazy[b]}"
                )
    good = [
        k for k in tensors if isinstance(lazy[k], torch.Tensor) and lazy[k].shape == eager[k].shape
    ]
    try:
        copies = [lazy[k].clone() for k in good]  # one graph computes every value
        materialize(copies, "differential")
        values = [c.cpu() for c in copies]
    except Exception as err:  # noqa: BLE001
        return problems + [f"computing the lazy values raised {type(err).__name__}: {err}"]
    for k, z in zip(good, values):
        e = eager[k]
        if z.dtype != e.dtype:
            continue
        try:
            tol = tols.get(k, _tolerance(e.dtype)) if e.is_floating_point() else _tolerance(e.dtype)
            torch.testing.assert_close(z, e.detach(), equal_nan=True, **tol)
        except AssertionError as err:
            problems.append(
                f"{k}: values differ\n" + "\n".join("      " + s for s in str(err).splitlines())
            )
    return problems


def check(program: Program) -> dict[str, int]:
    """Run ``program`` on eager CPU and on the lazy device; raise Mismatch on any difference.

    Returns per-kind counts of the statements run (``raised`` counts those eager rejects)."""
    eager, lazy = namespace("cpu"), namespace("lazy")
    counts: Counter = Counter()
    try:
        _lockstep(program, eager, lazy, counts)
    finally:  # a failure's traceback must not keep a pending tensor alive for the next barrier
        eager.clear()
        lazy.clear()
    return counts


def _fail(program: Program, i: int, what: str) -> None:
    raise Mismatch(
        f"{what}\n\n{program.source(mark=i)}\n\n"
        f"reproduce: python -m tests.lazy_torch.differential {program.seed}"
        + (" --twin" if program.twin else "")
    )


def _track_precision(eager: dict, line: str, before: set, tols: dict) -> None:
    """Give what ``line`` made or wrote the tolerance of the least precise floating-point value it
    read (a float64 result of float32 math carries float32's rounding): new variables, out=
    tensors and the tensors an in-place call or an item assignment writes, with every variable
    sharing memory with them."""
    used = [n for n in re.findall(r"\b[tsl]\d+\b", line) if n in before]
    written = set(eager) - before
    written |= set(re.findall(r"out=(t\d+)", line) + re.findall(r"^(t\d+)(?:\[|\S*\.\w+_\()", line))
    worst = [tols[n] for n in used if n in tols]
    worst += [_tolerance(eager[n].dtype) for n in used if isinstance(eager.get(n), torch.Tensor)]
    for name in list(written):
        v = eager.get(name)
        if isinstance(v, torch.Tensor):
            written |= {
                k
                for k, u in eager.items()
                if isinstance(u, torch.Tensor)
                and u.untyped_storage().nbytes()
                and _shares_memory(u, v)
            }
    for name in written:
        v = eager.get(name)
        own = [_tolerance(v.dtype)] if isinstance(v, torch.Tensor) else []
        tols[name] = max(own + worst + [tols.get(name, _tolerance(None))], key=lambda t: t["rtol"])


def _lockstep(program: Program, eager: dict, lazy: dict, counts: Counter) -> None:
    tols: dict[str, dict] = {}  # a synced number's tolerance: its tensor's dtype's
    for i, (kind, line) in enumerate(program.statements):
        counts[kind] += 1
        before = set(eager)
        err_e, warn_e = run_statement(eager, line)
        err_z, warn_z = run_statement(lazy, line)
        _track_precision(eager, line, before, tols)
        if (err_e and err_e[0]) is not (err_z and err_z[0]):
            _fail(program, i, f"statement {i} raised {err_e} on eager but {err_z} on lazy")
        counts["raised"] += err_e is not None
        if len(warn_e) != len(warn_z):
            _fail(program, i, f"statement {i} warned {warn_e} on eager but {warn_z} on lazy")
        if kind in SYNC_KINDS or i == len(program.statements) - 1:
            problems = compare(eager, lazy, tols)
            if problems:
                _fail(program, i, f"after statement {i}:\n  " + "\n  ".join(problems))


def run_programs(seeds, known: dict[str, Known], twins: bool = True) -> Counter:
    """Check the programs of ``seeds`` (each with its twin) in order, then again in reverse.

    Consecutive twins differ only in conflated literals, and the second pass meets every
    executable and memo the first pass left, in the other order."""
    programs = [
        generate(s, t, known) for s in seeds for t in ((False, True) if twins else (False,))
    ]
    total: Counter = Counter()
    for program in programs + programs[::-1]:
        total.update(check(program))
        total["programs"] += 1
    return total
