"""torch.save/torch.load and copy.deepcopy of lazy tensors, parameters and modules, against eager.

Eager reloads a CUDA tensor as it was saved: a parameter as a parameter, on its device (or where
``map_location`` says), with its strides and storage offset, and tensors that shared a storage
share one again. The oracle here is eager CPU PyTorch saving and loading the same objects.
"""

import copy
import io
import pickle
import subprocess
import sys
import zipfile

import pytest
import torch

import lazy_torch
from lazy_torch._dtypes import DTYPE_NAMES
from lazy_torch.tensor import LazyTensor
from tests.lazy_torch.compare import assert_same_tensor

LAZY = lazy_torch.device()


def _saved(obj, **save_kwargs) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer, **save_kwargs)
    buffer.seek(0)
    return buffer


def _round_trip(obj, save_kwargs=None, **load_kwargs):
    return torch.load(_saved(obj, **(save_kwargs or {})), **load_kwargs)


def _assert_like_eager(got: dict, want: dict, device: str) -> None:
    """Each of ``got``'s tensors is on ``device`` and is its eager twin in ``want``."""
    assert got.keys() == want.keys()
    for key, expected in want.items():
        assert got[key].device.type == device, key
        assert got[key].requires_grad == expected.requires_grad, key
        assert_same_tensor(got[key].detach(), expected.detach())


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_a_parameter_reloads_as_a_parameter(requires_grad, weights_only):
    eager = torch.nn.Parameter(torch.randn(3, 2), requires_grad=requires_grad)
    lazy = torch.nn.Parameter(eager.detach().to("lazy"), requires_grad=requires_grad)
    expected = _round_trip(eager, weights_only=weights_only)
    loaded = _round_trip(lazy, weights_only=weights_only)
    on_cpu = _round_trip(lazy, weights_only=weights_only, map_location="cpu")
    assert type(expected) is type(on_cpu) is torch.nn.Parameter
    # A lazy parameter is what nn.Parameter makes of a lazy tensor.
    assert type(loaded) is LazyTensor and isinstance(loaded, torch.nn.Parameter)
    assert loaded.device == LAZY and on_cpu.device.type == "cpu"
    for got in (loaded, on_cpu):
        assert got.requires_grad == expected.requires_grad == requires_grad
        assert got.is_leaf
        assert_same_tensor(got.detach(), expected.detach())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 4)
    )
    model[3].weight = model[0].weight  # tied, as embeddings and LM heads are
    model[3].bias.requires_grad_(False)
    model.train()(torch.randn(8, 4))  # running statistics that differ from their initial values
    return model


def test_a_whole_module_reloads_as_eagers():
    eager = _model()
    lazy = copy.deepcopy(eager).to("lazy")
    expected = _round_trip(eager, weights_only=False)
    x = torch.randn(5, 4)
    for kwargs, device in (({"map_location": "cpu"}, "cpu"), ({}, "lazy")):
        loaded = _round_trip(lazy, weights_only=False, **kwargs)
        params = dict(loaded.named_parameters(remove_duplicate=False))
        want = dict(expected.named_parameters(remove_duplicate=False))
        assert params.keys() == want.keys()
        for name, p in params.items():
            assert isinstance(p, torch.nn.Parameter), name
            assert (type(p) is torch.nn.Parameter) == (device == "cpu"), name
        _assert_like_eager(params, want, device)
        _assert_like_eager(dict(loaded.named_buffers()), dict(expected.named_buffers()), device)
        assert loaded[3].weight is loaded[0].weight  # still tied
        out = loaded.eval()(x.to(device))
        torch.testing.assert_close(out.detach().cpu(), expected.eval()(x))
    # The reloaded lazy module (the last one) trains, its tied weight collecting both uses'
    # gradients.
    loaded.train()(x.to("lazy")).sum().backward()
    expected.train()(x).sum().backward()
    torch.testing.assert_close(loaded[0].weight.grad.cpu(), expected[0].weight.grad)
    assert loaded[3].bias.grad is None


def test_a_state_dict_loads_under_weights_only_with_its_ties():
    eager, lazy = _model(), _model().to("lazy")
    for kwargs, device in (({}, "lazy"), ({"map_location": "cpu"}, "cpu")):
        loaded = _round_trip(lazy.state_dict(), weights_only=True, **kwargs)
        expected = _round_trip(eager.state_dict(), weights_only=True)
        _assert_like_eager(loaded, expected, device)
        # The two entries of the tied weight share their storage, as eager's do.
        loaded["3.weight"][0, 0] = 100.0
        assert loaded["0.weight"][0, 0].item() == 100.0
        fresh = _model().to(device)
        fresh.load_state_dict(loaded)
        assert fresh[0].weight.device.type == device


_CPU_LOCATIONS = {
    "string": "cpu",
    "device": torch.device("cpu"),
    "dict": {"lazy:0": "cpu"},
    "callable keeping the CPU storage": lambda storage, location: storage,
}
_LAZY_LOCATIONS = {
    "none": None,
    "string": "lazy",
    "indexed string": "lazy:0",
    "device": torch.device("lazy", 0),
    "dict of another tag": {"cuda:0": "cpu"},
    "callable deferring": lambda storage, location: None,
}


