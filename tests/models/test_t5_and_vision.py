"""T5, ViT and ResNet (transformers, tiny configs) train on device='lazy' as on eager CPU."""

from __future__ import annotations

import pytest
import torch

from tests.models.common import check_training, tokens

transformers = pytest.importorskip("transformers")

STEPS = 5
VOCAB = 128


def t5():
    """T5 encoder-decoder with tied embeddings (shared, both stacks' embed_tokens, lm_head)."""
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    inputs = tokens(STEPS, 2, 16, VOCAB, seed=0)
    labels = tokens(STEPS, 2, 12, VOCAB, seed=1)
    return model, list(zip(inputs, labels)), lambda m, b: m(input_ids=b[0], labels=b[1]).loss


def _images(batch: int, classes: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, 3, 32, 32, generator=g),
            torch.randint(0, classes, (batch,), generator=g),
        )
        for _ in range(STEPS)
    ]


def _classify(m, b):
    return m(pixel_values=b[0], labels=b[1]).loss


def vit():
    """ViT on 32x32 images, 8x8 patches.

    Without q/k/v biases: the key bias cannot change softmax(q k^T), so its true gradient is 0
    (~1e-19 in float64) and AdamW turns its float32 rounding noise (~1e-10) into steps that
    differ between any two correct implementations.
    """
    config = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        qkv_bias=False,
        num_labels=10,
    )
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(config), _images(4, 10), _classify


def resnet():
    """ResNet with batch norm in training mode: running statistics are compared too."""
    config = transformers.ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        layer_type="basic",
        num_labels=10,
    )
    torch.manual_seed(0)
    return transformers.ResNetForImageClassification(config), _images(4, 10), _classify


@pytest.mark.slow
@pytest.mark.parametrize("build", [t5, vit, resnet], ids=lambda f: f.__name__)
def test_trains_like_eager(build):
    model, batches, loss_fn = build()
    run = check_training(model, batches, loss_fn)
    assert run.compiles[:2] == [1, 1], run.compiles
    assert run.fallbacks == {}, run.fallbacks
