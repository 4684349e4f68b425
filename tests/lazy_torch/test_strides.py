"""Output strides of lazy tensors against eager CPU: shape inference replays eager once per
signature (lazy_torch/strides.py), at full size or on shrunk stand-ins for large calls."""

import types
import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten, tree_map

import lazy_torch
from lazy_torch import dispatch, recording, strides
from lazy_torch.backend import BACKEND

DEV = lazy_torch.device()
aten = torch.ops.aten
# OpInfo's wrapper_set_seed calls torch._lazy.mark_step() for tensors of device type 'lazy'
# (PyTorch's legacy lazy-tensor core, which this backend never initializes): point it at ours.
if not hasattr(torch, "_lazy"):
    torch._lazy = types.SimpleNamespace(mark_step=lambda *a, **k: lazy_torch.mark_step())


def exact(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` on ``device`` with its own sizes, strides and storage offset (a view of a copy of
    its whole storage)."""
    if device == "cpu":
        return t
    storage = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
    return storage.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def layout(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def _compare(program, values: bool = True) -> None:
    """Run ``program(device)`` on eager CPU and on the lazy device; each output must have eager's
    layout and (``values``) eager's values."""
    eager, lazy = program("cpu"), program(DEV)
    assert len(eager) == len(lazy)
    for i, (e, z) in enumerate(zip(eager, lazy)):
        assert layout(z) == layout(e), f"output {i}"
    if values:
        lazy_torch.mark_step()  # one graph computes every output
        for e, z in zip(eager, lazy):
            torch.testing.assert_close(z.cpu(), e, rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------------------------
# The cases that showed meta kernels' layouts, at full size and large (shrunk replays).


def _size_one(n: int):
    def program(d):
        c = exact(torch.arange(n, dtype=torch.float32).as_strided((1, n), (1, 1)), d)
        x = torch.ones(n, 1, device=d).t()
        return [
            c + 1,
            c + c,
            c.sin(),
            torch.add(c, 1),
            c.mul(2),
            c.clone(),
            torch.zeros_like(c),
            torch.ones_like(c),
            c.neg(),
            c.sum(1, keepdim=True),
            torch.where(c > 1, c, 0.0),
            x + 1,
            x / 2,
        ]

    return program


@pytest.mark.parametrize("n", [8, 70_000], ids=["full", "shrunk"])
def test_size_one_dims(n):
    _compare(_size_one(n))


@pytest.mark.parametrize("n", [8, 70_000], ids=["full", "shrunk"])
def test_empty_like_keeps_eager_layout(n):
    def program(d):
        c = exact(torch.zeros(n).as_strided((1, n), (1, 1)), d)
        return [torch.empty_like(c), torch.rand_like(c), torch.empty_like(c.t())]

    _compare(program, values=False)


def test_empty_and_size_one_tensors():
    def program(d):
        y = exact(torch.ones(2, 6)[:1, ::2], d).unsqueeze(1)  # (1, 1, 3) with strides (12, 2, 2)
        return [
            torch.ones(0, 1, device=d) / 2,
            torch.ones_like(torch.ones(1, 2, 4, 3, device=d).unfold(3, 3, 1)),
            torch.nn.functional.hardtanh(y),
            torch.nan_to_num(y),
            torch.zeros_like(exact(torch.zeros(4, 10)[1:2, :0], d)),
        ]

    _compare(program)


def test_index_of_overlapping_windows():
    def program(d):
        x = torch.arange(48.0, device=d).reshape(4, 4, 3).unfold(0, 3, 1)
        return [x[1:, torch.tensor([1, 2], device=d)]]

    _compare(program)


def _permuted_inputs(d):
    x = exact(torch.arange(50.0).reshape(10, 5).t().contiguous().t(), d)  # column-major
    y = exact(torch.arange(250.0).reshape(5, 10, 5).permute(2, 1, 0), d)
    z = exact(torch.arange(60.0).reshape(3, 4, 5)[:, 1:3, ::2], d)  # gaps
    return x, y, z


def _permuted(d):
    """Ops whose large calls replay on shrunk stand-ins too."""
    x, y, z = _permuted_inputs(d)
    return [
        torch.copysign(x, -1.0),
        torch.floor_divide(x, 3),
        torch.logaddexp(x.unsqueeze(1), x),
        y.softmax(-1),
        torch.cat([y, y], 1),
        y.sum(1, keepdim=True),
        z * 2,
        z.mT @ z,
        torch.nn.functional.layer_norm(y.transpose(0, 1)[:1], (5, 5)),
    ]


def _permuted_full_size_only(d):
    """Ops whose large calls keep the meta kernel's layout."""
    y = _permuted_inputs(d)[1]
    return [torch.nn.functional.batch_norm(y, None, None, training=True), torch.fft.rfft2(y).abs()]


def test_permuted_inputs():
    _compare(_permuted)
    _compare(_permuted_full_size_only)


def test_large_permuted_and_strided_inputs():
    def program(d):
        x = exact(torch.arange(90_000.0).reshape(300, 1, 300).permute(2, 1, 0), d)
        z = exact(torch.ones(8, 32, 32, 64).permute(0, 3, 1, 2), d)  # channels-last
        w = exact(torch.arange(180_000.0).reshape(300, 600)[:, ::2], d)  # gaps
        return [x + 1, x.softmax(-1), torch.where(x > 5, x, 0.0), z * 2, z.sum(1), w + w, w.exp()]

    _compare(program)


def _size_one_layer_norm(n: int):
    def program(d):
        x = (torch.arange(100.0 * n, device=d) / 1e4).reshape(100, 1, n).transpose(0, 1)
        w = torch.ones(n, device=d)
        return [torch.nn.functional.layer_norm(x, (n,), w, w), torch.nn.functional.gelu(x)]

    return program


def test_large_layer_norm_of_a_transposed_batch():
    _compare(_size_one_layer_norm(768))


def test_nonzero_is_column_major_as_eager():
    def program(d):
        x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]], device=d)
        return [torch.nonzero(x), torch.argwhere(x[0]), torch.nonzero(x[:, :0])]

    _compare(program)


# ----------------------------------------------------------------------------------------------
# What a replay must not do.


def test_a_replay_eager_refuses_keeps_the_meta_kernels_layout(monkeypatch):
    weights = torch.ones(2, 19, device=DEV)
    refused = []
    replay = strides._replay

    def spy(*args):
        result = replay(*args)
        refused.append(result is None)
        return result

    monkeypatch.setattr(strides, "_replay", spy)
    # Zeros are no distribution: eager's multinomial of the stand-in raises, the call must not.
    samples = torch.multinomial(weights, 3)
    assert refused == [True]
    assert layout(samples) == ((2, 3), (3, 1), 0, torch.int64)
    a = torch.eye(3).to(DEV) * 2
    torch.testing.assert_close(torch.linalg.inv(a).cpu(), torch.eye(3) / 2)


def test_large_ctc_loss_backward():
    # Its alphas have 2 * target length + 1 entries: stand-ins shrunk by size would not keep
    # that, and its kernel reads by it (a replay on them crashed the process). Too large for a
    # full-size replay: the meta kernel's layout stays.
    def grad(d):
        gen = torch.Generator().manual_seed(0)
        log_probs = torch.randn(50, 16, 20, generator=gen).log_softmax(2).to(d).requires_grad_()
        targets = torch.randint(1, 20, (16, 30), generator=gen).to(d)
        lengths = (torch.full((16,), 50).to(d), torch.full((16,), 30).to(d))
        torch.nn.functional.ctc_loss(log_probs, targets, *lengths).backward()
        return [log_probs.grad]

    _compare(grad)


def test_random_ops_draw_nothing_from_eagers_generator():
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    c = torch.empty_strided((1, 7), (1, 1), device=DEV)
    torch.rand_like(c)  # a new signature: replayed
    torch.nn.functional.dropout(c.t(), 0.5)
    assert torch.equal(torch.rand(4), expected)


def test_a_replay_adds_no_warning():
    def warnings_of(d):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.std(torch.ones(1, 17, device=d), dim=0)  # a new signature: replayed
        return [str(w.message) for w in caught]

    assert warnings_of(DEV) == warnings_of("cpu")  # eager's own, once


def test_each_signature_replays_once(monkeypatch):
    c = torch.empty_strided((1, 13), (1, 1), device=DEV)
    replays = []
    replay = strides._replay
    monkeypatch.setattr(strides, "_replay", lambda *a: replays.append(a[0]) or replay(*a))
    first = c * 3  # a signature no other test makes
    assert replays == [aten.mul.Tensor]
    second = c * 3  # the memo's entry (in C where the fast path is built)
    assert replays == [aten.mul.Tensor]
    assert first.stride() == second.stride() == (1, 1)


@pytest.mark.parametrize("n", [5, 70_000], ids=["full", "shrunk"])
def test_in_place_and_out_keep_their_tensors_layouts(n):
    def program(d):
        c = exact(torch.zeros(n).as_strided((1, n), (1, 1)), d)
        out = exact(torch.zeros(n).as_strided((n, 1), (1, n)), d)
        torch.add(c.t(), 1, out=out)
        return [c.add_(1), out]

    _compare(program)


# ----------------------------------------------------------------------------------------------
# Shrunk replays give what full-size ones give, on the small cases above.


@pytest.mark.parametrize(
    "program",
    [_size_one(8), _size_one_layer_norm(8), _permuted],
    ids=["size_one", "layer_norm", "permuted"],
)
def test_shrunk_replays_agree_with_full_size_ones(monkeypatch, program):
    monkeypatch.setattr(strides, "_cheap", lambda *a: False)
    cache: dict = {}  # every call a miss ...
    monkeypatch.setattr(BACKEND, "meta_cache", cache)
    recording.configure(dispatch.dispatch)  # ... in C too
    try:
        _compare(program, values=False)
    finally:
        monkeypatch.undo()
        recording.configure(dispatch.dispatch)


# ----------------------------------------------------------------------------------------------
# OpInfo samples in four layouts: as given, non-contiguous, dims in reversed memory order, and
# size-1 dims with stride 1.


def _reversed(t: torch.Tensor) -> torch.Tensor:
    dims = tuple(reversed(range(t.dim())))
    return t.permute(dims).contiguous().permute(dims)


def _size_one_strides(t: torch.Tensor) -> torch.Tensor:
    c = t.contiguous()
    return c.as_strided(c.shape, tuple(1 if n == 1 else s for n, s in zip(c.shape, c.stride())))


def _tensors(f):
    return lambda s: s.transform(lambda t: f(t) if isinstance(t, torch.Tensor) else t)


LAYOUTS = {
    "given": lambda s: s,
    "noncontiguous": lambda s: s.noncontiguous(),
    "reversed": _tensors(_reversed),
    "size_one_strides": _tensors(_size_one_strides),
}
SWEEP = [
    "add", "mul", "div.no_rounding_mode", "div.floor_rounding", "copysign", "floor_divide",
    "logaddexp", "logical_and", "heaviside", "where", "neg", "sin", "exp", "nan_to_num",
    "isfinite", "nn.functional.hardtanh", "nn.functional.relu6", "sum", "mean", "amax", "softmax",
    "log_softmax", "cat", "clone", "zeros_like", "ones_like", "full_like", "matmul", "addmm",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.conv1d",
    "nn.functional.conv_transpose2d", "index_select", "gather", "flip", "fft.rfft2", "fft.irfft",
    "nn.functional.one_hot", "svd", "linalg.eig",
]  # fmt: skip
_OPS = {op.name + ("." + op.variant_test_name if op.variant_test_name else ""): op for op in op_db}


def _on_lazy(t):
    return exact(t, DEV) if isinstance(t, torch.Tensor) else t


def _eager(op, args: tuple, kwargs: dict):
    try:
        return op(*args, **kwargs)
    except Exception:  # noqa: BLE001 (eager refuses the sample: nothing to compare)
        return None


def _mismatches(op, samples: int) -> list[str]:
    dtype = next((d for d in (torch.float32, torch.int64) if d in op.supported_dtypes("cpu")), None)
    if dtype is None:
        pytest.skip("no float32 or int64 kernel on the CPU")
    found = []
    for i, sample in enumerate(list(op.sample_inputs("cpu", dtype))[:samples]):
        values = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in values):
            continue  # sparse inputs: XLA has no sparse layouts
        for name, make in LAYOUTS.items():
            s = make(sample)
            args, kwargs = (s.input, *s.args), s.kwargs
            expected = _eager(op, args, kwargs)
            if expected is None:
                continue
            got = op(*tree_map(_on_lazy, args), **tree_map(_on_lazy, kwargs))
            for e, z in zip(tree_flatten(expected)[0], tree_flatten(got)[0]):
                if (
                    isinstance(e, torch.Tensor)
                    and e.layout == torch.strided
                    and layout(e) != layout(z)
                ):
                    found.append(f"sample {i} {name}: eager {layout(e)}, lazy {layout(z)}")
    return found


@pytest.mark.parametrize("name", SWEEP)
def test_opinfo_strides(name):
    assert not _mismatches(_OPS[name], samples=6)


_DECOMPOSED = (
    "decomposed by a torch._decomp decomposition whose last op lays its output out otherwise "
    "than eager's own kernel: the decomposition's strides stand (the replay covers recorded ops)"
)
# Entries of the full sweep that fail, with the reason.
KNOWN = {
    "frexp": _DECOMPOSED,
    "ldexp": _DECOMPOSED,
    "sinc": _DECOMPOSED,
    "native_dropout_backward": _DECOMPOSED,
    "nn.functional.prelu": _DECOMPOSED,
    "nn.functional.pixel_unshuffle": _DECOMPOSED,
    "nn.functional.max_unpool2d.grad": _DECOMPOSED,
    "_batch_norm_with_update": _DECOMPOSED,
    "nn.functional.rrelu": "training records rrelu_with_noise_functional, whose eager layout of "
    "an empty non-contiguous input differs from rrelu_with_noise's (ops.py)",
    "histogram": "bin_edges of a non-contiguous bins tensor is that tensor's layout (offset "
    "included), eager's a new contiguous tensor (CPU fallback)",
    "tensor_split": "its indices tensor must stay on the CPU; the sweep moves every tensor",
    "view_copy": "lazy raises eager's view error for strides view_copy accepts",
    "to_sparse": "sparse layouts: not supported by XLA",
    "chalf": "complex32 has no XLA element type",
    "linspace.tensor_overload": "start and end tensors on the lazy device, the result made on the "
    "CPU (the sweep moves every tensor)",
}
_ALL = sorted(set(_OPS) - set(SWEEP))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n])) if n in KNOWN else n for n in _ALL],
)
def test_opinfo_strides_all(name):
    assert not _mismatches(_OPS[name], samples=10)
