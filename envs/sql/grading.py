"""Grading a completion against a task's reference (its gold query's result, or its answer:
``envs.sql.answers``), and the SQL reward components built on it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from envs.rewards import WeightedRewards
from envs.sql.answers import ANSWER, reference
from envs.sql.match import result_overlap, results_match, run_for_grading
from envs.sql.prompts import extract_sql

EXECUTION = "execution"  # the reward component of the execution match
_SQL_FENCE = re.compile(r"```[ \t]*sql\b.*?```", re.DOTALL | re.IGNORECASE)


@dataclass(slots=True, frozen=True)
class SqlGrade:
    """The extracted query (None when there was none), whether it ran, whether it matched, its error, and
    its partial credit (``match.result_overlap``: 1.0 for a match, 0.0 when it did not run)."""

    sql: str | None
    ok: bool
    match: bool
    error: str | None
    overlap: float = 0.0


@lru_cache(maxsize=4096)
def _grade_sql(db_path: str, gold_sql: str, answer: str, sql: str, timeout_s: float) -> SqlGrade:
    pred = run_for_grading(db_path, sql, timeout_s)
    if not pred.ok:
        return SqlGrade(sql, False, False, pred.error)
    expected, ordered = reference({"db_path": db_path, "gold_sql": gold_sql, ANSWER: answer}, timeout_s)
    match = results_match(expected, pred, ordered=ordered)
    return SqlGrade(sql, True, match, None, 1.0 if match else result_overlap(expected, pred))


def grade_completion(task: Mapping[str, Any], completion: str, timeout_s: float = 2.0) -> SqlGrade:
    """Extract the SQL from ``completion`` and compare its result on ``task['db_path']`` with the task's
    reference: its ``gold_sql``'s result, or its ``answer`` when it has no gold query.

    Results are cached, so several reward components can grade the same completion for the price of one.
    """
    sql = extract_sql(completion)
    if sql is None:
        return SqlGrade(None, False, False, "no SQL query found in the completion")
    gold_sql, answer = task.get("gold_sql") or "", task.get(ANSWER) or ""
    return _grade_sql(task["db_path"], gold_sql, answer, sql, timeout_s)


def execution_reward(task: Mapping[str, Any], completion: str, timeout_s: float = 2.0) -> float:
    """1.0 when the completion's query matches the reference result, else 0.0."""
    return float(grade_completion(task, completion, timeout_s).match)


def partial_reward(task: Mapping[str, Any], completion: str, timeout_s: float = 2.0) -> float:
    """Partial credit in [0, 1] for a query that ran: how much of the reference result it returned."""
    return grade_completion(task, completion, timeout_s).overlap


def validity_penalty(
    task: Mapping[str, Any],
    completion: str,
    no_sql_penalty: float,
    error_penalty: float,
    timeout_s: float = 2.0,
) -> float:
    """Minus ``no_sql_penalty`` when no SQL was found, minus ``error_penalty`` when it failed, else 0."""
    grade = grade_completion(task, completion, timeout_s)
    if grade.sql is None:
        return -no_sql_penalty
    return 0.0 if grade.ok else -error_penalty


def sql_fence_format(task: Mapping[str, Any], completion: str) -> float:
    """1.0 when the completion holds exactly one ```sql fenced block, as the single-turn prompt asks."""
    return float(len(_SQL_FENCE.findall(completion)) == 1)


def check_reward_args(no_sql_penalty: float, error_penalty: float, partial_weight: float) -> None:
    """Penalties are magnitudes (subtracted from the reward) and partial credit is a bonus: all >= 0."""
    for name, value, why in [
        ("no_sql_penalty", no_sql_penalty, "penalties are subtracted from the reward"),
        ("error_penalty", error_penalty, "penalties are subtracted from the reward"),
        ("partial_weight", partial_weight, "partial credit is added to the reward"),
    ]:
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}: {why}")


def sql_rewards(
    no_sql_penalty: float,
    error_penalty: float,
    format_weight: float,
    timeout_s: float,
    partial_weight: float = 0.0,
) -> WeightedRewards:
    """Components ``execution`` (EXECUTION, weight 1), ``validity`` (penalties, weight 1), and the optional
    ``partial`` (result overlap, dense credit that gives a weak policy a gradient before it gets answers
    right) and ``format``."""
    return WeightedRewards(
        {
            EXECUTION: (partial(execution_reward, timeout_s=timeout_s), 1.0),
            "partial": (partial(partial_reward, timeout_s=timeout_s), partial_weight),
            "validity": (
                partial(
                    validity_penalty,
                    no_sql_penalty=no_sql_penalty,
                    error_penalty=error_penalty,
                    timeout_s=timeout_s,
                ),
                1.0,
            ),
            "format": (sql_fence_format, format_weight),
        }
    )