@pytest.mark.parametrize(
    "map_location, device",
    [(v, "cpu") for v in _CPU_LOCATIONS.values()] + [(v, "lazy") for v in _LAZY_LOCATIONS.values()],
    ids=[f"cpu-{k}" for k in _CPU_LOCATIONS] + [f"lazy-{k}" for k in _LAZY_LOCATIONS],
)
def test_map_location_in_every_form_torch_takes(map_location, device):
    def tensors(device):
        return {
            "w": torch.nn.Parameter(torch.arange(6.0, device=device).view(3, 2)),
            "t": torch.arange(6.0, device=device).view(2, 3).t(),
        }

    eager, lazy = tensors("cpu"), tensors("lazy")
    loaded = _round_trip(lazy, map_location=map_location)
    expected = _round_trip(eager)
    _assert_like_eager(loaded, expected, device)
    assert isinstance(loaded["w"], torch.nn.Parameter)


def test_a_callable_map_location_sees_the_cpu_storage_and_the_lazy_tag():
    seen = []

    def where(storage, location):
        seen.append((storage.device.type, location))
        return storage.to(device="cpu")

    loaded = _round_trip([torch.ones(2, device="lazy")], map_location=where)
    assert seen == [("cpu", "lazy:0")] and loaded[0].device.type == "cpu"


def test_a_device_index_out_of_range_gives_eagers_error():
    index = lazy_torch.device_count()
    with pytest.raises(RuntimeError, match=f"LAZY device {index} but torch.lazy.device_count()"):
        _round_trip(torch.ones(2, device="lazy"), map_location=f"lazy:{index}")


def _views(base: torch.Tensor) -> dict:
    grid = base.view(4, 6)
    return {
        "base": base,
        "transposed": grid.t(),
        "offset": grid[1:3, 2:],
        "row": grid[2],
        "expanded": grid[:, :1].expand(4, 3),
        "strided": base[1::5],
        "scalar": base[7],
    }


@pytest.mark.parametrize("kwargs", [{}, {"weights_only": True}, {"map_location": "cpu"}])
def test_views_and_shared_storages_stay_shared(kwargs):
    eager = _round_trip(_views(torch.arange(24.0)))
    loaded = _round_trip(_views(torch.arange(24.0, device="lazy")), **kwargs)
    device = "cpu" if kwargs.get("map_location") == "cpu" else "lazy"
    _assert_like_eager(loaded, eager, device)
    # One storage: a write through the base, or through a view, reaches every other view.
    for got in (loaded, eager):
        got["base"].mul_(-1)
        got["offset"].add_(1000)
    _assert_like_eager(loaded, eager, device)


def test_storages_of_strided_results_keep_their_layout():
    # Results (not views) with eager's non-contiguous strides, and views of them, saved together
    # and one at a time.
    def tensors(x):
        root = x.permute(2, 0, 1) * 2
        return {"root": root, "slice": root[1:], "column": root[:, 0], "swapped": root.mT}

    x = torch.randn(2, 3, 4)
    eager, lazy = tensors(x), tensors(x.to("lazy"))
    assert eager["root"].stride() == (1, 12, 4)
    _assert_like_eager(_round_trip(lazy), _round_trip(eager), "lazy")
    for key in eager:
        _assert_like_eager(_round_trip({key: lazy[key]}), _round_trip({key: eager[key]}), "lazy")
    channels_last = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    loaded = _round_trip(channels_last.to("lazy").add(1))
    assert_same_tensor(loaded, _round_trip(channels_last.add(1)))


def test_small_and_empty_tensors():
    def tensors(device):
        return {
            "zero_dim": torch.tensor(2.5, device=device),
            "empty": torch.empty(0, 3, device=device),
            "expanded_scalar": torch.tensor(5, device=device).expand(3, 2),
        }

    for kwargs, device in (({}, "lazy"), ({"map_location": "cpu"}, "cpu")):
        loaded = _round_trip(tensors("lazy"), weights_only=True, **kwargs)
        _assert_like_eager(loaded, _round_trip(tensors("cpu")), device)


@pytest.mark.parametrize("dtype", list(DTYPE_NAMES), ids=str)
def test_every_dtype_of_the_backend(dtype):
    values = torch.arange(6.0).view(2, 3) * 1.5
    if dtype.is_complex:
        values = torch.complex(values, -values)
    eager, lazy = values.to(dtype), values.to(dtype).to("lazy")
    expected = _round_trip({"t": eager.t(), "row": eager[1]})
    lazy = {"t": lazy.t(), "row": lazy[1]}
    for kwargs, device in (({}, "lazy"), ({"map_location": "cpu"}, "cpu")):
        _assert_like_eager(_round_trip(lazy, weights_only=True, **kwargs), expected, device)


