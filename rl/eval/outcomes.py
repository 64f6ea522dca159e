"""Per-task outcomes of an evaluation, one JSONL line per task, so two runs scored on the same tasks pair up.

A run writes ``RUN_DIR/evals/<set>_<stage>_<step>.jsonl`` at every evaluation (``held_out_grpo_40.jsonl``,
``transfer_base_0.jsonl``); ``python -m rl.eval.compare`` pairs two such files by their ``key``.

A task's key is a hash of what the task is, not of where its files lie: its ``db_id``, ``question`` and
``gold_sql`` (those it has; the whole row but ``db_path`` when it has none of them). Identical rows in one set
(a data set may repeat a question) get ``#2``, ``#3`` ... in the order of the set, which is the same in every
run that draws the set with the same seed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVALS_DIR = "evals"
KEY_FIELDS = ("db_id", "question", "gold_sql")
MAX_TEXT_CHARS = 2000  # a completion longer than this is cut: the files stay small, the SQL is at its start
MAX_QUESTION_CHARS = 300


@dataclass(slots=True)
class TaskOutcome:
    """How one task went: its key, its label values (family, db_id ...), success, reward, the reply, and for
    a task not solved, why, when the env says (``BaseEnv.failure``)."""

    key: str
    success: bool
    reward: float
    labels: dict[str, str] = field(default_factory=dict)
    question: str = ""
    completion: str = ""
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            **self.labels,
            "success": int(self.success),
            "reward": self.reward,
            "question": self.question,
            "completion": self.completion,
            "failure": self.failure,
        }


def task_key(task: Mapping[str, Any]) -> str:
    """A stable 16-hex-digit key for a task row (see the module docstring)."""
    fields = {name: task[name] for name in KEY_FIELDS if name in task}
    if not fields:
        fields = {name: value for name, value in task.items() if name != "db_path"}
    text = json.dumps(fields, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def mark_repeats(outcomes: Sequence[TaskOutcome]) -> None:
    """Add ``#n`` to the key of the n-th repeat of an identical task, in place; run on the whole set in its
    order (after the ranks' shards are gathered), so every run numbers the repeats alike."""
    seen: dict[str, int] = {}
    for outcome in outcomes:
        seen[outcome.key] = seen.get(outcome.key, 0) + 1
        if seen[outcome.key] > 1:
            outcome.key = f"{outcome.key}#{seen[outcome.key]}"


def outcome_of(
    task: Mapping[str, Any],
    success: bool,
    reward: float,
    completion: str,
    labels: Sequence[str],
    failure: str | None = None,
) -> TaskOutcome:
    """A task's outcome: its key, its value of each of `labels` it has (as a string), its question and
    completion, cut to a few thousand characters, and why it failed (`failure`, None when solved or
    unknown)."""
    return TaskOutcome(
        key=task_key(task),
        success=success,
        reward=reward,
        labels={label: str(task[label]) for label in labels if label in task},
        question=_clip(str(task.get("question", "")), MAX_QUESTION_CHARS),
        completion=_clip(completion, MAX_TEXT_CHARS),
        failure=None if success else failure,
    )


def outcome_path(run_dir: str | os.PathLike, set_name: str, stage: str, step: int) -> Path:
    """Where an evaluation's outcomes go: ``RUN_DIR/evals/<set>_<stage>_<step>.jsonl``."""
    return Path(run_dir) / EVALS_DIR / f"{set_name}_{stage}_{step}.jsonl"


def write_outcomes(path: str | os.PathLike, outcomes: Sequence[TaskOutcome]) -> Path:
    """Write the outcomes as JSONL, atomically (a reader never sees half a file); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for outcome in outcomes:
            f.write(json.dumps(outcome.as_dict(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
