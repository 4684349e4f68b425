"""``lazy_torch.generate``: autoregressive decoding as one in-graph loop.

A decoding loop in Python records a graph per token, and a sequence that grows by a token per
step gives each graph a new shape, so a lazy backend compiles once per length; with a sync per
token (an EOS check) the host waits for the device every token. ``generate`` records the whole
decoding loop as one ``while_loop`` node instead (control_flow.py), so every token runs inside
one XLA program: no Python, no dispatch and no sync between tokens, and the loop stops on the
device once every row has produced EOS.

Every shape is fixed. The tokens live in a buffer padded to a length bucket (the next power of
two of prompt plus new tokens, at most the model's positions), and the position written next is
a device scalar carried by the loop. A transformers model that supports a static KV cache
(``_can_compile_fullgraph``) decodes against a ``StaticCache`` of the bucket's length: a prefill
over the prompt, then one token per iteration (the cache's writes are carried by the loop). Any
other causal model (one returning logits ``(batch, length, vocab)``) runs over the whole buffer
every iteration; its logits at a position depend only on the tokens before it, so the padding
changes nothing. Compiles: one prefill per (batch, prompt length, bucket) and one loop per
(batch, bucket), whatever the number of tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch._higher_order_ops.while_loop import while_loop_op

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
    logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None, top_p: float
) -> torch.Tensor:
    if not do_sample:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:  # the fewest most likely tokens whose probabilities reach top_p
        ascending, order = logits.sort(dim=-1)
        below = ascending.softmax(-1).cumsum(-1) <= 1.0 - top_p  # the unlikely tail
        below[:, -1] = False  # the most likely token always stays
        logits = logits.masked_fill(below.scatter(1, order, below), float("-inf"))
    # The Gumbel-max trick: argmax(logits + Gumbel noise) is a draw from softmax(logits).
    uniform = torch.rand(logits.shape, device=logits.device).clamp_(1e-20, 1.0)
    return (logits - torch.log(-torch.log(uniform))).argmax(-1)


def _static_cache(model: Any, length: int) -> Any:
    """A transformers ``StaticCache`` of ``length`` positions for ``model``, or None where the
    model cannot decode against one."""
    if not getattr(model, "_can_compile_fullgraph", False) or not hasattr(model, "config"):
        return None
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def _decoders(
    model: Callable, ids: torch.Tensor, prompt: int, mask: torch.Tensor | None, use_cache: Any
) -> tuple:
    """The first new token's logits ``(batch, vocab)``, and the step: the logits of the token
    after position ``pos`` (a 0-d tensor) whose token is ``token``, ``(batch, vocab)``. ``mask``:
    the attention mask of the whole buffer (0 at a prompt's padding), or None."""
    length = ids.shape[1]
    cache = None if use_cache is False else _static_cache(model, length)
    if use_cache and cache is None:
        raise ValueError(
            f"generate: use_cache=True needs a transformers model that supports a static KV "
            f"cache; {type(model).__name__} does not"
        )
    last = torch.tensor([prompt - 1], device=ids.device)
    # The mask and the positions (numbered as transformers numbers a padded row's), given to a
    # model that takes them, as transformers' generate() gives them: left to itself, a model may
    # count them from the cache's length, a value read on the host (OPT).
    forward = getattr(model, "forward", None)
    taken = inspect.signature(forward).parameters if forward is not None else {}
    if mask is None and "attention_mask" in taken:
        mask = torch.ones(ids.shape, dtype=torch.long, device=ids.device)
    takes = mask is not None and "position_ids" in taken
    if takes:
        places = (mask.cumsum(-1) - 1).masked_fill_(mask == 0, 1)

    def masked(upto: int | None, at: torch.Tensor | None = None) -> dict:
        given = {} if mask is None else {"attention_mask": mask[:, :upto]}
        if takes:
            where = places[:, :upto] if at is None else places.index_select(1, at.reshape(1))
            given["position_ids"] = where
        return given

    if cache is not None:
        positions = torch.arange(prompt, device=ids.device)
        out = model(
            ids[:, :prompt], past_key_values=cache, cache_position=positions, use_cache=True,
            **masked(prompt),
        )  # fmt: skip

        def step(pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            out = model(
                token[:, None], past_key_values=cache, cache_position=pos.reshape(1),
                **masked(None, pos),
            )  # fmt: skip
            return _logits_of(out)[:, -1]

        return _logits_of(out).index_select(1, last).squeeze(1), step
    kwargs = {"use_cache": False} if hasattr(model, "generation_config") else {}
    kwargs.update(masked(None))

    def whole(pos: torch.Tensor) -> torch.Tensor:
        logits = _logits_of(model(ids, **kwargs))
        if logits.shape[1] != length:
            raise ValueError(
                f"generate: the model returned logits for {logits.shape[1]} of {length} "
                "positions; without a KV cache it must return them for every position"
            )
        return logits.index_select(1, pos.reshape(1)).squeeze(1)

    return whole(last), lambda pos, token: whole(pos)


def generate(
    model: Callable,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    eos_token_id: int | None = None,
    min_new_tokens: int = 0,
    pad_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
    use_cache: bool | None = None,
) -> torch.Tensor:
    """Append up to ``max_new_tokens`` tokens to each row of ``input_ids`` (``(batch, prompt)``
    int64, on the lazy device or the CPU) with ``model`` (a causal LM: transformers' or any
    module returning logits ``(batch, length, vocab)``), greedy or sampled (``temperature``,
    ``top_k``, ``top_p``, from the lazy device's generator). With ``eos_token_id``, a finished row
    gets ``pad_token_id`` (default: the EOS token) after it, and decoding stops once every row
    has finished; no row ends before ``min_new_tokens`` new tokens. ``attention_mask``
    (``(batch, prompt)``, 0 at padding): prompts of different lengths, left-padded as
    transformers pads them. ``use_cache``: decode against a static KV cache (default: where the
    model supports one). Returns ``(batch, prompt + generated)`` on
    the lazy device; its graph is dispatched (``mark_step``), and only with ``eos_token_id`` is
    one value read (the final length).

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
    if not 0.0 < top_p <= 1.0 or min_new_tokens < 0:
        raise ValueError(
            f"generate: top_p must be in (0, 1] and min_new_tokens at least 0, got {top_p} and "
            f"{min_new_tokens}"
        )
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    length = bucket_length(total, _positions(model))
    device = torch.device("lazy", input_ids.device.index or 0) if input_ids.device.type == "lazy" \
        else torch.device("lazy")  # fmt: skip
    pad = eos_token_id if pad_token_id is None else pad_token_id

    def choose(logits: torch.Tensor, finished: torch.Tensor, early: Any) -> tuple:
        """The next token; ``early``: whether it comes before ``min_new_tokens`` new tokens
        (a bool, or a 0-d tensor in the loop), where EOS may not be chosen."""
        if eos_token_id is not None and min_new_tokens:
            eos = torch.arange(logits.shape[-1], device=logits.device) == eos_token_id
            logits = logits.masked_fill(eos & early, float("-inf"))
        token = _next_token(logits, do_sample, temperature, top_k, top_p)
        if eos_token_id is None:
            return token, finished
        token = torch.where(finished, torch.full_like(token, pad), token)
        return token, finished | (token == eos_token_id)

    _sync.mark_step()  # what the program left pending: not in the prefill's graph
    # transformers builds its masks and cache writes without asking the device for values
    with torch.no_grad(), compile_session():
        ids = torch.zeros(batch, length, dtype=torch.long, device=device)
        ids[:, :prompt] = input_ids.to(device)
        mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (batch, prompt):
                raise ValueError(
                    f"generate: attention_mask must be {(batch, prompt)} like input_ids, got "
                    f"{tuple(attention_mask.shape)}"
                )
            mask = torch.ones(batch, length, dtype=torch.long, device=device)
            mask[:, :prompt] = attention_mask.to(device)
        first, step = _decoders(model, ids, prompt, mask, use_cache)
        unfinished = torch.zeros(batch, dtype=torch.bool, device=device)
        token, finished = choose(first, unfinished, min_new_tokens > 0)
        ids[:, prompt] = token
        _sync.mark_step()  # the prefill: a program of its own, so the loop's serves every prompt
        if max_new_tokens == 1:
            return ids[:, :total]
        last = torch.tensor(total - 1, device=device)  # data: one loop for any token count
        least = torch.tensor(prompt + min_new_tokens - 1, device=device)  # and minimum

        def more(pos: torch.Tensor, token: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
            return (pos < last) & ~finished.all()

        def decode(pos: torch.Tensor, token: torch.Tensor, finished: torch.Tensor) -> tuple:
            token, finished = choose(step(pos, token), finished, pos < least)
            ids.index_copy_(1, (pos + 1).reshape(1), token[:, None])  # the loop carries ids
            return pos + 1, token, finished

        start = (torch.tensor(prompt, device=device), token, finished)
        # The operator itself: torch's wrapper compiles it with TorchDynamo in torch 2.11
        pos, _, _ = while_loop_op(more, decode, start, ())
        _sync.mark_step()
    end = total if eos_token_id is None else int(pos) + 1  # where every row had finished
    return ids[:, :end]
