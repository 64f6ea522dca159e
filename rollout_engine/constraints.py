"""Constrained sampling: a request's `constraint` vetoes tokens, and the row samples again without them.

vLLM's structured outputs mask the whole vocabulary with a grammar before sampling. A constraint here is any
object with `accepts(text, start)`, judged lazily instead: the engine samples as usual, decodes the
completion with the candidate token and asks whether that text may stand from character `start` on (the
candidate's text; what came before was accepted already). On a veto, a sampled row draws again from its own
generator without the vetoed tokens (MAX_RESAMPLES times, so results stay independent of batching), then, as a
greedy row does at once, takes the likeliest of its MAX_CANDIDATES most likely tokens that the constraint
accepts. Where none is accepted the first sample stands and the sample goes on unconstrained: a model that has
left every path its constraint allows is better left to finish its own way than pushed into padding
(`ConstraintStats.unmet` counts these). Cheap when the model mostly agrees with its constraint, which is the
case it is for: one check a token, a few more where it would have gone wrong.

A vetoed token's logprob is not renormalised: like top-k and top-p truncation (`sampler`), the logprob of a
sampled token is taken under the temperature-scaled distribution before any token was removed, the policy's
own probability, which is what the trainer recomputes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from rollout_engine.sampler import SamplingBatch, sample
from rollout_engine.sequence import Sequence

MAX_RESAMPLES = 16  # a sampled row's fresh draws without its vetoed tokens, before it takes the likeliest
MAX_CANDIDATES = 64  # the likeliest tokens a row tries, in order, before its first sample stands


class Constraint(Protocol):
    """What a request's SamplingParams.constraint must be (and picklable, for a rollout-worker process)."""

    def accepts(self, text: str, start: int) -> bool: ...


@dataclass(slots=True)
class ConstraintStats:
    """What the constraints of a run did: tokens checked, tokens vetoed, and rows where no candidate passed
    (their first sample stood)."""

    checked: int = 0
    vetoed: int = 0
    unmet: int = 0


def constrain(
    logits: torch.Tensor,
    batch: SamplingBatch,
    tokens: torch.Tensor,
    logprobs: torch.Tensor,
    sampling: list[Sequence],
    tokenizer,
    stats: ConstraintStats,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and logprobs [rows] of one step with each constrained row's token replaced by one its constraint
    accepts. The rows are the sequences' in `sampling`, `num_samples_at_next_token` each; a sample whose
    constraint no candidate satisfied goes on without it."""
    rows = [seq for seq in sampling for _ in range(seq.num_samples_at_next_token)]
    tokens, logprobs = tokens.clone(), logprobs.clone()
    for row, seq in enumerate(rows):
        if seq.params.constraint is None:
            continue
        judge = _Judge(seq.params.constraint, tokenizer, seq.completion_token_ids, stats)
        first = int(tokens[row])
        if judge.accepts(first):
            continue
        token = _replacement(logits[row], batch, row, first, judge)
        if token is None:
            stats.unmet += 1
            if seq.num_samples_at_next_token == 1:  # its prompt's rows still share one sequence
                seq.params = dataclasses.replace(seq.params, constraint=None)
            continue
        tokens[row] = token
        logprobs[row] = _logprob(logits[row], batch.temperatures[row], token)
    return tokens, logprobs


class _Judge:
    """One row's constraint, asked about candidate tokens after the row's completion so far."""

    def __init__(self, constraint: Constraint, tokenizer, completion: list[int], stats: ConstraintStats):
        self.constraint = constraint
        self.tokenizer = tokenizer
        self.completion = completion
        self.stats = stats
        self.start = len(tokenizer.decode(completion, skip_special_tokens=True))

    def accepts(self, token: int) -> bool:
        text = self.tokenizer.decode(self.completion + [token], skip_special_tokens=True)
        ok = self.constraint.accepts(text, self.start)
        self.stats.checked += 1
        self.stats.vetoed += not ok
        return ok


def _replacement(
    row_logits: torch.Tensor, batch: SamplingBatch, row: int, first: int, judge: _Judge
) -> int | None:
    """A token the row's constraint accepts in place of its vetoed `first`: a sampled row draws again without
    the vetoed tokens (MAX_RESAMPLES times), then, like a greedy row, takes the likeliest accepted token."""
    vetoed = {first}
    if batch.temperatures[row] > 0:
        masked = row_logits[None].clone()
        masked[0, first] = float("-inf")
        one_row = SamplingBatch(
            batch.temperatures[row : row + 1],
            batch.top_ks[row : row + 1],
            batch.top_ps[row : row + 1],
            batch.rngs[row : row + 1],
        )
        for _ in range(MAX_RESAMPLES):
            token = int(sample(masked, one_row)[0][0])
            if token in vetoed:  # every token left with mass under top-k/top-p was vetoed
                break
            if judge.accepts(token):
                return token
            vetoed.add(token)
            masked[0, token] = float("-inf")
    for token in row_logits.topk(MAX_CANDIDATES).indices.tolist():
        if token not in vetoed and judge.accepts(token):
            return token
    return None


def _logprob(row_logits: torch.Tensor, temperature: float, token: int) -> torch.Tensor:
    """The sampler's logprob convention: log_softmax(logits / T) (T = 1 when greedy) before any filtering."""
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(row_logits.float() / scale, dim=-1)[token]
