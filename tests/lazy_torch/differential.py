"""Seeded random programs, run on eager CPU and on the lazy device in lockstep and compared.

A program is a list of Python statements over variables ``t0, t1, ...`` (tensors), ``s3`` (numbers
from ``.item()``), ``b4`` (bools) and ``l5`` (lists). It is generated from a seed by drawing
statement kinds from ``VOCABULARY``; each kind's generator looks at the eager values so far, so
most statements are valid, and those that eager rejects stay in: lazy must raise the same type.
The same source runs twice: with ``dev`` the identity and ``DEV = 'cpu'``, and with ``dev``
moving to the lazy device and ``DEV = 'lazy'``. CPU index tensors and masks stay on the CPU in
both (eager CUDA accepts them as indices, so the lazy device must too).

A twin program (``twin=True``) draws the same choices but the other member of each pair of
literals that Python's ``hash()``/``==`` conflate (8/8.0, True/1, -1/-2 as a dim, 0.0/-0.0, ...),
so a process-wide cache or memo keyed on ``==`` hands one program the other's executable.

Reproduce a failure with ``python -m tests.lazy_torch.differential SEED [--twin]``.
"""

from __future__ import annotations

import random
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

import lazy_torch


@dataclass(frozen=True)
class Known:
    """A known bug: generated statements of ``kinds`` ("*": any) whose source matches ``source``
    and (when given) whose eager error matches ``eager_error`` are left out. ``reason`` says why,
    with a minimal reproducer."""

    reason: str
    kinds: tuple[str, ...] = ()
    source: str = ""
    eager_error: str = ""


FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
DTYPES = (  # (dtype, weight)
    (torch.float32, 8), (torch.float64, 2), (torch.int64, 3), (torch.bool, 2), (torch.int32, 1),
    (torch.float16, 1), (torch.bfloat16, 1),
)  # fmt: skip
# Literals that Python's hash()/== conflate or that differ only in type; a program uses one member
# of each pair and its twin the other.
SCALAR_PAIRS = ((8, 8.0), (True, 1), (0.0, -0.0), (-1, -2), (2, 2.0), (False, 0), (0.5, 1.5))
# Eager CPU errors that are no errors on an accelerator: kernels only CPU lacks for a dtype, and
# integer division by a tensor holding 0 (eager CUDA computes garbage there, it does not raise).
# Generated statements that raise them are left out.
INCOMPARABLE = r"on CPU|ZeroDivisionError"
SYNC_KINDS = {"mark_step", "item", "bool", "tolist"}
MAX_NUMEL = 512


# ----------------------------------------------------------------------------- program helpers
# Names the programs' source uses besides torch and the program's own variables.


