"""Constrained sampling: a request's `constraint` vetoes tokens, and the row samples among the likeliest
tokens it accepts, a distribution the trainer recomputes exactly.

vLLM's structured outputs mask the vocabulary with a compiled grammar. A constraint here is any object with
`accepts(text, start)`: the SQL envs' schema rules depend on the aliases a query binds, which no context-free
grammar states. So the engine asks it about a row's candidates, the likeliest tokens that together hold
CANDIDATE_MASS of the row's probability (at most MAX_CANDIDATES of them, and inside the row's top-k / top-p),
each decoded after the completion so far: does the text stand from character `start` on (what came before was
accepted already)?

The candidates it accepts are the row's support S at this step, and a sampled row's token is drawn from
q(y) = pi(y) / pi(S) on S, pi being the sampler's softmax(logits / T) (`sampler`). The token the row sampled
unconstrained stands when it is in S, and otherwise the row draws again from q with its own generator, so
results stay independent of batching; that is an exact rejection step, pi(y) + (1 - pi(S)) q(y) = q(y). The
row's logprob is log q(y), and S travels with the completion (`Completion.support`), so the trainer
renormalises over the same tokens (`rl.algo.logprobs`). The update is the gradient of the distribution that
sampled: no mass is pushed into a vetoed name the sampler never emits, nor into the unasked tail.

A row whose candidates were all vetoed has left every path its constraint allows (`ConstraintStats.unmet`):
it keeps its unconstrained sample, with the full distribution's logprob and no support, and a sample on its
own goes on without its constraint, better left to finish its own way than pushed into padding. A greedy row
(evaluation, never trained) takes its likeliest candidate the constraint accepts, with the logprob of the
unmasked distribution at T = 1, as an unconstrained greedy row has.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from rollout_engine.sampler import SamplingBatch, top_logprobs
from rollout_engine.sequence import Sequence

CANDIDATE_MASS = 0.99  # the share of a sampled row's probability its constraint is asked about
MAX_CANDIDATES = 64  # the most tokens a row's constraint is asked about at one step


class Constraint(Protocol):
    """What a request's SamplingParams.constraint must be (and picklable, for a rollout-worker process)."""

    def accepts(self, text: str, start: int) -> bool: ...


@dataclass(slots=True)
class ConstraintStats:
    """What the constraints of a run did: tokens checked, tokens vetoed, rows where no candidate passed (they
    sampled as if unconstrained), and over the sampled rows drawn from a support, their count and the sum of
    -log pi(support): how far the distribution that sampled them is from the unconstrained policy."""

    checked: int = 0
    vetoed: int = 0
    unmet: int = 0
    supported: int = 0
    support_nats: float = 0.0


@dataclass(slots=True)
class ConstrainedRow:
    """One constrained row of a step, as synced to the host: its candidates, likeliest first, with their
    probabilities under the sampler's distribution, and the token and logprob it sampled unconstrained."""

    seq: Sequence
    rng_index: int
    token: int
    logprob: float
    candidates: list[int]
    probs: list[float]


def candidates(logits: torch.Tensor, temperatures: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The MAX_CANDIDATES likeliest tokens of each row of logits [rows, vocab] with their probabilities under
    softmax(logits / T) (T = 1 for greedy rows), likeliest first: (probs [rows, k], ids [rows, k])."""
    logprobs, ids = top_logprobs(logits, temperatures, min(MAX_CANDIDATES, logits.size(-1)))
    return logprobs.exp(), ids


def constrain(
    batch: SamplingBatch, rows: list[ConstrainedRow], tokenizer, stats: ConstraintStats
) -> list[tuple[int, float, tuple[int, ...]]]:
    """Each constrained row's token, logprob and support (the tokens its logprob is normalised over; empty
    for greedy and unmet rows), from the host values of `rows` and the step's `batch` (their settings and
    generators)."""
    verdicts = _Verdicts(tokenizer, stats)
    out = []
    for row in rows:
        accepts = verdicts.judge(row.seq)
        i = row.rng_index
        if batch.temperatures[i] == 0:
            token = next((t for t in row.candidates if accepts(t)), None)
            if token is None:
                _unmet(row.seq, stats)
                token = row.token
            out.append((token, math.log(row.probs[row.candidates.index(token)]), ()))
            continue
        asked = _asked(row.probs, batch.top_ks[i], batch.top_ps[i])
        support = [(t, p) for t, p in zip(row.candidates[:asked], row.probs, strict=False) if accepts(t)]
        if not support:
            _unmet(row.seq, stats)
            out.append((row.token, row.logprob, ()))
            continue
        mass = sum(p for _, p in support)
        stats.supported += 1
        stats.support_nats -= math.log(mass)
        probs = dict(support)
        token = row.token if row.token in probs else _draw(support, mass, batch.rngs[i])
        out.append((token, math.log(probs[token] / mass), tuple(sorted(probs))))
    return out


def _asked(probs: list[float], top_k: int, top_p: float) -> int:
    """How many of a sampled row's candidates (likeliest first) its constraint is asked about: those that
    reach CANDIDATE_MASS together, inside the row's top-k and top-p (the sampler's rule: a token is dropped
    once the mass strictly before it reaches top_p); at least one."""
    limit = len(probs) if top_k < 0 else min(top_k, len(probs))
    before = 0.0
    for i, p in enumerate(probs[:limit]):
        if i and before >= min(top_p, CANDIDATE_MASS):
            return i
        before += p
    return limit


def _draw(support: list[tuple[int, float]], mass: float, rng) -> int:
    """A token of the support, each drawn with probability p / mass from the row's generator."""
    target = rng.random() * mass
    for token, p in support:
        target -= p
        if target < 0:
            return token
    return support[-1][0]  # rounding left the target at the very end


