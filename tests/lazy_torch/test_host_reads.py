"""Small reads computed on the host by eager PyTorch (lazy_torch/host_reads.py): eager's values,
dtypes and errors, no compile, and the graphs that must compile still do."""

from __future__ import annotations

import pytest
import torch

import lazy_torch
import runtime


@pytest.fixture(autouse=True)
def _host_reads(monkeypatch):
    monkeypatch.setattr(runtime.config, "HOST_READS", True)  # tests/conftest.py turns it off
    # A mesh that an earlier test in this process made keeps every later read off the host.
    monkeypatch.setattr(runtime.spmd, "_active", [False])


def _count(name: str) -> int:
    return lazy_torch.metrics.counters().get(name, 0)


def _checks(ids: torch.Tensor, eos: torch.Tensor, pad: int) -> list:
    """transformers' generate() input checks, and the growing sequence it returns."""
    seq = ids
    for t in range(5):
        seq = torch.cat([seq, (seq[:, -1:] * 7 + t) % 50], dim=-1)
    return [
        torch.isin(eos.unsqueeze(0), eos).any().item(),
        (eos.unsqueeze(0) < 0).any().item(),
        bool(torch.ones_like(ids).eq(1).all()),
        pad in ids[:, [-1, 0]],
        torch.sum(ids[:, -1] == pad).item() > 0,
        seq.cpu(),
    ]


def test_input_checks_and_a_sequence_read_compute_eager_values_without_compiling():
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    eos = torch.tensor(7)
    expected = _checks(ids, eos, 3)
    for _ in range(2):  # the second time with the plans kept
        before = _count("host_reads")
        got = _checks(ids.to("lazy"), eos.to("lazy"), 3)
        assert _count("compiles") == 0
        assert _count("host_reads") - before == 6
        assert got[:5] == expected[:5]
        assert torch.equal(got[5], expected[5]) and got[5].dtype == expected[5].dtype


def test_each_read_takes_its_inputs_current_values():
    x = torch.zeros(4, dtype=torch.int64, device="lazy")
    seen = []
    for i in range(3):
        x.add_(i)
        lazy_torch.mark_step()  # x is device data: the same graph reads new values
        seen.append((x * 2 + 1).tolist())
    assert seen == [[1] * 4, [3] * 4, [7] * 4]
    assert _count("host_reads") == 3


_f32 = torch.tensor(1.5, dtype=torch.float32)
_f64 = torch.tensor(16777216.5, dtype=torch.float64)
SAMPLES = {  # name: (function of its inputs, inputs)
    "float32 0-dim tensor": (lambda a: a + _f32, (torch.arange(4),)),
    "Python float": (lambda a: (a * 2.5).sum(), (torch.arange(4),)),
    # Compared in float64 (a 0-dim tensor) and in float32 (1.5): 16777217 is no float32.
    "float64 0-dim with ints": (lambda a: a > _f64, (torch.tensor([16777217, 3]),)),
    "Python float with large ints": (lambda a: a > 16777216.5, (torch.tensor([16777217, 3]),)),
    "Python float with ints": (lambda a: a < 1.5, (torch.arange(4),)),
    "complex128 0-dim with ints": (
        lambda a: a + torch.tensor(0.1 + 1j, dtype=torch.complex128),
        (torch.arange(3),),
    ),
    "Python complex with complex": (lambda a: a.to(torch.complex64) * 2j, (torch.rand(3),)),
    "bfloat16": (lambda a: (a.to(torch.bfloat16) * 3).float().sum(), (torch.rand(8),)),
    "float16 mean": (lambda a: a.half().mean(), (torch.rand(8),)),
    "bool": (lambda a: (a > 0.5).logical_not().sum(), (torch.rand(8),)),
    "multi-output": (lambda a: a.max(dim=1)[1], (torch.rand(3, 5),)),
    "sort": (lambda a: torch.sort(a, descending=True)[0], (torch.rand(6),)),
    "arange and dtype": (
        lambda a: torch.arange(3, dtype=torch.float64, device=a.device) + a[:3],
        (torch.rand(6, dtype=torch.float64),),
    ),
    "clone formats": (
        lambda a: a.permute(1, 0).clone(memory_format=torch.contiguous_format),
        (torch.rand(2, 3),),
    ),
    "index with None": (lambda a, i: a[:, i], (torch.rand(2, 5), torch.tensor([-1, 0]))),
    "integer division": (lambda a: torch.div(a, 3, rounding_mode="floor"), (torch.arange(-5, 5),)),
    "cumsum dtype": (lambda a: a.cumsum(0, dtype=torch.float32), (torch.arange(5),)),
    "matmul": (lambda a, b: a @ b, (torch.rand(3, 4), torch.rand(4, 2))),
    "empty and fill": (
        lambda a: torch.ones(a.shape, dtype=a.dtype, device=a.device) + a,
        (torch.arange(5),),
    ),
}


