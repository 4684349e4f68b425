"""Views and in-place ops as pure substitution, against eager CPU (LazyTensor paper cases and
more)."""

import pytest
import torch

import lazy_torch  # noqa: F401
from tests.lazy_torch.compare import assert_same_tensor


def _both(program):
    """Run ``program(to_device)`` eagerly on CPU and on the lazy device; return both results."""
    eager = program(lambda t: t)
    lazy = program(lambda t: t.to("lazy"))
    return eager, lazy


def _check(program):
    eager, lazy = _both(program)
    eager = eager if isinstance(eager, (tuple, list)) else (eager,)
    lazy = lazy if isinstance(lazy, (tuple, list)) else (lazy,)
    for e, g in zip(eager, lazy):
        assert_same_tensor(g, e)


def test_permute_add_updates_base():
    def program(dev):
        x = dev(torch.arange(24.0).reshape(2, 3, 4))
        x.permute(1, 2, 0).add_(42)
        return x

    _check(program)


def test_print_twice_after_inplace_and_values_read_before_write():
    a = torch.ones(3).to("lazy")
    a += 1
    assert str(a) == str(a) == "tensor([2., 2., 2.], device='lazy:0')"

    def program(dev):
        a = dev(torch.ones(3))
        b = a + 2
        a += 1
        return a, b

    _check(program)


def test_view_add_updates_base_and_other_views():
    def program(dev):
        t = dev(torch.zeros(16))
        v = t.view(2, 8)
        w = t.view(4, 4)
        v.add_(1)
        v[1, 2:5] = 7
        return t, v, w

    _check(program)


def test_loop_writing_elements_and_recurrence_over_columns():
    def loop(dev):
        b = dev(torch.arange(6.0)).clone()
        for i in range(6):
            b[i] = b[i] + 1
        return b

    def recurrence(dev):
        out = dev(torch.zeros(3, 5))
        out[:, 0] = dev(torch.tensor([1.0, 2.0, 3.0]))
        for i in range(1, 5):
            out[:, i] = torch.tanh(out[:, i - 1] * 0.5 + 0.1)
        return out

    _check(loop)
    _check(recurrence)


def test_strided_clamp_diagonal_unfold_as_strided_writes():
    def boxes(dev):
        b = dev(torch.tensor([[-5.0, 3, 20, 7], [1, -2, 3, 40]]))
        b[:, 0::2].clamp_(0, 10)
        return b

    def diagonal(dev):
        x = dev(torch.zeros(3, 4))
        x.diagonal(1).add_(1)
        x.diagonal().fill_(5)
        return x

    def unfold(dev):
        x = dev(torch.arange(12.0))
        u = x.unfold(0, 3, 3)
        u[1].zero_()
        u[:, 0] += 100
        return x, u

    def as_strided(dev):
        x = dev(torch.arange(12.0))
        s = x.as_strided((2, 2), (3, 1), 1)
        s.mul_(-1)
        return x, s

    for program in (boxes, diagonal, unfold, as_strided):
        _check(program)


def test_transpose_aliases_but_contiguous_copy_does_not():
    def program(dev):
        x = dev(torch.arange(6.0).reshape(2, 3))
        alias = x.transpose(0, 1)
        copy = x.transpose(0, 1).contiguous()
        alias[0, 1] = -1
        copy[1, 0] = -2
        return x, alias, copy

    _check(program)


def test_split_outputs_mutated_one_by_one():
    def program(dev):
        x = dev(torch.arange(10.0))
        for i, part in enumerate(x.split(3)):
            part.mul_(i + 2)
        for i, row in enumerate(dev(torch.zeros(3, 2)).unbind(0)):
            row.fill_(i)
        return x

    _check(program)


def test_views_of_views_chain():
    def program(dev):
        x = dev(torch.arange(60.0).reshape(3, 4, 5))
        v = x[1:].transpose(0, 2)[::2, 1].unsqueeze(0)
        v.sub_(1000)
        y = x.view(12, 5)[3:9].t()
        y[0] = 0
        return x, v, y

    _check(program)


def test_writing_into_expanded_view_raises_eagers_error():
    cpu = torch.ones(3, 1).expand(3, 4)
    lazy = torch.ones(3, 1, device="lazy").expand(3, 4)
    with pytest.raises(RuntimeError) as eager:
        cpu.add_(1)
    with pytest.raises(RuntimeError) as got:
        lazy.add_(1)
    assert str(got.value) == str(eager.value)


