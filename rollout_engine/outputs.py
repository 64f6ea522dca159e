"""What generate returns: one GroupResult of n Completions per prompt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Completion:
    """One sampled completion.

    token_ids include the stop token that ended it (if any). logprobs[i] is log p(token_ids[i]) under
    log_softmax(logits / T) of the unfiltered distribution (T=1 for greedy); see sampler.py.
    finish_reason is "stop" (stop token or stop string) or "length" (max_tokens or max_model_len).
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    sample_index: int


@dataclass(slots=True)
class GroupResult:
    """The n completions of one prompt, in sample order."""

    request_id: int
    prompt_token_ids: list[int]
    samples: list[Completion]
