"""Training loops on device='lazy' against eager CPU: losses, parameters and compile counts."""

import pytest
import torch

import lazy_torch
from tests.lazy_torch.models import SmallCNN, data, mlp, train


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_training_matches_eager(kind, optimizer):
    torch.manual_seed(0)
    model = mlp() if kind == "mlp" else SmallCNN()
    batches = data(kind, steps=20)
    eager_losses, eager_state = train(model, batches, optimizer, "cpu")

    compiles, hits = [], []

    def record():
        counters = lazy_torch.metrics.counters()
        compiles.append(counters.get("compiles", 0))
        hits.append(counters.get("cache_hits", 0))

    lazy_losses, lazy_state = train(model, batches, optimizer, "lazy", on_step=record)

    torch.testing.assert_close(
        torch.tensor(lazy_losses), torch.tensor(eager_losses), rtol=1e-4, atol=1e-5
    )
    for name, value in eager_state.items():
        got = lazy_state[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        torch.testing.assert_close(got, value, rtol=1e-4, atol=1e-5, msg=name)
    # After two warm-up steps every step reuses its executable: no compile, one more cache hit.
    assert compiles[2:] == [compiles[1]] * (len(compiles) - 2), compiles
    assert [b - a for a, b in zip(hits[1:], hits[2:])] == [1] * (len(hits) - 2), hits
