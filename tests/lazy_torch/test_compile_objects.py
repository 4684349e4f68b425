"""Objects given to a lazy_torch.compile'd call (guards.arguments): a KV cache object holding lazy
tensors is read through, its tensors are arguments of the capture, writes into them are
replayed, and a result holding it returns the object each replay is given. Each case against
eager CPU over several calls and several cache objects."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import lazy_torch
from tests.lazy_torch.compiling import assert_same, call_nodes, compile_warnings, counter

LENGTH, WIDTH = 6, 3


class Layer:
    def __init__(self, device: str) -> None:
        self.keys = torch.zeros(LENGTH, WIDTH, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)


class Cache:
    """A static KV cache: fixed buffers written in place, as transformers' ``StaticCache``."""

    def __init__(self, device: str, scale: object = 1.0) -> None:
        self.layers = [Layer(device), Layer(device)]
        self.scale = scale
        self.kind = "static"


class Decoder(nn.Module):
    def __init__(self, grow: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.grow = grow

    def forward(self, x: torch.Tensor, cache: Cache) -> dict:
        for layer in cache.layers:
            y = self.lin(x) * cache.scale
            if self.grow:  # a dynamic cache: a new tensor set on the object
                layer.keys = torch.cat([layer.keys[1:], y])
            else:
                layer.keys.index_copy_(0, layer.position.view(1), y)
            layer.position.add_(1)
            x = x + layer.keys.sum(0, keepdim=True)
        return {"out": x, "cache": cache}


def _decode(model: nn.Module, device: str, caches: int, steps: int, edit=None) -> list:
    """Outputs and cache states of ``steps`` calls with each of ``caches`` fresh caches."""
    got = []
    g = torch.Generator().manual_seed(0)
    for _ in range(caches):
        cache = Cache(device)
        for step in range(steps):
            if edit is not None:
                edit(cache, step, device)
            result = model(torch.randn(1, WIDTH, generator=g).to(device), cache)
            assert result["cache"] is cache
            state = [t for layer in cache.layers for t in vars(layer).values()]
            got.append([result["out"], *state])
            if device == "lazy":
                got[-1].append(call_nodes(result["out"]))
                lazy_torch.mark_step()
    return got


def _compare(model: nn.Module, edit=None, caches: int = 2, steps: int = 4) -> list:
    """The compiled model's calls on lazy equal the model's on the CPU; their call nodes."""
    with torch.no_grad():
        eager = _decode(model, "cpu", caches, steps, edit)
    lazy = lazy_torch.compile(copy.deepcopy(model).to("lazy"))
    with torch.no_grad():
        got = _decode(lazy, "lazy", caches, steps, edit)
    for a, b in zip(got, eager, strict=True):
        for x, y in zip(a, b):
            assert_same(x, y)
            assert x.dtype == y.dtype
    return [row[-1] for row in got]


def test_a_cache_written_in_place_replays_with_every_cache_object(recwarn):
    before = counter("captures")
    calls = _compare(Decoder())
    assert counter("captures") - before == 1  # one capture serves both caches
    assert calls == [1] * 8  # the capture's result is a replay's too
    assert compile_warnings(recwarn.list) == []


def test_a_replay_reads_the_tensor_the_object_holds_now():
    def swap(cache: Cache, step: int, device: str) -> None:
        if step == 2:  # the user puts another tensor of the same layout in the cache
            cache.layers[0].keys = torch.full((LENGTH, WIDTH), 0.5, device=device)

    _compare(Decoder(), swap)


@pytest.mark.parametrize("scales", [(2, 2.0, True), (1.0, -0.0, 0.0)])
def test_a_plain_attribute_of_the_object_is_guarded_type_exact(scales):
    def rescale(cache: Cache, step: int, device: str) -> None:
        cache.scale = scales[step % len(scales)]

    before = counter("captures")
    _compare(Decoder(), rescale, caches=1, steps=6)
    assert counter("captures") - before == len(scales)


def test_a_call_that_sets_a_tensor_on_the_object_runs_op_by_op():
    with pytest.warns(UserWarning, match=r"changes an object it is given"):
        calls = _compare(Decoder(grow=True))
    assert calls == [0] * 8


def test_the_compiled_forward_keeps_its_signature():
    # transformers' generate() drops an all-ones attention mask only if the forward takes one
    model = lazy_torch.compile(Decoder().to("lazy"))
    assert inspect.signature(model.forward) == inspect.signature(Decoder().forward)
    copied = copy.deepcopy(model)
    assert copied.forward.__self__ is copied and lazy_torch.compile(copied) is copied


def test_a_cpu_tensor_the_call_reads_inside_the_object_runs_it_op_by_op():
    def rescale(cache: Cache, step: int, device: str) -> None:
        cache.scale = torch.tensor(float(step + 1))  # on the CPU, as CUDA accepts a 0-d one

    with pytest.warns(UserWarning, match=r"cpu tensor of shape \(\) that existed before it"):
        calls = _compare(Decoder(), rescale, caches=1, steps=4)
    assert calls == [0] * 4


class SlottedCache(Cache):
    """Its tensors in a slot, out of ``__dict__``'s sight: guarded by identity."""

    __slots__ = ("extra",)

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self.extra = torch.ones(1, WIDTH, device=device)


def test_an_object_with_slots_is_guarded_by_identity():
    class Reads(Decoder):
        def forward(self, x: torch.Tensor, cache: Cache) -> dict:
            return super().forward(x + cache.extra, cache)

    torch.manual_seed(0)
    model = Reads()
    lazy = lazy_torch.compile(copy.deepcopy(model).to("lazy"))
    x = torch.randn(1, WIDTH)
    with torch.no_grad():
        for k in range(3):
            eager_cache, lazy_cache = SlottedCache("cpu"), SlottedCache("lazy")
            eager_cache.extra.fill_(k)
            lazy_cache.extra.fill_(k)
            assert_same(lazy(x.to("lazy"), lazy_cache)["out"], model(x, eager_cache)["out"])