def _unmet(seq: Sequence, stats: ConstraintStats) -> None:
    """No candidate passed: the row samples as if unconstrained; a sample on its own goes on without it."""
    stats.unmet += 1
    if seq.num_samples_at_next_token == 1:  # its prompt's rows still share one sequence
        seq.params = dataclasses.replace(seq.params, constraint=None)


TAIL_TOKENS = 4  # the last tokens of a completion a candidate is decoded after (a character spans <= 4 bytes)


def decoder(tokenizer):
    """(decode(ids) -> text without special tokens, whether a token appends to a completion's text what it
    appends to its tail's). Decoding is local unless the tokenizer cleans up spaces, a rewrite that can reach
    back past any tail; a fast tokenizer that does not decodes in its Rust backend alone, as transformers
    would."""
    cleans = getattr(tokenizer, "clean_up_tokenization_spaces", False)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not cleans:
        return lambda ids: backend.decode(ids, skip_special_tokens=True), True
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True), not cleans


class CompletionText:
    """A completion's text, and the text it has with one more token, decoded as a whole completion would be.

    The completion is decoded once; a candidate is decoded after the completion's last TAIL_TOKENS tokens
    only, and what it appends to the tail's text is what it appends to the completion's, where the tail's
    text is a prefix of the tail's with it and no character is left half-written (a byte-level token may hold
    part of one; then, and for a tokenizer whose decoding is not local, the whole completion is decoded with
    it)."""

    def __init__(self, decode, local: bool, completion: list[int]) -> None:
        self.decode, self.completion = decode, completion
        self.text = decode(completion)
        self.tail = completion[-TAIL_TOKENS:] if local else None
        self.tail_text = decode(self.tail) if local else ""

    @property
    def start(self) -> int:
        return len(self.text)

    def after(self, token: int) -> str:
        if self.tail is not None:
            text = self.decode([*self.tail, token])
            if text.startswith(self.tail_text) and not text.endswith("\ufffd"):
                return self.text + text[len(self.tail_text) :]
        return self.decode([*self.completion, token])


@dataclass(slots=True)
class _Verdicts:
    """The constraints' verdicts of one step, asked once per (constraint, completion, token): the rows of a
    group that have sampled the same tokens so far share them."""

    tokenizer: object
    stats: ConstraintStats
    seen: dict[tuple, dict[int, bool]] = field(default_factory=dict)
    decoder: tuple = field(init=False)  # decoder(tokenizer)

    def __post_init__(self) -> None:
        self.decoder = decoder(self.tokenizer)

    def judge(self, seq: Sequence):
        """`accepts(token)` for the sequence's constraint after its completion so far."""
        constraint, completion = seq.params.constraint, seq.completion_token_ids
        known = self.seen.setdefault((id(constraint), tuple(completion)), {})
        text = None

        def accepts(token: int) -> bool:
            nonlocal text
            if token not in known:
                if text is None:
                    text = CompletionText(*self.decoder, completion)
                known[token] = constraint.accepts(text.after(token), text.start)
                self.stats.checked += 1
                self.stats.vetoed += not known[token]
            return known[token]

        return accepts
