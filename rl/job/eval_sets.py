"""The sets a run is scored on: the env's held-out tasks and, when configured, a transfer set.

The transfer set (``transfer=spider``) is the test split of a second task source, such as real questions
on databases the env never generates, scored with the same env, prompt and greedy settings as the held-out
set, so a run shows how what it learns carries over. Both are sampled the same way (`held_out_tasks`), sharded
over the ranks, gathered, scored from their per-task outcomes, and written to the run directory by rank 0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from envs.tasks import task_splits
from rl.job import distributed as dp
from rl.job.evaluate import EvalResult, score
from rl.job.outcomes import TaskOutcome, mark_repeats, outcome_path, write_outcomes

HELD_OUT = "held_out"
TRANSFER = "transfer"


@dataclass(slots=True)
class EvalSet:
    """A named set of tasks scored greedily; `labels` are the task fields its accuracy is broken down by."""

    name: str  # held_out | transfer: the prefix of its outcome files and metrics
    tasks: Dataset
    labels: Sequence[str]


def held_out_tasks(test: Dataset, num_tasks: int, seed: int) -> Dataset:
    """The evaluation set: a seeded sample of the test split (task files list tasks grouped by schema and
    family, so the first N would all be one kind)."""
    return test.shuffle(seed=seed).select(range(min(num_tasks, len(test))))


def transfer_set(
    tasks: Any, env: Any, source: str, num_tasks: int, seed: int, labels: Sequence[str]
) -> EvalSet:
    """The transfer set from what the task source `source` returned: its test split (or 10% of one
    Dataset, split by `seed`), every row checked by the env, sampled by `seed` like the held-out set."""
    test = task_splits(tasks, env, source, seed)["test"]
    return EvalSet(TRANSFER, held_out_tasks(test, num_tasks, seed), list(labels))


def score_eval_set(
    play: Callable[[Sequence[dict[str, Any]]], list[TaskOutcome]],
    eval_set: EvalSet,
    dist: dp.DistInfo,
    run_dir: str | os.PathLike | None,
    stage: str,
    step: int,
) -> EvalResult:
    """Play this rank's shard of the set (`play`: tasks -> outcomes), gather the whole set's outcomes,
    and score them; rank 0 writes them to ``RUN_DIR/evals/<set>_<stage>_<step>.jsonl``."""
    local = play(dp.shard(list(eval_set.tasks), dist))
    outcomes = dp.gather_shards(local, dist)
    mark_repeats(outcomes)
    if dist.is_main and run_dir is not None:
        write_outcomes(outcome_path(run_dir, eval_set.name, stage, step), outcomes)
    return score(outcomes, eval_set.labels)
