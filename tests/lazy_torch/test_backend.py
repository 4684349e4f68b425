"""The backend's tables (lazy_torch/backend.py): one object holds the handler table and the
memos, and the dispatch in C and in Python read the same ones."""

import torch

from lazy_torch import dispatch, recording
from lazy_torch.backend import BACKEND

aten = torch.ops.aten


def test_handlers_plans_and_memos_live_in_the_backend():
    x = torch.randn(5, 7, device="lazy")
    before = BACKEND.sizes()
    y = torch.sinh(x)
    assert dispatch.handler_of(aten.sinh.default) is dispatch.recorded
    assert BACKEND.handlers[id(aten.sinh.default)] is dispatch.recorded
    plan = BACKEND.plans[id(aten.sinh.default)]
    assert plan is recording.plan_of(aten.sinh.default)
    key = recording.memo_key(aten.sinh.default, (x,), {})
    meta, template = BACKEND.meta_cache[key]
    assert meta == y._meta and template is y._lazy.node.arg
    view = x.t()
    view_key = recording.view_key(aten.t.default, (x,), {})
    assert BACKEND.view_cache[view_key][0] == view._meta
    after = BACKEND.sizes()
    assert set(after) == {"handlers", "plans", "meta_cache", "view_cache"}
    assert all(after[k] >= before[k] for k in after)


def test_a_fresh_shape_memo_is_filled_again_by_the_c_dispatch(monkeypatch):
    x = torch.randn(3, 2, device="lazy")
    x * 2.5  # memoized
    monkeypatch.setattr(BACKEND, "meta_cache", {})
    recording.configure(dispatch.dispatch)
    try:
        y = x * 3.5
        assert len(BACKEND.meta_cache) == 1
        (key, (meta, _)), = BACKEND.meta_cache.items()
        assert key[0] == "aten.mul.Tensor" and meta == y._meta
    finally:
        monkeypatch.undo()
        recording.configure(dispatch.dispatch)
    torch.testing.assert_close(y.cpu(), x.cpu() * 3.5)
