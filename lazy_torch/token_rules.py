"""Rules on the next token's scores, for decoding loops recorded in the graph (generation.py):
each a pure function of the scores, the sequence's length so far and the token buffer, so one
traced loop body serves every iteration (the length is a device scalar there)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Rule = Callable[[torch.Tensor, Any, torch.Tensor], torch.Tensor]
"""A rule on the next token's scores: ``rule(scores, length, ids)`` gives new scores for
``scores`` (``(batch, vocab)`` float32), the sequence's length so far (an int in the prefill, a
0-d tensor in the loop) and the token buffer ``ids`` (``(batch, bucket)``, valid below
``length``). Rules apply in order, as transformers' logits processors do."""


def temperature(value: float) -> Rule:
    return lambda scores, length, ids: scores / value


def top_k(k: int) -> Rule:
    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        kth = torch.topk(scores, min(k, scores.shape[-1]), dim=-1).values[:, -1:]
        return scores.masked_fill(scores < kth, float("-inf"))

    return rule


def top_p(p: float) -> Rule:
    """The fewest most likely tokens whose probabilities reach ``p``."""

    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        ascending, order = scores.sort(dim=-1)
        below = ascending.softmax(-1).cumsum(-1) <= 1.0 - p  # the unlikely tail
        below[:, -1] = False  # the most likely token always stays
        return scores.masked_fill(below.scatter(1, order, below), float("-inf"))

    return rule


def eos_barred(eos: torch.Tensor, below: int) -> Rule:
    """No token of ``eos`` (ids, on the device) while the sequence is shorter than ``below``
    tokens."""

    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(_eos_mask(eos, scores) & (length < below), float("-inf"))

    return rule


def repetition_penalty(penalty: float, start: int = 0) -> Rule:
    """Every token of the sequence from position ``start`` on less likely: its score divided by
    ``penalty`` (multiplied where negative)."""

    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        vocab = scores.shape[-1]
        span = torch.arange(ids.shape[1], device=ids.device)
        seen = _marked(ids, (span >= length) | (span < start), vocab)
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
        return torch.where(seen, penalized, scores)

    return rule


def ids_tensor(ids: Any, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(ids).reshape(-1).to(device=device, dtype=torch.long)


def pick(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    if not do_sample:
        return scores.argmax(-1)
    # The Gumbel-max trick: argmax(scores + Gumbel noise) is a draw from softmax(scores).
    uniform = torch.rand(scores.shape, device=scores.device).clamp_(1e-20, 1.0)
    return (scores - torch.log(-torch.log(uniform))).argmax(-1)


def _marked(tokens: torch.Tensor, skipped: torch.Tensor, vocab: int) -> torch.Tensor:
    """``(batch, vocab)``: which tokens of each row of ``tokens`` occur where not ``skipped``
    (ids past the vocabulary, which the model cannot choose, mark nothing)."""
    spare = tokens.clamp(max=vocab).masked_fill(skipped, vocab)  # one column past the vocabulary
    hit = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.bool, device=tokens.device)
    return hit.scatter(1, spare, True)[:, :vocab]


def _eos_mask(eos: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    return (torch.arange(scores.shape[-1], device=scores.device) == eos[:, None]).any(0)


def forced_eos(eos: torch.Tensor, at: int) -> Rule:
    """Only ``eos`` tokens (score 0, every other one -inf) once the sequence is ``at`` long."""

    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        forced = torch.zeros_like(scores).masked_fill(~_eos_mask(eos, scores), float("-inf"))
        now = torch.as_tensor(length == at, device=scores.device)
        return torch.where(now, forced, scores)

    return rule


def no_repeat_ngram(n: int) -> Rule:
    """No token that would repeat an ``n``-gram of the sequence: where the last ``n - 1`` tokens
    occurred before, the token that followed them there is barred."""

    def rule(scores: torch.Tensor, length: Any, ids: torch.Tensor) -> torch.Tensor:
        vocab, span = scores.shape[-1], ids.shape[1]
        if span < n:
            return scores
        grams = ids.unfold(1, n, 1)  # (batch, span - n + 1, n): the n-gram at each start
        tail = torch.arange(n - 1, device=ids.device) + (length - n + 1)
        last = ids.index_select(1, tail.clamp(min=0))  # the last n - 1 tokens
        starts = torch.arange(span - n + 1, device=ids.device)
        match = (grams[..., :-1] == last[:, None]).all(-1) & (starts <= length - n)
        return scores.masked_fill(_marked(grams[..., -1], ~match, vocab), float("-inf"))

    return rule