def test_out_variants_and_data_idioms():
    def program(dev):
        a, b = dev(torch.arange(4.0)), dev(torch.ones(4))
        out = dev(torch.empty(4))
        torch.add(a, b, alpha=2, out=out)
        p = dev(torch.ones(2, 2))
        with torch.no_grad():
            p.add_(1)
        p.detach().mul_(3)
        d = p.data
        d[0, 0] = 9
        return out, p

    _check(program)
    p = torch.nn.Parameter(torch.ones(3).to("lazy"))
    p.data = torch.full((2, 2), 5.0).to("lazy")
    assert p.shape == (2, 2) and p.requires_grad and torch.equal(p.cpu(), torch.full((2, 2), 5.0))


_BITCAST_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.bfloat16,
    torch.int32,
    torch.float32,
    torch.int64,
    torch.float64,
    torch.complex64,
    torch.complex128,
]


@pytest.mark.parametrize("source", _BITCAST_DTYPES, ids=str)
def test_view_as_another_dtype_reads_eagers_bytes(source):
    # Item sizes that differ scale the last dimension (float32 -> uint8: 4x, int8 -> int32: /4).
    g = torch.Generator().manual_seed(0)
    if source.is_floating_point or source.is_complex:
        x = torch.randn(3, 16, generator=g, dtype=source)
    else:
        x = torch.randint(0, 2 if source == torch.bool else 100, (3, 16), generator=g).to(source)
    for target in _BITCAST_DTYPES:
        got = x.to("lazy").view(target)
        eager = x.view(target)
        assert (got.shape, got.stride(), got.dtype) == (eager.shape, eager.stride(), eager.dtype)
        if target == torch.bool:  # bytes other than 0 and 1 read as True (eager keeps the byte)
            assert torch.equal(got.cpu(), eager.view(torch.uint8) != 0), target
        else:  # bytes, not values: reinterpreted bits may be NaNs
            assert torch.equal(got.cpu().view(torch.uint8), eager.view(torch.uint8)), target


def test_view_as_another_dtype_errors_match_eager():
    for x, target in [
        (torch.zeros(3, dtype=torch.uint8), torch.int16),
        (torch.zeros(()), torch.uint8),
    ]:
        with pytest.raises(RuntimeError) as eager:
            x.view(target)
        with pytest.raises(RuntimeError) as got:
            x.to("lazy").view(target)
        assert str(got.value) == str(eager.value)


def test_writes_through_a_view_of_another_item_size_reach_the_base():
    def widen(dev):
        x = dev(torch.ones(2, 4, dtype=torch.uint8))
        v = x.view(torch.int16)
        v[0, 1] = 0x0102
        v[1] += 1
        return x, v

    def narrow(dev):
        x = dev(torch.full((2, 3), 1.5))
        b = x.view(torch.uint8)
        b[:, 3] = 0xC0  # the sign and exponent byte of each float
        return x, b

    def int8_to_int32(dev):
        x = dev(torch.arange(-8, 8, dtype=torch.int8))
        w = x.view(torch.int32)
        w.mul_(3)
        return x, w

    for program in (widen, narrow, int8_to_int32):
        _check(program)


def test_unfold_of_a_zero_dim_tensor():
    def windows(dev):
        x = dev(torch.tensor(0.5))
        return x.unfold(0, 0, 1), x.unfold(0, 1, 1)

    def write(dev):
        x, y = dev(torch.tensor(0.5)), dev(torch.tensor(0.5))
        x.unfold(0, 0, 1).fill_(3.0)  # an empty window writes nothing
        y.unfold(0, 1, 1).fill_(3.0)
        return x, y

    _check(windows)
    _check(write)


def test_real_and_imag_assignment_reach_the_complex_tensor():
    def program(dev):
        c = dev(torch.zeros(3, dtype=torch.complex64))
        c.real = dev(torch.tensor([1.0, 2.0, 3.0]))
        c.imag = dev(torch.tensor([-1.0, 0.5, 4.0]))
        r = dev(torch.ones(2))
        r.real = dev(torch.tensor([5.0, 6.0]))  # a real tensor's .real is the tensor itself
        return c, r

    _check(program)


def test_writes_through_real_and_imag_views():
    def program(dev):
        big = dev(torch.zeros(4, dtype=torch.complex64))
        c = big[1:3]
        real, imag = c.real, c.imag
        c.real.add_(1)
        c.imag[1] = 5
        big.mul_(2)  # the views see writes to their base
        return big, c, real, imag

    _check(program)


