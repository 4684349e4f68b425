"""transformers' ``generate()`` on a lazy model, decoded as one in-graph loop.

transformers decodes greedy and sampled text in ``GenerationMixin._sample``, a Python loop:
per token it calls the model, applies its logits processors, appends the token and reads a
stopping flag on the host. On device 'lazy' each token is then a graph to dispatch and a sync,
and with transformers' default (dynamic) cache a graph of a new shape, compiled anew.

Installed when transformers is imported (``import_hooks``), the replacement of ``_sample`` hands a
lazy model's loop to ``generation.decode`` (one ``while_loop`` node for every token, no sync
without EOS, compiles bounded by a length bucket) when everything transformers' loop would do
has an in-graph rule:

- each logits processor: a rule of ``token_rules``, or the processor itself where it reads the
  scores alone (``_PROCESSORS``);
- each stopping criterion: the maximal length, EOS ids (``_CRITERIA``);
- the model's arguments transformers prepared: the attention mask, 2-d positions, a cache it
  made itself (the loop decodes against a ``StaticCache`` of its own), ``use_cache``;
- a decoder-only model; no streamer, synchronized GPUs, prefill chunking or assistant, and a
  plain tensor result (``return_dict_in_generate`` asks for per-token scores and the cache).

Anything else keeps transformers' loop, with one warning naming the reason; so does
``LAZY_HF_GENERATE=0``. The tokens are transformers' (greedy: equal; sampled: drawn from the
same distribution with the lazy generator).
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

import runtime
from lazy_torch import control_flow, generation, sites
from lazy_torch import token_rules as rules

# transformers' logits processors with an in-graph rule, by class name: the rule for an instance
# and the lazy device (None: this instance has none).


def _scores_only(processor: Any, device: torch.device) -> rules.Rule:
    """The processor itself: it reads the scores alone, never the sequence or its length."""
    return lambda scores, length, ids: processor(ids, scores)


def _penalty(processor: Any, device: torch.device) -> rules.Rule | None:
    start = processor.prompt_ignore_length
    if isinstance(start, torch.Tensor):  # one start a row: not ruled here
        return None
    return rules.repetition_penalty(processor.penalty, start or 0)


def _min_length(processor: Any, device: torch.device) -> rules.Rule:
    return rules.eos_barred(rules.ids_tensor(processor.eos_token_id, device), processor.min_length)


def _min_new_tokens(processor: Any, device: torch.device) -> rules.Rule:
    below = processor.prompt_length_to_skip + processor.min_new_tokens
    return rules.eos_barred(rules.ids_tensor(processor.eos_token_id, device), below)


def _forced_eos(processor: Any, device: torch.device) -> rules.Rule:
    eos = rules.ids_tensor(processor.eos_token_id, device)
    return rules.forced_eos(eos, processor.max_length - 1)


def _no_repeat_ngram(processor: Any, device: torch.device) -> rules.Rule:
    return rules.no_repeat_ngram(processor.ngram_size)


# Processors that read the scores alone (never the sequence or its length): called as they are.
_SCORES_ONLY = """TemperatureLogitsWarper TopKLogitsWarper TopPLogitsWarper MinPLogitsWarper
    TypicalLogitsWarper EpsilonLogitsWarper LogitNormalization InfNanRemoveLogitsProcessor"""
_PROCESSORS: dict[str, Callable[[Any, torch.device], rules.Rule | None]] = {
    **dict.fromkeys(_SCORES_ONLY.split(), _scores_only),
    "RepetitionPenaltyLogitsProcessor": _penalty,
    "NoRepeatNGramLogitsProcessor": _no_repeat_ngram,
    "MinLengthLogitsProcessor": _min_length,
    "MinNewTokensLengthLogitsProcessor": _min_new_tokens,
    "ForcedEOSTokenLogitsProcessor": _forced_eos,
}
_CRITERIA = ("MaxLengthCriteria", "EosTokenCriteria")
# The model arguments transformers prepares that the loop takes over; any other one, given a
# value, keeps transformers' loop.
_ARGUMENTS = {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache"}


def _known(obj: Any, table: Any) -> bool:
    """Whether ``obj`` is exactly a transformers class named in ``table`` (a subclass may
    change what it does)."""
    cls = type(obj)
    return cls.__name__ in table and cls.__module__.startswith("transformers.generation.")


def _plan(model: Any, input_ids: Any, processors: Any, criteria: Any, config: Any,
          synced_gpus: bool, streamer: Any, kwargs: dict) -> dict | str:  # fmt: skip
    """``decode``'s arguments for this call, or why transformers' loop must run it."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "the model is an encoder-decoder"
    if streamer is not None or synced_gpus:
        return "it streams tokens" if streamer is not None else "synced_gpus is set"
    if config.return_dict_in_generate:
        return "return_dict_in_generate asks for per-token outputs"
    chunks = getattr(config, "prefill_chunk_size", None)
    if chunks is not None or getattr(config, "is_assistant", False):
        return "it prefills in chunks" if chunks is not None else "it is an assistant"
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return "its input is not a (batch, length) tensor"
    extra = sorted(k for k, v in kwargs.items() if k not in _ARGUMENTS and v is not None)
    if extra:
        return f"it passes the model {', '.join(extra)}"
    cache = kwargs.get("cache")
    if getattr(cache, "_is_user_defined", False):
        return "it was given a cache, which its loop fills"
    positions = kwargs.get("position_ids")
    if positions is not None and positions.dim() != 2:
        return "its position ids are not 2-d"
    prompt, device = input_ids.shape[1], generation.target_device(model, input_ids)
    made = []
    for processor in processors:
        translate = _PROCESSORS.get(type(processor).__name__)
        known = translate is not None and _known(processor, _PROCESSORS)
        rule = translate(processor, device) if known else None
        if rule is None:
            return f"its logits processor {type(processor).__name__} has no in-graph rule"
        made.append(rule)
    ends, eos = None, []
    for criterion in criteria:
        if not _known(criterion, _CRITERIA):
            return f"its stopping criterion {type(criterion).__name__} has no in-graph rule"
        if hasattr(criterion, "max_length"):
            ends = criterion.max_length if ends is None else min(ends, criterion.max_length)
        else:
            eos.append(rules.ids_tensor(criterion.eos_token_id, device))
    if ends is None or ends <= prompt:
        return "it has no maximal length beyond the prompt"
    limit = generation.model_positions(model)
    if limit is not None and ends > limit:
        return f"its {ends} tokens exceed the model's {limit} positions"
    return dict(
        max_new_tokens=ends - prompt,
        rules=made,
        do_sample=bool(config.do_sample),
        eos=torch.cat(eos) if eos else None,
        pad=getattr(config, "_pad_token_tensor", None),
        attention_mask=kwargs.get("attention_mask"),
        position_ids=positions,
        use_cache=None if kwargs.get("use_cache", True) else False,
    )


