"""What the engine returns: generate's GroupResult of n Completions per prompt, and step's StepOutput of the
tokens each step samples."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Completion:
    """One sampled completion.

    token_ids include the stop token that ended it (if any). logprobs[i] is log p(token_ids[i]) under
    log_softmax(logits / T) of the unfiltered distribution (T=1 for greedy; see sampler.py), renormalised over
    support[i] where a constraint chose the tokens the position was sampled among (empty: the whole
    vocabulary; see constraints.py).
    finish_reason is "stop" (stop token or stop string) or "length" (max_tokens or max_model_len).
    top_logprobs[i] holds the params.top_logprobs most likely (token id, logprob) pairs at token i's position
    under the same distribution, most likely first (empty when top_logprobs is 0).
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    sample_index: int
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    support: list[tuple[int, ...]] = field(default_factory=list)


@dataclass(slots=True)
class GroupResult:
    """The n completions of one prompt, in sample order."""

    request_id: int
    prompt_token_ids: list[int]
    samples: list[Completion]


@dataclass(slots=True)
class TokenOutput:
    """One token that a step sampled for one sample of a request, as Completion holds it once finished;
    finish_reason is set on the sample's last token, None before."""

    request_id: int
    sample_index: int
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    finish_reason: str | None


@dataclass(slots=True)
class StepOutput:
    """What one engine step produced: every token it sampled, in step order, and the groups it finished."""

    tokens: list[TokenOutput] = field(default_factory=list)
    finished: list[GroupResult] = field(default_factory=list)