def test_view_as_real_and_view_as_complex_share_storage():
    def program(dev):
        base = dev(torch.arange(8.0).reshape(4, 2))
        c = torch.view_as_complex(base)
        c.imag.mul_(10)
        z = dev(torch.zeros(3, dtype=torch.complex128))
        pairs = torch.view_as_real(z)
        pairs[:, 1].fill_(-1)
        pairs[0, 0] = 7
        return base, c, z, pairs

    _check(program)


def test_unsafe_view_shares_its_input_storage():
    # Composite kernels write through it (kron's out= kernel multiplies into one of its out).
    def program(dev):
        x = dev(torch.arange(6.0))
        y = torch.ops.aten._unsafe_view(x, (2, 3))
        y[1].add_(10)
        x[0] = -1
        return x, y

    _check(program)


CAT_READS = [
    # (operand shapes, cat dim, view)
    ([(2, 3), (2, 1)], -1, lambda c: c[:, -1:]),
    ([(2, 3), (2, 1)], 1, lambda c: c[:, -1]),
    ([(2, 3), (2, 2)], 1, lambda c: c[:, 3:5]),
    ([(2, 3), (2, 2)], 1, lambda c: c[:, 2:4]),  # crosses the operands
    ([(2, 3), (2, 2)], 1, lambda c: c[:, 1:]),  # crosses
    ([(2, 3), (2, 2)], 1, lambda c: c[:, ::2]),  # crosses
    ([(2, 3), (2, 4)], 1, lambda c: c[:, 4:7:2]),
    ([(2, 3), (2, 4)], 1, lambda c: c[:, -2:100]),
    ([(2, 3), (2, 4)], 1, lambda c: c[:, 5:3]),  # empty
    ([(3, 2), (1, 2), (2, 2)], 0, lambda c: c[3:5]),
    ([(3, 2), (1, 2), (2, 2)], 0, lambda c: c[3]),
    ([(3, 2), (1, 2), (2, 2)], 0, lambda c: c[-3]),
    ([(3, 2), (1, 2), (2, 2)], 0, lambda c: c.narrow(0, 0, 3)),
    ([(3, 2), (1, 2), (2, 2)], 0, lambda c: c.split([3, 1, 2])),
    ([(3, 2), (1, 2)], 0, lambda c: c[:, -1:]),  # another dimension than the cat's
    ([(2, 3), (2, 1)], 1, lambda c: c[:, -1:][:, 0]),
]


@pytest.mark.parametrize("shapes,dim,view", CAT_READS)
def test_reads_of_a_cat_match_eager(shapes, dim, view):
    def program(dev):
        parts = [
            dev(torch.arange(torch.Size(s).numel()).reshape(s) + 100 * i)
            for i, s in enumerate(shapes)
        ]
        out = view(torch.cat(parts, dim))
        return tuple(out) if isinstance(out, (tuple, list)) else out

    _check(program)


def test_cat_reads_with_promotion_a_legacy_empty_operand_and_writes_match_eager():
    def program(dev):
        a, b = dev(torch.arange(6).reshape(2, 3)), dev(torch.tensor([[7], [8]], dtype=torch.int32))
        promoted = torch.cat([a, b], 1)[:, -1:]  # b's values as int64
        legacy = torch.cat([dev(torch.arange(4.0)), dev(torch.empty(0))])[2:]
        c = torch.cat([a, a.clone()], 1)
        v = c[:, 4:6]
        v.add_(10)  # writes c, not a's clone
        w = c[:, 4:]  # read after the write
        return promoted, legacy, c, v, w, a

    _check(program)


def test_a_sequence_grown_by_cat_and_read_at_its_end_compiles_once():
    # As transformers' generate() does: each step reads the last column of the sequence, appends
    # one, and syncs a flag. The sync's graph reads the last step's column only.
    def run(dev):
        ids = dev(torch.tensor([[1, 2, 3], [4, 5, 6]]))
        flags = []
        for _ in range(6):
            last = ids[:, -1:]
            ids = torch.cat([ids, (last * 3 + 1) % 17], dim=-1)
            flags.append(bool((ids[:, -1] == 0).all()))
        return ids, flags

    expected, expected_flags = run(lambda t: t)
    lazy_torch.metrics.reset()
    got, flags = run(lambda t: t.to("lazy"))
    counters = lazy_torch.metrics.counters()
    assert flags == expected_flags
    assert_same_tensor(got, expected)
    # The first step reads the prompt itself; the rest reuse one graph, and the final read of
    # the whole sequence compiles once.
    assert counters["compiles"] <= 3, counters
