"""Task sources: what an ``env.tasks`` target returns, checked row by row and split into train and test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import hydra
from datasets import Dataset, DatasetDict
from hydra.errors import InstantiationException

from envs.base import BaseEnv, EnvError

SPLITS = ("train", "test")
TEST_FRACTION = 0.1


def call_task_source(spec: Mapping[str, Any]) -> Any:
    """What the task source ``spec`` (a ``_target_`` with its arguments, as in ``env.tasks``) returns.

    A source that refuses its arguments (a dataset root that is not there, a bad split setting) or whose
    target cannot be imported stops the run with the source's own message, named by its target; anything
    else it raises is a bug in the source and keeps its traceback.
    """
    try:
        return hydra.utils.call(spec)
    except InstantiationException as err:
        if isinstance(err.__cause__, (ValueError, OSError, ImportError)):
            raise EnvError(f"the task source {spec.get('_target_')}: {err.__cause__}") from None
        raise


def task_splits(tasks: Any, env: BaseEnv, source: str, seed: int) -> DatasetDict:
    """The train and test splits of what the task source ``source`` returned.

    A ``DatasetDict`` (or mapping) with ``train`` and ``test`` Datasets is used as it is; one ``Dataset`` is
    split 90/10 with ``seed``. Every row goes through the env's ``check_task`` first, so a row the env cannot
    play stops the run at start-up with its split and index named.
    """
    if isinstance(tasks, Dataset):
        _check_rows(tasks, env, f"row {{}} of the tasks from {source}")
        if len(tasks) < 2:
            raise EnvError(f"the task source {source} returned {len(tasks)} task(s); it needs at least 2")
        return tasks.train_test_split(test_size=TEST_FRACTION, seed=seed)
    if not isinstance(tasks, Mapping) or not all(isinstance(tasks.get(s), Dataset) for s in SPLITS):
        raise EnvError(
            f"the task source {source} returned {_describe(tasks)}; it must return a datasets.DatasetDict "
            "with 'train' and 'test' splits, or one datasets.Dataset that is split 90/10 "
            "(for a list of dict rows: datasets.Dataset.from_list(rows))"
        )
    for split in SPLITS:
        if len(tasks[split]) == 0:
            raise EnvError(f"the task source {source} returned an empty {split!r} split")
        _check_rows(tasks[split], env, f"row {{}} of the {split!r} split from {source}")
    return DatasetDict({split: tasks[split] for split in SPLITS})


def _check_rows(rows: Dataset, env: BaseEnv, where: str) -> None:
    for index, row in enumerate(rows):
        try:
            env.check_task(row)
        except ValueError as exc:
            raise EnvError(f"task {where.format(index)}: {exc}") from None


def _describe(tasks: Any) -> str:
    if isinstance(tasks, Mapping):
        return f"a {type(tasks).__name__} with keys {sorted(map(str, tasks))}"
    return f"a {type(tasks).__name__}"
