"""Sampling one step: from the step's logits, each sampled row's next token (one row per sample, n of them for
a prompt that forks into its group in this step), its logprob, its top alternatives and, for a constrained
row, the support it was sampled among, under each row's SamplingParams, read back to the host in the step's
one sync."""

from __future__ import annotations

import torch

from rollout_engine.constraints import ConstrainedRow, ConstraintStats, candidates, constrain
from rollout_engine.sampler import SamplingBatch, sample, top_logprobs
from rollout_engine.sequence import Sequence

SampledRow = tuple[
    int, float, list[tuple[int, float]], tuple[int, ...]
]  # token, logprob, alternatives, support (the tokens the logprob is normalised over; empty: all)


def sample_step(
    logits: torch.Tensor, sampling: list[Sequence], tokenizer, constraint_stats: ConstraintStats
) -> list[SampledRow]:
    """The rows of `logits` sampled, in order: each sequence of `sampling` gives its
    num_samples_at_next_token rows, one per rng."""
    seqs = [seq for seq in sampling for _ in range(seq.num_samples_at_next_token)]
    rngs = [rng for seq in sampling for rng in seq.rngs]
    params = [seq.params for seq in seqs]
    batch = SamplingBatch(
        [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params], rngs
    )
    tokens, logprobs = sample(logits, batch)
    num_top = max((p.top_logprobs for p in params), default=0)
    values = [tokens.double(), logprobs.double()]
    if num_top:  # the alternatives travel in the same sync, as k ids then k logprobs per row
        top_values, top_ids = top_logprobs(logits, batch.temperatures, num_top)
        values.append(torch.cat((top_ids.double(), top_values.double()), dim=1).flatten())
    constrained = [i for i, p in enumerate(params) if p.constraint is not None]
    if constrained:  # so do a constrained row's candidates, k ids then k probabilities
        at = torch.tensor(constrained, device=logits.device)
        probs, ids = candidates(logits[at], [batch.temperatures[i] for i in constrained])
        values.append(torch.cat((ids.double(), probs.double()), dim=1).flatten())
    flat = torch.cat(values).tolist()  # the step's one sync
    rows = _rows(flat, len(params), num_top)
    if constrained:
        k = ids.size(1)
        synced = flat[len(flat) - 2 * k * len(constrained) :]
        asked = []
        for n, i in enumerate(constrained):
            part = synced[2 * k * n : 2 * k * (n + 1)]
            asked.append(
                ConstrainedRow(seqs[i], i, rows[i][0], rows[i][1], [int(t) for t in part[:k]], part[k:])
            )
        for i, (token, logprob, support) in zip(
            constrained, constrain(batch, asked, tokenizer, constraint_stats), strict=True
        ):
            rows[i] = (token, logprob, rows[i][2], support)
    return rows


def _rows(flat: list[float], num_rows: int, num_top: int) -> list[SampledRow]:
    """The step's synced values back into rows: flat holds the rows' tokens, then their logprobs, then per row
    num_top alternative ids followed by their num_top logprobs."""
    tokens, logprobs, tops = flat[:num_rows], flat[num_rows : 2 * num_rows], flat[2 * num_rows :]
    width = 2 * num_top
    rows = []
    for i in range(num_rows):
        top = tops[i * width : (i + 1) * width]
        pairs = [(int(token), logprob) for token, logprob in zip(top[:num_top], top[num_top:], strict=True)]
        rows.append((int(tokens[i]), logprobs[i], pairs, ()))
    return rows
