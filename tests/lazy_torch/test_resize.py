"""Resizing as eager does: out= arguments (resize, dtype, warnings, identity), resize_, resize_as_."""

import warnings

import pytest
import torch
from torch.utils._pytree import tree_flatten

import lazy_torch
from tests.lazy_torch.compare import assert_same_tensor

_RESIZED = "An output with one or more elements was resized since it had shape"


def _run(program, device):
    """``program(device)``'s result, or its exception, and the warnings it gave (text, file)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = program(device)
        except Exception as error:  # noqa: BLE001 (compared with eager's)
            result = error
    return result, [(str(w.message), w.category, w.filename) for w in caught]


def _check(program):
    """``program(device)`` on the lazy device gives what it gives on eager CPU: tensors (values,
    shapes, strides, storage offsets, dtypes), other values, errors (type and message) and
    warnings (text, category, the line they name)."""
    eager, eager_warnings = _run(program, "cpu")
    lazy, lazy_warnings = _run(program, "lazy")
    assert lazy_warnings == eager_warnings
    if isinstance(eager, Exception):
        assert type(lazy) is type(eager) and str(lazy) == str(eager)
        return eager
    assert not isinstance(lazy, Exception), lazy
    eager_leaves, eager_spec = tree_flatten(eager)
    lazy_leaves, lazy_spec = tree_flatten(lazy)
    assert lazy_spec == eager_spec
    for e, g in zip(eager_leaves, lazy_leaves):
        if not isinstance(e, torch.Tensor):
            assert g == e
            continue
        assert g.device.type == "lazy"
        assert_same_tensor(g, e)
    return eager


# ----------------------------------------------------------------------------------------------
# out= tensors of another shape are resized in place, keeping their Python objects.


def test_add_into_empty_out_resizes_it_and_returns_it():
    def program(dev):
        x = torch.ones(3, device=dev)
        out = torch.empty(0, device=dev)
        result = torch.add(x, x, out=out)
        return result is out, out

    assert _check(program)[0] is True


def test_out_with_elements_is_resized_with_eager_warning():
    def program(dev):
        out = torch.empty(2, 2, device=dev)
        torch.add(torch.ones(3, device=dev), 1, out=out)
        return out

    _check(program)
    _, caught = _run(program, "lazy")
    assert len(caught) == 1 and caught[0][0].startswith(_RESIZED)
    assert caught[0][1] is UserWarning and caught[0][2] == __file__  # the user's line


def test_ops_out_overload_returns_the_out_tensor():
    def program(dev):
        out = torch.empty(0, device=dev)
        return torch.ops.aten.add.out(torch.ones(2, device=dev), 1, out=out) is out, out

    assert _check(program)[0] is True


def test_resized_out_takes_the_strides_eager_propagates():
    def program(dev):
        x = torch.arange(120.0, device=dev).reshape(2, 3, 4, 5)
        x = x.contiguous(memory_format=torch.channels_last)
        out = torch.empty(1, device=dev)
        torch.add(x, 1, out=out)
        transposed_out = torch.empty(0, device=dev)
        torch.neg(torch.ones(3, 2, device=dev).t(), out=transposed_out)
        return out, transposed_out

    _check(program)


def test_out_of_right_shape_keeps_its_strides():
    def program(dev):
        out = torch.empty(2, 3, device=dev).t()
        torch.mul(torch.arange(6.0, device=dev).reshape(3, 2), 2, out=out)
        return out

    _check(program)


def test_out_dtypes_cast_or_refused_as_eager():
    def cast(dev):
        out = torch.empty(0, dtype=torch.float64, device=dev)
        torch.add(torch.full((3,), 0.1, device=dev), 0.2, out=out)
        return out

    def refused(dev):
        torch.add(torch.ones(3, device=dev), 1, out=torch.empty(3, dtype=torch.long, device=dev))

    def exact(dev):  # mm's out= takes no other dtype
        a = torch.ones(2, 2, device=dev)
        torch.mm(a, a, out=torch.empty(2, 2, dtype=torch.float64, device=dev))

    _check(cast)
    assert isinstance(_check(refused), RuntimeError)
    assert isinstance(_check(exact), RuntimeError)


def test_reductions_compute_in_the_out_dtype():
    # With no dtype given, sum/cumsum/prod compute in the out tensor's dtype: an integer out
    # truncates the elements first (1.5 + 1.5 -> 2, not 3).
    def program(dev):
        x = torch.tensor([[1.5, 1.5, -2.25], [0.7, 3.3, 1.0]], device=dev)
        outs = [torch.empty(0, dtype=torch.long, device=dev) for _ in range(3)]
        torch.sum(x, 0, out=outs[0])
        torch.cumsum(x, 0, out=outs[1])
        torch.prod(x, 0, out=outs[2])
        wide = torch.empty(0, dtype=torch.float64, device=dev)
        torch.sum(x, 1, out=wide)
        return outs, wide

    _check(program)


def test_softmax_out_of_another_dtype_is_refused():
    def program(dev):
        x = torch.ones(2, 3, device=dev)
        torch.softmax(x, 0, out=torch.empty(0, dtype=torch.float64, device=dev))

    assert isinstance(_check(program), RuntimeError)


# Calls that eager refuses for two reasons: one of the out tensors and one of the inputs. Some
# kernels check the out tensors first (amax's meta function, dot), others the inputs first.
REFUSED_TWICE = {
    # amax: the out's dtype before the empty reduced dim (differential program 137).
    "amax": lambda d: torch.amax(
        torch.ones(0, 3, device=d), -2, out=torch.empty(0, dtype=torch.bfloat16, device=d)
    ),
    "amin keepdim": lambda d: torch.amin(
        torch.ones(3, 0, device=d), 1, True, out=torch.empty(0, dtype=torch.long, device=d)
    ),
    # dot: the out's dtype before the inputs' dtypes, number of dims and sizes.
    "dot dtypes": lambda d: torch.dot(
        torch.ones(3, device=d),
        torch.ones(3, dtype=torch.half, device=d),
        out=torch.empty(0, dtype=torch.int32, device=d),
    ),
    "dot sizes": lambda d: torch.dot(
        torch.ones(3, device=d),
        torch.ones(2, device=d),
        out=torch.empty(0, dtype=torch.bfloat16, device=d),
    ),
    "vdot dims": lambda d: torch.vdot(
        torch.ones(3, 3, device=d),
        torch.ones(3, device=d),
        out=torch.empty(0, dtype=torch.bfloat16, device=d),
    ),
    # mm: the inputs' shapes first.
    "mm": lambda d: torch.mm(
        torch.ones(2, 3, device=d),
        torch.ones(2, 3, device=d),
        out=torch.empty(0, dtype=torch.long, device=d),
    ),
    # pow: the negative integer power first.
    "pow": lambda d: torch.pow(
        torch.ones(3, dtype=torch.long, device=d),
        -1,
        out=torch.empty(0, dtype=torch.bfloat16, device=d),
    ),
}


@pytest.mark.parametrize("name", list(REFUSED_TWICE))
def test_out_call_refused_twice_raises_eager_first_error(name):
    assert isinstance(_check(REFUSED_TWICE[name]), RuntimeError)


def test_out_on_another_device_is_refused():
    with pytest.raises(RuntimeError, match="same device"):
        torch.add(torch.ones(3, device="lazy"), 1, out=torch.empty(3))


def test_multiple_outs():
    def program(dev):
        x = torch.tensor([[3.0, 1.0], [2.0, 5.0], [4.0, 0.0]], device=dev)
        outs = (torch.empty(0, device=dev), torch.empty(7, dtype=torch.long, device=dev))
        result = torch.max(x, 0, out=outs)
        return result[0] is outs[0] and result[1] is outs[1], outs

    assert _check(program)[0] is True


def test_wrong_dtype_among_multiple_outs_is_refused():
    def program(dev):
        x = torch.ones(3, 2, device=dev)
        torch.max(x, 0, out=(torch.empty(0, device=dev), torch.empty(0, device=dev)))

    assert isinstance(_check(program), RuntimeError)


def test_list_outs():
    def split(dev):
        outs = [torch.empty(2, device=dev) for _ in range(3)]
        return torch.split_copy(torch.arange(6.0, device=dev), 2, out=outs), outs

    def split_into_empty(dev):  # eager copies without resizing: its error
        outs = [torch.empty(0, device=dev) for _ in range(3)]
        torch.split_copy(torch.arange(6.0, device=dev), 2, out=outs)

    def unbind(dev):  # eager resizes these, with one warning each
        outs = tuple(torch.empty(5, device=dev) for _ in range(3))
        torch.unbind_copy(torch.arange(6.0, device=dev).reshape(3, 2), out=outs)
        return outs

    assert _check(split)[0] is None
    assert isinstance(_check(split_into_empty), RuntimeError)
    _check(unbind)
    assert len(_run(unbind, "lazy")[1]) == 3


def test_nonzero_out():
    def empty(dev):
        out = torch.empty(0, dtype=torch.long, device=dev)
        result = torch.nonzero(torch.tensor([0.0, 1.0, 2.0, 0.0, 3.0], device=dev), out=out)
        return result is out, out

    def with_elements(dev):
        out = torch.empty(2, 2, dtype=torch.long, device=dev)
        torch.nonzero(torch.tensor([[0.0, 1.0], [2.0, 3.0]], device=dev), out=out)
        return out

    def float_out(dev):
        torch.nonzero(torch.ones(3, device=dev), out=torch.empty(0, device=dev))

    assert _check(empty)[0] is True
    _check(with_elements)
    assert isinstance(_check(float_out), RuntimeError)


def test_factory_out():
    def program(dev):
        out = torch.empty(2, device=dev)
        result = torch.arange(5, out=out)
        return result is out, out

    assert _check(program)[0] is True


def test_resized_view_out_keeps_writing_into_its_storage():
    def within(dev):  # the resized view still lies in its base: the base sees the result
        base = torch.zeros(6, device=dev)
        view = base[1:3]
        torch.neg(torch.ones(3, device=dev), out=view)
        return base, view

    def beyond(dev):  # the storage grows; the base sees the part it still holds
        base = torch.zeros(4, device=dev)
        view = base[2:4]
        torch.neg(torch.ones(3, device=dev), out=view)
        return base, view

    def shrunk(dev):  # other views of a resized out tensor see what it holds
        out = torch.zeros(2, 3, device=dev)
        row = out[0]
        torch.add(torch.ones(4, device=dev), 1, out=out)
        return out, row

    _check(within)
    _check(beyond)
    _check(shrunk)


def test_composite_out_kernel_writes_through_unsafe_view():
    # kron's out= kernel resizes the out tensor and multiplies into an _unsafe_view of it.
    def program(dev):
        a = torch.arange(4.0, device=dev).reshape(2, 2)
        b = torch.tensor([[1.0, -1.0], [2.0, 0.5]], device=dev)
        out = torch.empty(0, device=dev)
        torch.kron(a, b, out=out)
        return out

    _check(program)


def test_repeated_calls_replay_the_remembered_answer():
    def program(dev):
        outs = []
        for _ in range(3):
            out = torch.empty(1, device=dev)
            outs.append(torch.add(torch.ones(2, device=dev), 1, out=out))
        return outs

    _check(program)
    assert len(_run(program, "lazy")[1]) == 3


def test_zeros_that_eager_refuses_ask_eager_with_the_values():
    # cholesky of the zero stand-ins fails; the real input is positive definite.
    def program(dev):
        a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], device=dev)
        out = torch.empty(1, device=dev)
        torch.linalg.cholesky(a, out=out)
        return out

    _check(program)


def test_out_call_eager_warns_then_refuses_raises_with_the_warning():
    # cumsum resizes its bool out (a warning), then refuses the dtype. Asking eager gave a
    # SystemError instead once any warning had come from the stand-in call before (here clamp's,
    # differential seeds 100147 then 100152): the warning was issued with the error set.
    def program(dev):
        torch.clamp(torch.ones(2, 0, device=dev), min=1.5, out=torch.zeros(1, device=dev))
        x = torch.ones(32, dtype=torch.float16, device=dev)
        torch.cumsum(x, 0, out=torch.zeros(2, dtype=torch.bool, device=dev))

    for _ in range(2):
        assert isinstance(_check(program), NotImplementedError)


# ----------------------------------------------------------------------------------------------
# resize_ and resize_as_.


def test_resize_as_takes_a_template_on_any_device():
    def program(dev):
        x = torch.zeros(3, 2, device=dev).resize_as_(torch.empty(2, 3))
        y = torch.zeros(3, 2, device=dev).resize_as_(torch.empty(4, 1, device=dev))
        return x.shape, y.shape

    _check(program)


def test_resize_as_memory_format():
    def program(dev):
        template = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
        x = torch.zeros(1, 2, 3, 4, device=dev)
        x.resize_as_(template, memory_format=torch.preserve_format)
        return x.shape, x.stride()

    _check(program)


def test_resize_keeps_elements_in_memory_order():
    def program(dev):
        same = torch.arange(6.0, device=dev).reshape(2, 3).resize_(3, 2)
        fewer = torch.arange(6.0, device=dev).reshape(2, 3).resize_(2)
        strided = torch.arange(6.0, device=dev).reshape(2, 3).t().resize_(2, 3)
        more = torch.arange(6.0, device=dev).reshape(2, 3).resize_(4, 2)
        channels = torch.arange(24.0, device=dev).resize_(1, 2, 3, 4)
        channels.resize_(2, 1, 3, 4, memory_format=torch.channels_last)
        return same, fewer, strided, more[:3], (more.shape, more.stride()), channels

    _check(program)


def test_resize_shares_the_storage_with_views():
    def program(dev):
        base = torch.arange(6.0, device=dev)
        head = base[:3]
        base.resize_(2, 2)
        base.fill_(7)
        tail = torch.arange(6.0, device=dev)
        window = tail[2:4]
        window.resize_(3)
        window.fill_(-1)
        return base, head, tail, window

    _check(program)


def test_resize_errors_as_eager():
    def program(dev):
        torch.zeros(3, device=dev).resize_(-1)

    assert isinstance(_check(program), RuntimeError)


def test_out_warning_is_given_once_per_call_site_as_eager():
    # Under the default filter eager warns once per line: the warning names the user's line.
    def program(dev):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(3):
                torch.add(torch.ones(3, device=dev), 1, out=torch.empty(1, device=dev))
            torch.add(torch.ones(3, device=dev), 1, out=torch.empty(1, device=dev))
        return [(w.filename, w.lineno) for w in caught]

    eager = program("cpu")
    assert len(eager) == 2
    assert program("lazy") == eager
    lazy_torch.mark_step()


@pytest.mark.parametrize("kwargs", [{}, {"atol": 0.5}, {"hermitian": True}, {"tol": 1e-5}])
@pytest.mark.parametrize("inference", [False, True])
def test_matrix_rank_out_is_written(kwargs, inference):
    # Its composite out= kernel computed the rank without writing it: out kept its old value.
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    a[3] = a[2]
    a = a @ a.T if kwargs.get("hermitian") else a

    def program(device):
        out = torch.full((), -1, dtype=torch.long, device=device)
        with torch.inference_mode(inference):
            tol = {"tol": kwargs["tol"]} if "tol" in kwargs else {}
            rest = {k: v for k, v in kwargs.items() if k != "tol"}
            result = torch.linalg.matrix_rank(a.to(device), *tol.values(), out=out, **rest)
        assert result is out
        return out

    _check(program)


def test_out_made_outside_inference_mode_is_resized_inside_it():
    def program(device):
        x = torch.arange(3.0, device=device)
        out, view_out = torch.empty(0, device=device), torch.zeros(2, 1, device=device)
        with torch.inference_mode():
            torch.add(x, x, out=out)
            view_out.squeeze_()
        return out, view_out, out.is_inference()

    _check(program)
