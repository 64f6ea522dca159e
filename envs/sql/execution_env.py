"""What the SQL envs share: a task is solved by an execution match, and an unsolved one fails for the reason
its last step's SQL shows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.base import BaseEnv, PlayedEpisode, ScoreWords
from envs.sql.grading import EXECUTION
from envs.sql.prompts import check_sql_task

# a held-out success is an execution match; the held-out tasks are on databases that training never sees
SQL_SCORE_WORDS = ScoreWords(success="execution accuracy", tasks="tasks on unseen schemas")
# what SQLite's error says -> the failure it counts as: a query naming what the schema lacks, one that does
# not parse, one that ran too long (the sandbox's limit); any other error is "other error"
_ERROR_KINDS = (
    ("no such table", "unknown table"),
    ("no such column", "unknown column"),
    ("syntax error", "syntax error"),
    ("incomplete input", "syntax error"),
    ("unrecognized token", "syntax error"),
    ("time limit", "timeout"),
)


class ExecutionMatchEnv(BaseEnv):
    """What the SQL envs share: a task is solved when the final query's result matches the gold query's (a
    full ``execution`` component, whatever the penalties and partial credit made the reward), reports call
    that execution accuracy, and every task row is checked at load."""

    score_words = SQL_SCORE_WORDS

    def check_task(self, task: Mapping[str, Any]) -> None:
        """Refuse a task row this env cannot play (see ``prompts.check_sql_task``)."""
        check_sql_task(task)

    def is_success(self, episode: PlayedEpisode) -> bool:
        """An execution match; an episode that failed (no reward components) is not one."""
        return episode.rewards.get(EXECUTION, 0.0) >= 1.0

    def failure(self, episode: PlayedEpisode) -> str | None:
        """Why the final answer missed (``sql_failure``); None for a success."""
        return None if self.is_success(episode) else sql_failure(episode.info)


def sql_failure(info: Mapping[str, Any]) -> str:
    """The failure an unmatched SQL episode's last ``info`` shows: "no answer" (it ended without a graded
    answer: out of turns or tokens), "no SQL" (the answer held no query), "unknown table", "unknown column",
    "syntax error", "timeout", "other error" (SQLite refused the query for another reason) or "wrong result"
    (it ran, and its result is not the gold query's)."""
    if "match" not in info:
        return "no answer"
    if info.get("sql") is None:
        return "no SQL"
    error = info.get("error")
    if error is None:
        return "wrong result"
    return next((kind for needle, kind in _ERROR_KINDS if needle in error), "other error")