@pytest.mark.parametrize("name", SAMPLES)
def test_values_and_dtypes_equal_eager(name):
    fn, inputs = SAMPLES[name]
    expected = fn(*inputs)
    got = fn(*(x.to("lazy") for x in inputs)).cpu()
    assert _count("host_reads") == 1 and _count("compiles") == 0
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_random_ops_compile_and_draw_what_a_compiled_graph_draws(monkeypatch):
    def draw():
        lazy_torch.manual_seed(5)
        return (torch.rand(4, device="lazy") * 2).tolist()

    monkeypatch.setattr(runtime.config, "HOST_READS", False)
    compiled = draw()
    monkeypatch.setattr(runtime.config, "HOST_READS", True)
    assert draw() == compiled
    assert _count("host_reads") == 0


def test_an_out_of_range_index_raises_eagers_error_and_keeps_values():
    a = torch.arange(5, device="lazy")
    i = torch.tensor([7], device="lazy")
    with pytest.raises(IndexError):
        a[i].tolist()
    assert a.tolist() == [0, 1, 2, 3, 4]


def test_large_inputs_compile():
    a = torch.rand(300, 300, device="lazy")  # 90,000 elements to copy to the host
    lazy_torch.mark_step()
    compiles = _count("compiles")
    (a.sum() > 0).item()
    assert _count("host_reads") == 0 and _count("compiles") == compiles + 1


def test_lazy_debug_says_where_a_read_ran():
    lines = []
    stop = runtime.metrics.listen(lambda e: lines.append(e.line()))
    try:
        (torch.arange(3, device="lazy") > 1).any().item()
    finally:
        stop()
    assert len(lines) == 1 and "computed on the host by eager PyTorch" in lines[0]
    assert "test_host_reads.py" in lines[0]


def test_a_matmul_recorded_at_another_precision_than_the_current_one_compiles():
    a, b = torch.rand(3, 4, device="lazy"), torch.rand(4, 2, device="lazy")
    lazy_torch.mark_step()
    product = a @ b  # recorded at "highest"
    torch.set_float32_matmul_precision("high")
    try:
        product.cpu()
    finally:
        torch.set_float32_matmul_precision("highest")
    assert _count("host_reads") == 0


def test_a_graph_read_again_and_again_compiles_once_its_reads_cost_what_a_compile_would(
    monkeypatch,
):
    from lazy_torch import host_reads

    monkeypatch.setattr(host_reads, "_COMPILE_SECONDS", 0.0)  # any read costs more
    x = torch.arange(4, device="lazy")
    lazy_torch.mark_step()
    compiles = _count("compiles")
    assert [(x * 2).sum().item() for _ in range(3)] == [12, 12, 12]
    assert _count("host_reads") == 1 and _count("compiles") == compiles + 1


def test_once_a_mesh_is_made_reads_compile(monkeypatch):
    # A value on a mesh spans devices (and processes, where every one must read it at once).
    monkeypatch.setattr(runtime.spmd, "_active", [True])
    assert (torch.arange(3, device="lazy") > 1).any().item()
    assert _count("host_reads") == 0 and _count("compiles") == 1


def test_a_decomposition_unique_up_to_signs_is_never_split_between_host_and_device():
    # Its error check's read would compute eig on the host, and a later graph the eigenvectors
    # again with XLA's kernel, whose phases may differ from LAPACK's: the check compiles instead.
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(3)).to("lazy")
    values, vectors = torch.linalg.eig(a)
    residual = (a.to(vectors.dtype) @ vectors - vectors * values).abs().max().item()
    assert residual < 1e-4
    assert _count("host_reads") == 0
