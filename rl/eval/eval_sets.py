"""The sets a run is scored on: the env's held-out tasks and, when configured, a transfer set.

The transfer set (``transfer=spider_heldout``) is the test split of a second task source, such as real
questions on databases the env never generates, scored with the same env, prompt and greedy settings as the
held-out set, so a run shows how what it learns carries over. Both are sampled the same way
(`held_out_tasks`), sharded over the ranks, gathered, scored from their per-task outcomes, and written to
the run directory by rank 0;
``mode=eval eval.samples=K`` also scores them by pass@k from K samples per task (`score_samples`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from envs.tasks import task_splits
from rl.eval.evaluate import EvalResult, score
from rl.eval.outcomes import TaskOutcome, mark_repeats, outcome_path, write_outcomes
from rl.eval.pass_at_k import PassAtK, TaskSamples, ks_up_to, passk_path, score_pass_at_k
from rl.job import distributed as dp

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
    path = outcome_path(run_dir, eval_set.name, stage, step) if run_dir is not None else None
    return score(_play_set(play, eval_set, dist, path), eval_set.labels)


def score_samples(
    play: Callable[[Sequence[dict[str, Any]]], list[TaskSamples]],
    eval_set: EvalSet,
    num_samples: int,
    dist: dp.DistInfo,
    run_dir: str | os.PathLike | None,
    stage: str,
    step: int,
) -> PassAtK:
    """pass@k of the set, for k = 1, 2, 4 ... `num_samples`, from `play` (tasks -> each task's sample
    counts), sharded and gathered like `score_eval_set`; rank 0 writes the counts to
    ``RUN_DIR/evals/<set>_passk_<stage>_<step>.jsonl``."""
    path = passk_path(run_dir, eval_set.name, stage, step) if run_dir is not None else None
    counts = _play_set(play, eval_set, dist, path)
    return score_pass_at_k(counts, ks_up_to(num_samples), eval_set.labels)


def _play_set(play: Callable, eval_set: EvalSet, dist: dp.DistInfo, path: os.PathLike | None) -> list:
    """Every task's record (an outcome, or sample counts: what `play` returns), in the set's order, with
    repeated tasks' keys numbered; rank 0 writes them to `path`."""
    local = play(dp.shard(list(eval_set.tasks), dist))
    records = dp.gather_shards(local, dist)
    mark_repeats(records)
    if dist.is_main and path is not None:
        write_outcomes(path, records)
    return records
