"""GPT-2, Llama and BERT (transformers, tiny configs) train on device='lazy' as on eager CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parametrize

from tests.models.common import check_training, tokens

transformers = pytest.importorskip("transformers")

STEPS = 5
VOCAB = 128
BATCH = 2
SEQ = 16


def _causal_lm(m, b):
    return m(input_ids=b, labels=b).loss


class _ZeroKeyBias(torch.nn.Module):
    """Parametrization of GPT-2's fused q/k/v bias that pins its key third to zero.

    A key bias adds ``q . b`` to every score of a query's row, which softmax ignores: its true
    gradient is 0 (~1e-19 in float64) and float32 leaves ~5e-11 of rounding noise, which AdamW
    turns into steps of ~lr * noise / eps that differ between any two correct implementations.
    Masking it makes that gradient exactly 0 in both runs without changing what the model computes.
    """

    def __init__(self, embed: int):
        super().__init__()
        mask = torch.ones(3 * embed)
        mask[embed : 2 * embed] = 0
        self.register_buffer("mask", mask)

    def forward(self, bias: torch.Tensor) -> torch.Tensor:
        return bias * self.mask


def gpt2():
    """GPT-2 with its LM head tied to the token embedding (a separate copy on lazy once made
    step 2's loss differ by 1e-4 and step 4's by 1.2e-3), key bias pinned (``_ZeroKeyBias``)."""
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    for block in model.transformer.h:
        parametrize.register_parametrization(block.attn.c_attn, "bias", _ZeroKeyBias(64))
    return model, tokens(STEPS, BATCH, SEQ, VOCAB), _causal_lm


def llama():
    """Llama with grouped-query attention (2 key/value heads shared by 4 query heads), RoPE."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        attention_dropout=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    return model, tokens(STEPS, BATCH, SEQ, VOCAB), _causal_lm


def _masked_batches(mask_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs with ~15% of positions replaced by ``mask_id``; labels -100 elsewhere."""
    g = torch.Generator().manual_seed(1)
    batches = []
    for ids in tokens(STEPS, BATCH, SEQ, VOCAB):
        masked = torch.rand(ids.shape, generator=g) < 0.15
        batches.append((ids.masked_fill(masked, mask_id), ids.masked_fill(~masked, -100)))
    return batches


def bert():
    """BERT masked LM: the loss only sees the masked positions (labels -100 elsewhere)."""
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config)
    return (
        model,
        _masked_batches(mask_id=VOCAB - 1),
        lambda m, b: m(input_ids=b[0], labels=b[1]).loss,
    )


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_trains_like_eager(name):
    model, batches, loss_fn = MODELS[name]()
    run = check_training(model, batches, loss_fn)
    assert run.fallbacks == {}, run.fallbacks