def make(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A CPU tensor of small seeded values: normal floats, integers in [-5, 5], or bools."""
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(-5, 6, shape, generator=gen).to(dtype)


def index(shape: tuple[int, ...], high: int, seed: int) -> torch.Tensor:
    """A CPU int64 tensor of seeded indices in [0, high), repeats allowed."""
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def unique_index(shape: tuple[int, ...], dim: int, high: int, seed: int) -> torch.Tensor:
    """A CPU int64 tensor of indices in [0, high), no two alike along ``dim`` (scatter targets)."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(shape[:dim] + (high,) + shape[dim + 1 :], generator=gen).argsort(dim)
    return order.narrow(dim, 0, shape[dim])


def namespace(device: str) -> dict:
    """The globals a program runs in on ``device`` ('cpu' or 'lazy')."""
    lazy = device == "lazy"
    return {
        "torch": torch,
        "make": make,
        "index": index,
        "unique_index": unique_index,
        "DEV": device,
        "dev": (lambda t: t.to("lazy")) if lazy else (lambda t: t),
        "mark_step": lazy_torch.mark_step if lazy else (lambda: None),
    }


HELPERS = frozenset(namespace("cpu"))


@dataclass
class Program:
    seed: int
    twin: bool
    statements: list[tuple[str, str]]  # (kind, Python source)

    def source(self, mark: int | None = None) -> str:
        lines = [f"# program seed={self.seed} twin={self.twin}"]
        for i, (kind, line) in enumerate(self.statements):
            arrow = ">>" if i == mark else "  "
            lines.append(f"{arrow}{i:3d}  {line:<70}  # {kind}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the generator


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _overlaps(t: torch.Tensor) -> bool:
    """Whether elements of ``t`` may share memory (eager checks only the clear cases), or it has
    a zero stride (lazy treats those as overlapping even where no element is shared: an empty
    or size-1 dim of an expand; see test_differential.py's
    KNOWN_FAILURES)."""
    return torch._debug_has_internal_overlap(t) != 0 or 0 in t.stride()


class Gen:
    """Choices for one program: its random stream, the eager values so far and fresh names."""

    def __init__(self, seed: int, twin: bool):
        self.rng = random.Random(seed)
        self.flip = int(twin) ^ (seed & 1)  # which member of each pair; twins take the other
        self.ns = namespace("cpu")
        self.count = 0

    def new(self, prefix: str = "t") -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def choice(self, seq):
        return self.rng.choice(list(seq))

    def names(self, pred: Callable[[torch.Tensor], bool] = lambda t: True) -> list[str]:
        tensors = [(k, v) for k, v in self.ns.items() if isinstance(v, torch.Tensor)]
        return [k for k, v in tensors if k not in HELPERS and pred(v)]

    def pick(self, pred: Callable[[torch.Tensor], bool] = lambda t: True) -> str | None:
        """A tensor variable (a view half the time, where there is one)."""
        names = self.names(pred)
        views = [n for n in names if self.ns[n]._base is not None]
        return self.choice(views if views and self.chance(0.5) else names) if names else None

    def literal(self) -> str:
        return repr(self.choice(SCALAR_PAIRS)[self.flip])

    def scalar(self) -> str:
        """A Python number, a number synced earlier, or a 0-dim CPU tensor."""
        synced = [k for k, v in self.ns.items() if k[0] in "sb" and isinstance(v, (int, float))]
        r = self.rng.random()
        if synced and r < 0.15:
            return self.choice(synced)
        return f"torch.tensor({self.literal()})" if r < 0.25 else self.literal()

    def dim(self, ndim: int) -> int:
        """A valid dim of an ``ndim``-dim tensor; twins swap -1 and -2."""
        d = self.rng.randrange(-max(ndim, 1), max(ndim, 1))
        return -3 - d if ndim >= 2 and d in (-1, -2) and self.flip else d

    def dtype(self) -> torch.dtype:
        dtypes, weights = zip(*DTYPES)
        return self.rng.choices(dtypes, weights)[0]

    def shape(self, ndim: int | None = None) -> tuple[int, ...]:
        ndim = self.choice((0, 1, 2, 2, 3, 3, 4)) if ndim is None else ndim
        return tuple(self.choice((1, 2, 3, 4, 5)) if self.chance(0.97) else 0 for _ in range(ndim))

    def fresh(self, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> str:
        return f"dev(make({shape}, {dtype or self.dtype()}, {self.rng.randrange(1000)}))"

    def operand(self, like: torch.Tensor, into: torch.Tensor | None = None) -> str:
        """A tensor that broadcasts with ``like``, existing or fresh; none that shares memory
        with ``into`` (a copy's target): eager's result would depend on its loop order."""

        def fits(t):
            if into is not None and t is not into and _shares_memory(t, into):
                return False
            try:
                return len(torch.broadcast_shapes(t.shape, like.shape)) == like.dim()
            except RuntimeError:
                return False

        name = self.pick(fits) if self.chance(0.6) else None
        tail = like.shape[self.rng.randrange(like.dim() + 1) :]
        return name or self.fresh(tuple(1 if self.chance(0.3) else n for n in tail))

    def index(self, n: int, unique=False, negative=True, cpu: bool | None = None) -> str:
        """A 1-d index tensor into a dim of size ``n``, kept on the CPU or moved (None: either)."""
        if n == 0:
            return self.on_device("torch.zeros(0, dtype=torch.long)", cpu)
        k = self.rng.randint(1, n)
        if unique:
            values = self.rng.sample(range(n), min(k, n))
        else:
            values = [self.rng.randrange(n) for _ in range(k)]
        values = [v - n if negative and self.chance(0.3) else v for v in values]
        return self.on_device(f"torch.tensor({values})", cpu)

    def mask(self, shape: tuple[int, ...], cpu: bool | None = None) -> str:
        return self.on_device(f"make({shape}, torch.bool, {self.rng.randrange(1000)})", cpu)

    def on_device(self, text: str, cpu: bool | None) -> str:
        return text if (self.chance(0.5) if cpu is None else cpu) else f"dev({text})"


class Fields(dict):
    """The values a statement template's ``{fields}`` name, drawn on first use. A field with a
    digit suffix (``{d2}``, ``{out2}``) is a second draw of the same kind (so no field's own name
    ends in a digit)."""

    def __init__(self, g: Gen, a: str | None):
        super().__init__(a=a)
        self.g = g
        self.t = g.ns[a] if a else None

    def __missing__(self, key: str) -> object:
        self[key] = value = FIELDS[key.rstrip("0123456789")](self.g, self.t, self)
        return value

    def size(self) -> int:
        """The size of dim ``{d}``."""
        return self.t.shape[self["d"]] if self.t.dim() else 1


def _factor(g: Gen, numel: int) -> tuple[int, ...]:
    """A random shape with ``numel`` elements, maybe with one -1."""
    if numel == 0:
        return g.choice(((0,), (2, 0), (0, 3, -1)))
    dims, rest = [], numel
    for _ in range(g.rng.randrange(3)):
        dims.append(g.choice([d for d in range(1, rest + 1) if rest % d == 0]))
        rest //= dims[-1]
    dims.append(rest)
    g.rng.shuffle(dims)
    if g.chance(0.3):
        dims[g.rng.randrange(len(dims))] = -1
    return tuple(dims)


def _subscript(g: Gen, t: torch.Tensor, *entries: Callable[[Gen, int], str]) -> str:
    """``[:, :, entry]``: one of ``entries`` (given the dim's size) at a random dim of ``t``."""
    d = g.rng.randrange(max(t.dim(), 1))
    entry = g.choice(entries)(g, t.shape[d] if t.dim() else 1)
    return "[" + ", ".join([":"] * d + [entry]) + "]"


def _slice(g: Gen, n: int) -> str:
    start, stop = ("" if g.chance(0.4) else str(g.rng.randint(-n - 1, n + 1)) for _ in "ab")
    return f"{start}:{stop}{g.choice(('', '', ':2', ':3', ':1'))}"


def _position(g: Gen, n: int) -> str:
    return str(g.rng.randint(-n, max(n - 1, 0)))


def _ellipsis(g: Gen, n: int) -> str:
    return "..."


def _value_for(g: Gen, f: Fields) -> str:
    """A tensor to assign to ``{a}{key}``: shaped like that view, sharing no memory with it."""
    try:
        target = eval(f"{f['a']}{f['key']}", g.ns)
    except Exception:  # noqa: BLE001 (an invalid key stays in, as an error case)
        target = f.t
    return g.operand(target, into=target)


def _pair(g: Gen, t: torch.Tensor) -> str:
    """Two index tensors of one length, into dims 0 and 1."""
    k = g.rng.randint(1, 3)
    rows = [g.rng.randrange(t.shape[0]) for _ in range(k)]
    cols = [g.rng.randrange(t.shape[1]) if t.dim() > 1 and t.shape[1] else 0 for _ in range(k)]
    rows, cols = (g.on_device(f"torch.tensor({v})", None) for v in (rows, cols))
    return f"{rows}, {cols}"


# Field name -> maker(g, t, fields). ``t`` is the eager value of ``{a}``.
FIELDS: dict[str, Callable[[Gen, torch.Tensor, Fields], object]] = {
    "out": lambda g, t, f: g.new("t"),
    "num": lambda g, t, f: g.new("s"),
    "flag": lambda g, t, f: g.new("b"),
    "lst": lambda g, t, f: g.new("l"),
    "s": lambda g, t, f: g.scalar(),
    "l": lambda g, t, f: g.literal(),
    "k": lambda g, t, f: g.choice((True, False)),
    "d": lambda g, t, f: g.dim(t.dim()),
    "i": lambda g, t, f: g.rng.randint(-f.size(), max(f.size() - 1, 0)),
    "m": lambda g, t, f: g.rng.randint(1, 5),
    "shape": lambda g, t, f: g.shape(),
    "dtype": lambda g, t, f: g.dtype(),
    "seed": lambda g, t, f: g.rng.randrange(1000),
    "x": lambda g, t, f: g.pick() or "torch.ones(2)",
    "b": lambda g, t, f: g.operand(t),
    "c": lambda g, t, f: g.operand(t, into=t),
    "op": lambda g, t, f: g.choice(
        ("+", "-", "*", "/", "//", "%", "**", "==", "<", ">=", "&", "|")
    ),
    "bop": lambda g, t, f: g.choice(("+", "-", "*", "/", "==", ">", "&")),
    "fn": lambda g, t, f: g.choice(("maximum", "minimum", "atan2", "logical_and")),
    "divisor": lambda g, t, f: g.choice(("3", "3.0", "-2", "2.5")),
    "unary": lambda g, t, f: g.choice(UNARY if _in_int_range(t) else FLOAT_UNARY),
    "factor": lambda g, t, f: _factor(g, t.numel()),
    "newdim": lambda g, t, f: g.rng.randint(-t.dim() - 1, t.dim()),
    "expand": lambda g, t, f: tuple(g.choice((1, 2, 3, -1)) if n == 1 else -1 for n in t.shape),
    "perm": lambda g, t, f: tuple(g.rng.sample(range(t.dim()), t.dim())),
    "slice": lambda g, t, f: _subscript(g, t, _slice),
    "sel": lambda g, t, f: _subscript(g, t, _position),
    "key": lambda g, t, f: _subscript(g, t, _slice, _position, _ellipsis),
    "kv": lambda g, t, f: _value_for(g, f),
    "start": lambda g, t, f: g.rng.randint(0, f.size()),
    "length": lambda g, t, f: g.rng.randint(0, f.size() - f["start"]),
    "window": lambda g, t, f: g.rng.randint(1, max(f.size(), 1)),
    "step": lambda g, t, f: g.rng.randint(1, 2),
    "offset": lambda g, t, f: g.rng.randint(-1, 1),
    "split": lambda g, t, f: g.rng.randint(0, f.size()),
    "sizes": lambda g, t, f: [f["split"], f.size() - f["split"]],
    "topk": lambda g, t, f: g.rng.randint(0, t.shape[-1] if t.dim() else 1),
    "idx": lambda g, t, f: g.index(t.shape[0]),
    "uidx": lambda g, t, f: g.index(t.shape[0], unique=True),
    "col": lambda g, t, f: g.index(t.shape[1] if t.dim() > 1 else 2),
    "pair": lambda g, t, f: _pair(g, t),
    "mask": lambda g, t, f: g.mask(tuple(t.shape)),
    "rowmask": lambda g, t, f: g.mask(tuple(t.shape[:1])),
    "dmask": lambda g, t, f: g.mask(tuple(t.shape[f["d"] :]), cpu=False),
    "row": lambda g, t, f: (
        f"torch.full({(1, *t.shape[1:])}, {f['l']}, dtype={t.dtype}, device=DEV)"
    ),
    "gidx": lambda g, t, f: f"dev(index({f['ishape']}, {f.size()}, {f['seed']}))",
    "uniq": lambda g, t, f: (
        f"dev(unique_index({f['ishape']}, {f['d'] % t.dim()}, {f.size()}, {f['seed']}))"
    ),
    "src": lambda g, t, f: g.fresh(f["ishape"], t.dtype),
    "ishape": lambda g, t, f: tuple(g.rng.randint(1, n) for n in t.shape),
    "didx": lambda g, t, f: g.index(f.size(), negative=False, cpu=False),
    "bad": lambda g, t, f: g.choice((t.shape[0], -t.shape[0] - 1, t.shape[0] + 3)),
    "same": lambda g, t, f: g.pick(lambda v: v.dim() == t.dim() and v.dtype == t.dtype),
}

UNARY = (
    "neg()", "abs()", "exp()", "sin()", "tanh()", "sigmoid()", "relu()", "floor()", "round()",
    "sign()", "logical_not()", "bitwise_not()", "sqrt()", "log1p()", "float()", "long()", "bool()",
    "half()", "bfloat16()", "double()", "int()", "clone()", "contiguous()", "to(torch.float32)",
)  # fmt: skip
# PyTorch leaves the cast of a float outside an integer type's range (inf, nan) undefined: eager
# CPU gives the x86 "integer indefinite" INT_MIN, XLA saturates (nan: 0). Not generated there.
FLOAT_UNARY = tuple(u for u in UNARY if u not in ("long()", "int()"))


def _in_int_range(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()):
        return True
    return bool(t.isfinite().all() and (t.real.abs() < 2**31).all())


REDUCTIONS = (
    "sum(dim={d}, keepdim={k})", "sum()", "sum(({d}, {d2}))", "sum({d}, dtype=torch.float64)",
    "mean({d}, keepdim={k})", "amax({d}, keepdim={k})", "amin(dim={d})", "prod({d}, keepdim={k})",
    "cumsum({d})", "cumprod(dim={d})", "softmax({d})", "log_softmax(dim={d})", "all({d})",
    "logsumexp({d}, keepdim={k})", "argmax({d}, keepdim={k})", "argmax()", "argmin(dim={d})",
    "var({d})", "std({d}, keepdim={k})", "any(dim={d}, keepdim={k})", "norm()",
    "count_nonzero({d})",
)  # fmt: skip


def _nonempty(t: torch.Tensor) -> bool:
    return t.numel() > 0


def _rows(t: torch.Tensor) -> bool:
    return t.dim() >= 1 and t.shape[0] > 0


@dataclass(frozen=True)
class Kind:
    """A kind of statement: how often it is drawn, which tensor ``{a}`` names (None: none), and
    its templates (one is drawn), or a function that writes the statements itself."""

    weight: float
    templates: tuple[str, ...] = ()
    pick: Callable[[torch.Tensor], bool] | None = lambda t: True
    write: Callable[[Gen], list[str] | None] | None = None


# out= calls: (template, elementwise).
OUT_OPS = (
    ("torch.add({a}, {b}, out={o})", True),
    ("torch.mul({a}, {s}, out={o})", True),
    ("torch.sum({a}, {d}, keepdim=True, out={o})", False),
    ("torch.sum({a}, dim={d}, out={o})", False),
    ("torch.cumsum({a}, {d}, out={o})", False),
    ("torch.amax({a}, {d}, out={o})", False),
    ("torch.where({a} > 0, {a}, {b}, out={o})", True),
    ("torch.clamp({a}, min={s}, out={o})", True),
    ("torch.neg({a}, out={o})", True),
    ("torch.exp({a}, out={o})", True),
    ("torch.cat([{a}, {a}], {d}, out={o})", False),
)


def _out_call(g: Gen, out_kind: str) -> list[str] | None:
    """An out= call whose out tensor has the right shape (maybe an existing tensor or view), is
    empty (eager resizes it, identity kept) or has a wrong non-empty shape (resized, warned)."""
    a = g.pick()
    if a is None:
        return None
    template, elementwise = g.choice(OUT_OPS)
    fields = Fields(g, a)
    fields["o"] = "{o}"
    call = template.format_map(fields)
    try:
        result = eval(call.replace(", out={o}", ""), g.ns)
    except Exception:  # noqa: BLE001
        result = fields.t  # eager rejects the call itself: any out tensor shows that
    dtype = result.dtype if g.chance(0.85) else g.dtype()
    out, name = g.new(), g.new()
    if out_kind == "right":
        inputs = [g.ns[n] for n in re.findall(r"\bt\d+\b", call)]

        def fits(v):  # an out aliasing an input: eager's result depends on its loop order
            aliased = any(_shares_memory(v, i) and not (elementwise and v is i) for i in inputs)
            return v.shape == result.shape and v.dtype == dtype and not aliased

        if g.names(fits) and g.chance(0.6):
            return [f"{name} = " + call.format(o=g.choice(g.names(fits)))]
        make_out = f"{out} = torch.empty({tuple(result.shape)}, dtype={dtype}, device=DEV)"
    elif out_kind == "empty":
        make_out = f"{out} = torch.empty(0, dtype={dtype}, device=DEV)"
    else:
        shape = g.shape(g.rng.randint(1, 2))
        if shape == tuple(result.shape) or 0 in shape:
            shape = (result.numel() + 1,)
        make_out = f"{out} = torch.zeros({shape}, dtype={dtype}, device=DEV)"
    return [make_out, f"{name} = " + call.format(o=out)]


VOCABULARY: dict[str, Kind] = {
    "create": Kind(3, ("{out} = dev(make({shape}, {dtype}, {seed}))",), pick=None),
    "factory": Kind(2, (
        "{out} = torch.full({shape}, {l}, device=DEV)",
        "{out} = torch.arange({m}, device=DEV) * {l}",
        "{out} = torch.zeros({shape}, dtype={dtype}, device=DEV)",
        "{out} = torch.tensor([{l}, {l2}], device=DEV)",
        "{out} = torch.ones_like({x})",
    ), pick=None),
    "binary_scalar": Kind(6, ("{out} = {a} {op} {s}",) * 2 + ("{out} = {s} {op} {a}",)),
    "binary_tensor": Kind(4, (
        "{out} = {a} {bop} {b}", "{out} = {a} {bop} {b}", "{out} = torch.{fn}({a}, {b})",
        "{out} = torch.where({a} > 0, {a}, {b})", "{out} = torch.add({a}, {b}, alpha={l})",
    )),
    "scalar_fn": Kind(3, (
        "{out} = torch.where({a} > 0, {a}, {s})", "{out} = torch.where({a} > 0, {s}, {l})",
        "{out} = {a}.clamp(min={s})", "{out} = {a}.clamp({l}, {s})", "{out} = torch.pow({a}, {s})",
        "{out} = {a}.add({s}, alpha={l})", "{out} = torch.fmod({a}, {divisor})",
        "{out} = {a}.lerp({a} * 2, {l})",
    )),
    "unary": Kind(3, ("{out} = {a}.{unary}",) * 4 + ("{out} = {a}.type_as({x})",)),
    "reduce": Kind(6, tuple("{out} = {a}." + r for r in REDUCTIONS)),
    # Which of equal elements an unstable sort or topk picks is left open by PyTorch: only what it
    # specifies is compared (a stable sort's indices, topk's values).
    "reduce_pair": Kind(2, (
        "{out}, {out2} = {a}.max({d}, keepdim={k})", "{out}, {out2} = {a}.min({d}, keepdim={k})",
        "{out}, {out2} = {a}.sort({d}, stable=True)", "{out}, {out2} = {a}.cummax({d})",
        "{out} = {a}.topk({topk}).values",
    )),
    "view": Kind(5, tuple("{out} = {a}" + v for v in (
        ".view({factor})", ".reshape({factor})", ".view(-1)", ".unsqueeze({newdim})",
        ".squeeze({d})", ".squeeze()", ".flatten()", ".detach()", ".expand({expand})",
        ".expand(2, *{a}.shape)", "[..., None]",
    ))),
    "view_dim": Kind(4, tuple("{out} = {a}" + v for v in (
        "{slice}", "{slice}", "{sel}", ".select({d}, {i})", ".narrow({d}, {start}, {length})",
        ".unfold({d}, {window}, {step})", ".movedim({d}, {d2})", ".t()",
    )), pick=lambda t: t.dim() >= 1),
    "view_2d": Kind(3, tuple("{out} = {a}" + v for v in (
        ".transpose({d}, {d2})", ".permute({perm})", ".diagonal({offset}, {d}, {d2})",
        ".flatten({newdim}, {d})", ".mT", ".T",
    )), pick=lambda t: t.dim() >= 2),
    "split": Kind(3, (
        "{out}, {out2} = {a}.split({sizes}, dim={d})", "{out} = {a}.split({m}, {d})[-1]",
        "{out} = {a}.chunk({m}, {d})[0]", "{out} = {a}.unbind({d})[{i}]",
    ), pick=lambda t: t.dim() >= 1),
    "inplace": Kind(8, (
        "{a}.add_({s})", "{a}.mul_({s})", "{a}.sub_({b})", "{a} += {s}", "{a} *= {b}",
        "{a}.copy_({c})", "{a}.fill_({s})", "{a}.zero_()", "{a}.clamp_(min={s})",
        "{a}.clamp_({l}, {s})", "{a}.neg_()", "{a}.masked_fill_({a} > 0, {s})",
        "{out} = {a}.add_({b}, alpha={l})",
    ), pick=lambda t: not _overlaps(t)),
    "setitem_basic": Kind(4, ("{a}{key} = {s}", "{a}{key} = {s}", "{a}{key} = {kv}"),
                          pick=lambda t: t.dim() >= 1 and not _overlaps(t)),
    "index_read": Kind(4, tuple("{out} = {a}" + k for k in (
        "[{idx}]", "[{mask}]", "[{rowmask}]", "[{a} > 0]", "[{idx}, ..., -1]", "[:, {col}]",
        "[{pair}]", "[1:, {col}]",
    )), pick=_rows),
    "index_write": Kind(4, (
        "{a}[{uidx}] = {s}", "{a}[{idx}] += {s}", "{a}[{mask}] = {s}", "{a}[{a} < 0] = {s}",
        "{a}[{uidx}] = {row}", "{a}.index_put_(({idx},), {row}, accumulate=True)",
        "{a}.index_put_(({idx},), torch.tensor({l}), accumulate=True)",
        "{out} = {a}.index_put(({uidx},), {row})",
    ), pick=lambda t: _rows(t) and not _overlaps(t)),
    "index_fn": Kind(4, tuple("{out} = {a}." + f for f in (
        "index_select({d}, {didx})", "gather({d}, {gidx})", "scatter({d}, {uniq}, {src})",
        "scatter({d}, {uniq}, {l})", "scatter_add({d}, {gidx}, {src})",
        "masked_fill({a} > 0, {s})", "masked_fill({dmask}, {l})",
    )), pick=lambda t: t.dim() >= 1 and t.numel() > 0),
    # Out-of-range CPU indices. Eager CPU raises at the call; eager CUDA asserts on the device
    # and the lazy device raises at the next barrier: the statement syncs, so both raise in it.
    "index_bad": Kind(1, (
        "{lst} = {a}[torch.tensor([0, {bad}])].tolist()",
        "{lst} = {a}.clone().index_put_((torch.tensor([{bad}]),), torch.tensor({l})).tolist()",
    ), pick=_rows),
    # Writes into a tensor whose elements share memory (expanded, unfolded).
    "write_overlap": Kind(1, (
        "{a}[{uidx}] = {s}", "{a}[{a} != 0] = {l}", "{a}[..., :2] = {s}", "{a}.fill_({s})",
        "{a}.add_({s})", "{a}.index_put_(({idx},), torch.tensor({l}), accumulate=True)",
    ), pick=lambda t: _overlaps(t) and _rows(t)),
    "out_right": Kind(2, write=lambda g: _out_call(g, "right")),
    "out_empty": Kind(2, write=lambda g: _out_call(g, "empty")),
    "out_wrong": Kind(1, write=lambda g: _out_call(g, "wrong")),
    "join": Kind(2, (
        "{out} = torch.cat([{a}, {same}], {d})", "{out} = torch.stack([{a}, {a}], {d})",
    ), pick=lambda t: t.dim() >= 1),
    "mark_step": Kind(1, ("mark_step()",), pick=None),
    "item": Kind(1, ("{num} = {a}.sum().item()", "{num} = {a}.flatten()[-1].item()"),
                 pick=_nonempty),
    "bool": Kind(1, ("{flag} = bool(({a} > {l}).any())", "{flag} = bool({a}.sum() >= 0)")),
    "tolist": Kind(1, ("{lst} = {a}.tolist()",), pick=lambda t: t.numel() <= 64),
}  # fmt: skip


def _write(g: Gen, kind: Kind) -> list[str] | None:
    if kind.write is not None:
        return kind.write(g)
    a = None if kind.pick is None else g.pick(kind.pick)
    if kind.pick is not None and a is None:
        return None
    return [g.choice(kind.templates).format_map(Fields(g, a))]


def run_statement(ns: dict, source: str) -> tuple[tuple[type, str] | None, list[str]]:
    """Execute one statement; return the type and text of what it raised, and its warnings
    about resized outputs. (The exception itself is dropped: its traceback would keep a failed
    pending tensor alive.)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(source, ns)  # noqa: S102
        except Exception as e:  # noqa: BLE001 (the exception is the result)
            return (type(e), str(e)), []
    return None, sorted(str(w.message) for w in caught if "resized" in str(w.message))


def _known(known: dict[str, Known], kind: str, line: str, eager_error: str | None) -> bool:
    """Whether a known failure leaves this statement out (eager_error None: before running it)."""
    for k in known.values():
        if not {kind, "*"} & set(k.kinds) or not re.search(k.source, line):
            continue
        if not k.eager_error or (eager_error and re.search(k.eager_error, eager_error)):
            return True
    return False


def generate(seed: int, twin: bool = False, known: dict[str, Known] | None = None) -> Program:
    """The program for ``seed``: a few tensors, then 8-20 statements, none that ``known``
    failures leave out."""
    known = known or {}
    g = Gen(seed, twin)
    kinds = list(VOCABULARY)
    weights = [VOCABULARY[k].weight for k in kinds]
    length = g.rng.randint(8, 20)
    statements: list[tuple[str, str]] = []
    for _ in range(g.rng.randint(1, 3)):
        (line,) = _write(g, VOCABULARY["create"])
        statements.append(("create", line))
        run_statement(g.ns, line)
    while len(statements) < length:
        kind = g.rng.choices(kinds, weights)[0]
        batch = _write(g, VOCABULARY[kind])
        for line in batch or ():
            if _known(known, kind, line, None):
                break
            error, _ = run_statement(g.ns, line)
            if error and (re.search(INCOMPARABLE, error[1]) or _known(known, kind, line, error[1])):
                break
            statements.append((kind, line))
            if error and kind.startswith("out_") and line is not batch[0]:
                # A failed out= call may have resized its fresh out tensor: its values are
                # uninitialized memory.
                out = batch[0].split()[0]
                statements.append(("del", f"del {out}"))
                del g.ns[out]
        for name in g.names(lambda t: t.numel() > MAX_NUMEL):  # keep programs small
            statements.append(("del", f"del {name}"))
            del g.ns[name]
    return Program(seed, twin, statements)


def _main(argv: list[str]) -> None:
    """``SEED [--twin]``: print and check one program; ``--seeds N``: check seeds 0..N-1."""
    from tests.lazy_torch.lockstep import check, run_programs
    from tests.lazy_torch.test_differential import KNOWN_FAILURES

    if argv[1] == "--seeds":
        print(dict(run_programs(range(int(argv[2])), KNOWN_FAILURES)))
        return
    program = generate(int(argv[1]), "--twin" in argv, KNOWN_FAILURES)
    print(program.source())
    check(program)
    print("ok")


if __name__ == "__main__":
    _main(sys.argv)