def test_plain_tensors_keep_requires_grad_and_load_as_leaves():
    def tensors(device):
        leaf = torch.tensor([1.5, -2.0, 0.25], device=device, requires_grad=True)
        return {"leaf": leaf, "result": leaf * 2, "plain": leaf.detach() + 1}

    expected = _round_trip(tensors("cpu"))
    for kwargs, device in (({}, "lazy"), ({"map_location": "cpu"}, "cpu")):
        loaded = _round_trip(tensors("lazy"), weights_only=True, **kwargs)
        _assert_like_eager(loaded, expected, device)
        for key, t in loaded.items():
            assert t.is_leaf and t.grad_fn is None and expected[key].is_leaf
    (loaded["result"] * loaded["leaf"]).sum().backward()
    assert loaded["leaf"].grad is not None and loaded["result"].grad is not None


def test_a_view_of_another_dtype_saves_as_eagers():
    torch.manual_seed(0)
    eager = torch.randn(3, dtype=torch.complex64)
    lazy = eager.to("lazy")
    assert_same_tensor(_round_trip(lazy.imag), _round_trip(eager.imag))
    for z in (eager, lazy):  # both views of one storage as two dtypes: eager refuses
        with pytest.raises(RuntimeError, match="view the same data as different types"):
            torch.save([z, z.imag], io.BytesIO())


def test_a_save_after_an_update_sees_the_update():
    t = torch.zeros(4, device="lazy")
    view = t[1:]
    first = _round_trip([t, view])
    t.add_(1)  # pending, not synced
    second = _round_trip([t, view])
    assert first[0].tolist() == [0.0] * 4 and first[1].tolist() == [0.0] * 3
    assert second[0].tolist() == [1.0] * 4 and second[1].tolist() == [1.0] * 3


def test_plain_pickle_and_the_legacy_format():
    eager = _views(torch.arange(24.0))
    lazy = _views(torch.arange(24.0, device="lazy"))
    param = torch.nn.Parameter(torch.randn(2, 2, device="lazy"))
    legacy = {"_use_new_zipfile_serialization": False}
    got = _round_trip(lazy, save_kwargs=legacy)
    _assert_like_eager(got, _round_trip(eager, save_kwargs=legacy), "lazy")
    got["base"].mul_(-1)  # legacy files keep sharing, as eager's do
    assert got["row"].tolist() == [-v for v in range(12, 18)]
    loaded = _round_trip(param, save_kwargs=legacy)
    assert isinstance(loaded, torch.nn.Parameter) and loaded.requires_grad
    assert torch.equal(loaded.detach().cpu(), param.detach().cpu())
    # Plain pickle (multiprocessing-free copies, caches): values, strides and Parameter-ness.
    _assert_like_eager(pickle.loads(pickle.dumps(lazy)), pickle.loads(pickle.dumps(eager)), "lazy")
    unpickled = pickle.loads(pickle.dumps(param))
    assert isinstance(unpickled, torch.nn.Parameter) and unpickled.device == LAZY


def test_a_file_loads_with_map_location_cpu_where_lazy_torch_is_not_imported(tmp_path):
    path = tmp_path / "saved.pt"
    lazy = {"w": torch.nn.Parameter(torch.arange(6.0, device="lazy").view(2, 3))}
    lazy["t"] = lazy["w"].detach().t()
    torch.save(lazy, path)
    with zipfile.ZipFile(path) as archive:
        pickled = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    assert b"lazy_torch" not in pickled  # only PyTorch's own rebuild functions
    script = (
        "import sys, torch\n"
        f"d = torch.load({str(path)!r}, weights_only=True, map_location='cpu')\n"
        "assert 'lazy_torch' not in sys.modules\n"
        "print(repr((type(d['w']).__name__, d['t'].stride(), d['t'].tolist())))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(("Parameter", (1, 3), [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]))


def test_deepcopy_keeps_parameters_ties_and_shared_storages():
    eager = _model()
    lazy = copy.deepcopy(eager).to("lazy")
    copied = copy.deepcopy(lazy)
    for (name, p), q in zip(lazy.named_parameters(), copied.parameters()):
        assert isinstance(q, torch.nn.Parameter) and q.requires_grad == p.requires_grad, name
        assert q is not p and q.device == LAZY
        assert_same_tensor(q.detach(), p.detach().cpu())
    assert copied[3].weight is copied[0].weight
    with torch.no_grad():
        lazy[0].weight.add_(1)  # the copy has its own values
    assert_same_tensor(copied[0].weight.detach(), eager[0].weight.detach())
    param = torch.nn.Parameter(torch.randn(3, device="lazy"))
    param_copy = copy.deepcopy(param)
    assert isinstance(param_copy, torch.nn.Parameter) and param_copy.requires_grad
    assert torch.equal(param_copy.detach().cpu(), param.detach().cpu())
    # Views copied together stay views of one copied storage, with their strides, as eager's.
    want = copy.deepcopy(_views(torch.arange(24.0)))
    got = copy.deepcopy(_views(torch.arange(24.0, device="lazy")))
    _assert_like_eager(got, want, "lazy")
    for views in (got, want):
        views["base"].mul_(-1)
    _assert_like_eager(got, want, "lazy")
