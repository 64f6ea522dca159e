"""Which rows of a batch the trainer runs together: its micro-batches.

Rows of one micro-batch that start with the same prompt tokens run that shared prefix once
(`rl.algo.logprobs`), so the cut decides how many tokens a forward and backward run, and how much memory they
hold. 64 rows of one database's questions share its schema; 64 rows of two databases share only the system
prompt, and every row then runs its schema again (a dynamic-sampling step whose second round drew another
database ran out of 24 GB that way). Where the loss is a sum of per-row terms (`Aggregation.rows_add_up`),
every cut gives the same loss and gradient, and the rows are cut where that runs the fewest tokens; otherwise
(bnpo's micro-batch means) they go in runs of micro_batch_size, in order.
"""

from __future__ import annotations

import torch

from rl.algo.batch import RolloutBatch

# What a micro-batch costs besides its tokens (a forward and backward through every layer, from Python), as
# tokens: a cut pays only where it saves more than this, so a token two prompts share by chance moves nothing
RUN_COST_TOKENS = 64


def micro_batch_slices(
    batch: RolloutBatch, micro_batch_size: int, follow_prompts: bool = True
) -> list[slice]:
    """The batch's rows, in order, as runs of at most `micro_batch_size`.

    With `follow_prompts`, the runs are those that minimise the tokens run plus RUN_COST_TOKENS a run: a run
    of rows sharing their first s tokens counts them once, s + sum(length - s), where s stops before the run's
    first loss column as the packed forward's prefix does. Of equally cheap cuts, the one with the fewest
    runs; of those, the one with the longest leading runs (so rows that share nothing get the fixed cut).
    """
    n = batch.num_sequences
    if not follow_prompts or n < 2:
        return [slice(start, min(start + micro_batch_size, n)) for start in range(0, n, micro_batch_size)]
    lengths = batch.attention_mask.sum(dim=1).tolist()
    shared = adjacent_shared_prefixes(batch)
    # best[j]: (cost, runs) of the cheapest cut of the first j rows, whose last run starts at cut[j]
    best: list[tuple[int, int]] = [(0, 0)] * (n + 1)
    cut = [0] * (n + 1)
    for stop in range(1, n + 1):
        total, prefix = 0, None
        for start in range(stop - 1, max(0, stop - micro_batch_size) - 1, -1):
            total += lengths[start]
            if start < stop - 1:
                prefix = shared[start] if prefix is None else min(prefix, shared[start])
            tokens = total if prefix is None else total - (stop - start - 1) * prefix
            candidate = (best[start][0] + tokens + RUN_COST_TOKENS, best[start][1] + 1)
            if start == stop - 1 or candidate < best[stop]:
                best[stop], cut[stop] = candidate, start
    slices, stop = [], n
    while stop > 0:
        slices.append(slice(cut[stop], stop))
        stop = cut[stop]
    return slices[::-1]


@torch.no_grad()
def adjacent_shared_prefixes(batch: RolloutBatch) -> list[int]:
    """For each pair of neighbouring rows (k, k+1): how many leading tokens both attend to and hold alike,
    stopping before the first loss column of either (a prefix the packed forward can run once)."""
    mask = batch.attention_mask.bool()
    ids = batch.input_ids
    same = (ids[1:] == ids[:-1]) & mask[1:] & mask[:-1]
    common = same.long().cumprod(dim=1).sum(dim=1)
    has_loss = batch.loss_mask.any(dim=1)
    first = torch.where(has_loss, batch.loss_mask.float().argmax(dim=1).long(), mask.sum(dim=1))
    limit = (torch.minimum(first[1:], first[:-1]) - 1).clamp(min=0)
    return torch.minimum(common, limit).tolist()
