"""``lazy_torch.generate``: autoregressive decoding with a bounded number of compiles.

A decoding loop whose sequence grows by a token per step records a graph of a new shape per
token, so a lazy backend compiles once per length. ``generate`` keeps every shape fixed instead:
the tokens live in a buffer padded to a length bucket (the next power of two, at most the model's
positions), the position being written is a device scalar, and each step runs the model over the
whole buffer. A causal model's logits at position ``p`` depend only on tokens up to ``p``, so the
padding after the written positions changes nothing. Every step is the same program: one compile
per (batch size, bucket), so compiles grow with the logarithm of the length, and no step syncs
unless ``eos_token_id`` is given (then one sync every ``check_every`` tokens asks whether every
sequence has finished).

The price is work: each step runs the full bucket, not one token against a KV cache. For long
generations of large models, a static KV cache (transformers' ``cache_implementation="static"``)
does less work per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lazy_torch import sync as _sync
from lazy_torch.capture import compile_session


def _logits_of(out: Any) -> torch.Tensor:
    """A model's logits: ``out.logits`` (transformers), ``out[0]`` (nanoGPT's ``(logits, loss)``)
    or ``out`` itself."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _positions(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings", "block_size"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def bucket_length(total: int, limit: int | None) -> int:
    """The padded length for ``total`` tokens: the next power of two, at most ``limit``."""
    length = 1 << max(total - 1, 0).bit_length()
    if limit is not None:
        if total > limit:
            raise ValueError(
                f"generate: {total} tokens (prompt and new ones) exceed the model's {limit} "
                "positions"
            )
        length = min(length, limit)
    return length


def _next_token(
    logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None
) -> torch.Tensor:
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # The Gumbel-max trick: argmax(logits + Gumbel noise) is a draw from softmax(logits).
    uniform = torch.rand(logits.shape, device=logits.device).clamp_(1e-20, 1.0)
    return (logits - torch.log(-torch.log(uniform))).argmax(-1)


def generate(
    model: Callable,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    check_every: int = 8,
    bucket: bool = True,
) -> torch.Tensor:
    """Append up to ``max_new_tokens`` tokens to each row of ``input_ids`` (``(batch, prompt)``
    int64, on the lazy device or the CPU) with ``model`` (a causal LM: transformers' or any
    module returning logits ``(batch, length, vocab)``), greedy or sampled (``temperature``,
    ``top_k``). With ``eos_token_id``, a finished row gets ``pad_token_id`` (default: the EOS
    token) after it, and decoding stops once every row has finished, checked every
    ``check_every`` tokens. Returns ``(batch, prompt + generated)`` on the lazy device; a
    ``mark_step`` ends every token's step.

    >>> import torch, transformers, lazy_torch
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    >>> model = transformers.GPT2LMHeadModel(config).to("lazy").eval()
    >>> out = lazy_torch.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5)
    >>> out.shape
    torch.Size([1, 8])
    """
    if input_ids.dim() != 2:
        raise ValueError(
            f"generate: input_ids must be (batch, length), got {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be positive, got {max_new_tokens}")
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    length = bucket_length(total, _positions(model)) if bucket else total
    device = torch.device("lazy", input_ids.device.index or 0) if input_ids.device.type == "lazy" \
        else torch.device("lazy")  # fmt: skip
    pad = eos_token_id if pad_token_id is None else pad_token_id
    ids = torch.zeros(batch, length, dtype=torch.long, device=device)
    ids[:, :prompt] = input_ids.to(device)
    pos = torch.tensor(prompt, device=device)  # the position written next, on the device
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    kwargs = {"use_cache": False} if hasattr(model, "generation_config") else {}
    done_at = torch.zeros((), dtype=torch.long, device=device)  # the length once all finished
    steps = 0
    with torch.no_grad():
        for steps in range(1, max_new_tokens + 1):
            with compile_session():  # transformers builds its masks instead of asking the device
                logits = _logits_of(model(ids, **kwargs))
            last = logits.index_select(1, (pos - 1).reshape(1)).squeeze(1)
            token = _next_token(last, do_sample, temperature, top_k)
            if eos_token_id is not None:
                token = torch.where(finished, torch.full_like(token, pad), token)
                finished = finished | (token == eos_token_id)
            ids.index_copy_(1, pos.reshape(1), token.unsqueeze(1))
            pos = pos + 1
            if eos_token_id is not None:
                done_at = torch.where((done_at == 0) & finished.all(), pos, done_at)
            _sync.mark_step()
            if eos_token_id is not None and steps % check_every == 0 and bool(done_at != 0):
                break
    end = prompt + steps
    if eos_token_id is not None:
        end = int(done_at) or end  # where every row had finished, as transformers stops
    return ids[:, :end]
