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
from lazy_torch import token_rules as _rules
from lazy_torch.capture import compile_session


def _logits_of(out: Any) -> torch.Tensor:
    """A model's logits: ``out.logits`` (transformers), ``out[0]`` (nanoGPT's ``(logits, loss)``)
    or ``out`` itself."""
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def model_positions(model: Any) -> int | None:
    """The most positions ``model`` takes (its config's), or None where it names none."""
    config = getattr(model, "config", None)
    for name in ("n_positions", "max_position_embeddings", "block_size"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def target_device(model: Any, input_ids: torch.Tensor) -> torch.device:
    """The lazy device decoding runs on: the input's, else the model's parameters', else
    lazy:0."""
    if input_ids.device.type == "lazy":
        return input_ids.device
    parameter = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if parameter is not None and parameter.device.type == "lazy":
        return parameter.device
    return torch.device("lazy", 0)


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


def _static_cache(model: Any, length: int, device: torch.device) -> Any:
    """A transformers ``StaticCache`` of ``length`` positions for ``model``, or None where the
    model cannot decode against one."""
    if not getattr(model, "_can_compile_fullgraph", False) or not hasattr(model, "config"):
        return None
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=length)
    for layer in getattr(cache, "layers", ()):
        # Each layer's counter starts as a CPU tensor, moved at its first write: a transfer a
        # layer. A fill on the device instead is part of the prefill's program.
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor) and counter.device.type == "cpu":
            layer.cumulative_length = torch.full(
                counter.shape, counter.item(), dtype=counter.dtype, device=device
            )
    return cache


def _decoders(
    model: Callable,
    ids: torch.Tensor,
    prompt: int,
    mask: torch.Tensor | None,
    positions: torch.Tensor | None,
    use_cache: Any,
) -> tuple:
    """The first new token's logits ``(batch, vocab)``, and the step: the logits of the token
    after position ``pos`` (a 0-d tensor) whose token is ``token``, ``(batch, vocab)``. ``mask``:
    the attention mask of the whole buffer (0 at a prompt's padding), or None; ``positions``:
    the prompt's position ids, or None."""
    batch, length = ids.shape
    cache = None if use_cache is False else _static_cache(model, length, ids.device)
    if use_cache and cache is None:
        raise ValueError(
            f"generate: use_cache=True needs a transformers model that supports a static KV "
            f"cache; {type(model).__name__} does not"
        )
    # Fills, not transfers: their numbers are parameters of the program, as a transfer's would be.
    last = torch.full((1,), prompt - 1, device=ids.device)
    # The mask and the positions, given to a model that takes them, as transformers' generate()
    # gives them: left to itself, a model may count them from the cache's length, a value read
    # on the host (OPT). Positions go on by one a token from the prompt's last.
    forward = getattr(model, "forward", None)
    taken = inspect.signature(forward).parameters if forward is not None else {}
    if mask is None and "attention_mask" in taken:
        mask = torch.ones(ids.shape, dtype=torch.long, device=ids.device)
    places = None
    if "position_ids" in taken:
        if positions is None and mask is not None:
            counted = mask[:, :prompt].cumsum(-1) - 1
            positions = counted.masked_fill(mask[:, :prompt] == 0, 0)
        elif positions is None:
            positions = torch.arange(prompt, device=ids.device)[None]
        positions = positions.to(ids.device).expand(batch, prompt)
        later = torch.arange(1, length - prompt + 1, device=ids.device) + positions[:, -1:]
        places = torch.cat([positions, later], 1)

    def given(upto: int | None, at: torch.Tensor | None = None) -> dict:
        kwargs = {} if mask is None else {"attention_mask": mask[:, :upto]}
        if places is not None:
            where = places[:, :upto] if at is None else places.index_select(1, at.reshape(1))
            kwargs["position_ids"] = where
        return kwargs

    if cache is not None:
        out = model(
            ids[:, :prompt], past_key_values=cache, use_cache=True,
            cache_position=torch.arange(prompt, device=ids.device), **given(prompt),
        )  # fmt: skip

        def step(pos: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
            out = model(
                token[:, None], past_key_values=cache, cache_position=pos.reshape(1),
                **given(None, pos),
            )  # fmt: skip
            return _logits_of(out)[:, -1]

        return _logits_of(out).index_select(1, last).squeeze(1), step
    kwargs = {"use_cache": False} if hasattr(model, "generation_config") else {}
    kwargs.update(given(None))

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
    repetition_penalty: float = 1.0,
    no_repeat_ngram_size: int = 0,
    eos_token_id: int | list[int] | None = None,
    min_new_tokens: int = 0,
    pad_token_id: int | None = None,
    attention_mask: torch.Tensor | None = None,
    use_cache: bool | None = None,
) -> torch.Tensor:
    """Append up to ``max_new_tokens`` tokens to each row of ``input_ids`` (``(batch, prompt)``
    int64, on the lazy device or the CPU) with ``model`` (a causal LM: transformers' or any
    module returning logits ``(batch, length, vocab)``), greedy or sampled (``temperature``,
    ``top_k``, ``top_p``, from the lazy device's generator), with transformers'
    ``repetition_penalty`` and ``no_repeat_ngram_size``. With ``eos_token_id`` (one id or
    several), a finished row gets ``pad_token_id`` (default: the first EOS token) after it, and
    decoding stops once every row has finished; no row ends before ``min_new_tokens`` new
    tokens. ``attention_mask`` (``(batch, prompt)``, 0 at padding): prompts of different
    lengths, left-padded as transformers pads them. ``use_cache``: decode against a static KV
    cache (default: where the model supports one). Returns ``(batch, prompt + generated)`` on
    the lazy device; its graph is dispatched (``mark_step``), and only with ``eos_token_id`` is
    one value read (the final length). transformers' own ``generate()`` on a lazy model comes
    here too where it can (hf_generate.py).

    >>> import torch, transformers, lazy_torch
    >>> config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    >>> model = transformers.GPT2LMHeadModel(config).to("lazy").eval()
    >>> out = lazy_torch.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5)
    >>> out.shape
    torch.Size([1, 8])
    """
    if not 0.0 < top_p <= 1.0 or min_new_tokens < 0 or not temperature > 0.0:
        raise ValueError(
            f"generate: top_p must be in (0, 1], min_new_tokens at least 0 and temperature "
            f"positive, got {top_p}, {min_new_tokens} and {temperature}"
        )
    rules = []
    if repetition_penalty != 1.0:
        rules.append(_rules.repetition_penalty(repetition_penalty))
    if no_repeat_ngram_size:
        rules.append(_rules.no_repeat_ngram(no_repeat_ngram_size))
    eos = None
    if eos_token_id is not None:
        eos = _rules.ids_tensor(eos_token_id, target_device(model, input_ids))
    if eos is not None and min_new_tokens:
        rules.append(_rules.eos_barred(eos, input_ids.shape[-1] + min_new_tokens))
    if do_sample:
        rules += [_rules.temperature(temperature)] if temperature != 1.0 else []
        rules += [_rules.top_k(top_k)] if top_k is not None else []
        rules += [_rules.top_p(top_p)] if top_p < 1.0 else []
    return decode(
        model, input_ids, max_new_tokens, rules=rules, do_sample=do_sample, eos=eos,
        pad=pad_token_id, attention_mask=attention_mask, use_cache=use_cache,
    )  # fmt: skip