_warned: set[str] = set()


def _warn(reason: str) -> None:
    """Once per reason, at the user's line (outside transformers)."""
    if reason in _warned:
        return
    _warned.add(reason)
    import transformers

    site = sites.user_site(also=(os.path.dirname(transformers.__file__) + os.sep,))
    path, _, line = site.rpartition(":")
    warnings.warn_explicit(
        f"lazy_torch: transformers' generate() runs its Python loop, a graph and a sync a "
        f"token, as {reason} (lazy_torch/hf_generate.py)",
        UserWarning,
        path or site,
        int(line) if line.isdigit() else 0,
    )


def _on_lazy(model: Any, input_ids: Any) -> bool:
    device = getattr(model, "device", None)
    return getattr(device, "type", None) == "lazy" or (
        isinstance(input_ids, torch.Tensor) and input_ids.device.type == "lazy"
    )


def install(utils: Any) -> None:
    """Replace ``utils.GenerationMixin._sample`` (``utils``: ``transformers.generation.utils``)
    by the routing above; transformers before 5.0 prepares other arguments and keeps its own."""
    import transformers

    mixin = utils.GenerationMixin
    original = mixin.__dict__.get("_sample")
    if original is None or getattr(original, "_lazy_route", False):
        return
    if int(transformers.__version__.split(".")[0]) < 5:
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _sample(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        given = bound.arguments
        model, input_ids = given["self"], given["input_ids"]
        if not runtime.config.HF_GENERATE or not _on_lazy(model, input_ids):
            return original(*args, **kwargs)
        plan = _plan(
            model, input_ids, given["logits_processor"], given["stopping_criteria"],
            given["generation_config"], given.get("synced_gpus", False),
            given.get("streamer"), dict(given.get("model_kwargs", {})),
        )  # fmt: skip
        if isinstance(plan, str):
            _warn(plan)
            return original(*args, **kwargs)
        try:
            return generation.decode(model, input_ids, **plan)
        except control_flow.SyncInBody as error:  # nothing was written: transformers' loop
            _warn(f"its model syncs inside a loop body: {error}")
            return original(*args, **kwargs)

    _sample._lazy_route = True
    mixin._sample = _sample