def decode(
    model: Callable,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    rules: list[_rules.Rule],
    do_sample: bool,
    eos: Any = None,
    pad: Any = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    use_cache: bool | None = None,
) -> torch.Tensor:
    """``generate``'s loop: the next token picked (argmax, or drawn with ``do_sample``) from the
    model's float32 logits after ``rules``; ``eos``: the ids that end a row (a list or tensor,
    or None), ``pad`` (default: the first EOS id) follows them; ``position_ids``: the prompt's
    (default: counted from the mask, as transformers counts them)."""
    if input_ids.dim() != 2:
        raise ValueError(
            f"generate: input_ids must be (batch, length), got {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be positive, got {max_new_tokens}")
    batch, prompt = input_ids.shape
    total = prompt + max_new_tokens
    length = bucket_length(total, model_positions(model))
    device = target_device(model, input_ids)

    _sync.mark_step()  # what the program left pending: not in the prefill's graph
    # transformers builds its masks and cache writes without asking the device for values
    with torch.no_grad(), compile_session():
        if eos is not None:
            eos = _rules.ids_tensor(eos, device)
            pad = eos[0] if pad is None else _rules.ids_tensor(pad, device)[0]
        ids = torch.zeros(batch, length, dtype=torch.long, device=device)
        ids[:, :prompt] = input_ids.to(device)

        def choose(logits: torch.Tensor, length: Any, finished: torch.Tensor) -> tuple:
            scores = logits.float()
            for rule in rules:
                scores = rule(scores, length, ids)
            token = _rules.pick(scores, do_sample)
            if eos is None:
                return token, finished
            token = torch.where(finished, pad, token)
            return token, finished | (token[:, None] == eos).any(-1)

        mask = None
        if attention_mask is not None:
            if tuple(attention_mask.shape) != (batch, prompt):
                raise ValueError(
                    f"generate: attention_mask must be {(batch, prompt)} like input_ids, got "
                    f"{tuple(attention_mask.shape)}"
                )
            mask = torch.ones(batch, length, dtype=torch.long, device=device)
            mask[:, :prompt] = attention_mask.to(device)
        first, step = _decoders(model, ids, prompt, mask, position_ids, use_cache)
        unfinished = torch.zeros(batch, dtype=torch.bool, device=device)
        token, finished = choose(first, prompt, unfinished)
        ids[:, prompt] = token
        _sync.mark_step()  # the prefill: a program of its own, so the loop's serves every prompt
        if max_new_tokens == 1:
            return ids[:, :total]
        last = torch.full((), total - 1, device=device)  # data: one loop for any token count

        def more(pos: torch.Tensor, token: torch.Tensor, finished: torch.Tensor) -> torch.Tensor:
            return (pos < last) & ~finished.all()

        def body(pos: torch.Tensor, token: torch.Tensor, finished: torch.Tensor) -> tuple:
            token, finished = choose(step(pos, token), pos + 1, finished)
            ids.index_copy_(1, (pos + 1).reshape(1), token[:, None])  # the loop carries ids
            return pos + 1, token, finished

        start = (torch.full((), prompt, device=device), token, finished)
        # The operator itself: torch's wrapper compiles it with TorchDynamo in torch 2.11
        pos, _, _ = while_loop_op(more, body, start, ())
        _sync.mark_step()
    end = total if eos is None else int(pos) + 1  # where every row had finished
    return ids[:, :end]
