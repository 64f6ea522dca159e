"""``env=sql``: one question, one answer; 1.0 for an execution match, small penalties for no or bad SQL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envs.base import StepResult
from envs.rewards import WeightedRewards
from envs.sql.answers import has_gold_sql
from envs.sql.execution_env import ExecutionMatchEnv
from envs.sql.grading import check_reward_args, grade_completion, sql_rewards
from envs.sql.prompts import SINGLE_TURN_INSTRUCTIONS, check_schema_style, task_messages
from envs.sql.schema_constraint import SchemaNames, schema_names


class SqlEpisode:
    """A single-turn text-to-SQL episode."""

    max_turns = 1

    def __init__(
        self,
        task: Mapping[str, Any],
        messages: list[dict[str, str]],
        rewards: WeightedRewards,
        timeout_s: float,
        constraint: SchemaNames | None = None,
    ):
        self.task = task
        self.messages = messages
        self.constraint = constraint
        self.done = False
        self._rewards = rewards
        self._timeout_s = timeout_s

    def step(self, action_text: str) -> StepResult:
        """Grade the completion; the episode ends after this one step."""
        if self.done:
            raise RuntimeError("this SQL episode is over: it takes exactly one step; start a new one")
        self.done = True
        breakdown = self._rewards(self.task, action_text)
        grade = grade_completion(self.task, action_text, self._timeout_s)
        info = {"sql": grade.sql, "match": grade.match, "error": grade.error}
        return StepResult(None, breakdown.total, True, info=info, rewards=breakdown.components)


class SqlEnv(ExecutionMatchEnv):
    """Single-turn text-to-SQL over rows with ``question``, ``db_path``, a ``gold_sql`` or an ``answer``
    (``envs.sql.answers``), and ``schema``.

    ``constrain_names``: each episode carries the engine a constraint
    (``envs.sql.schema_constraint.SchemaNames``) that keeps its reply to the tables and columns of its
    database, where each is used."""

    max_turns = 1

    def __init__(
        self,
        no_sql_penalty: float = 0.1,
        error_penalty: float = 0.1,
        format_weight: float = 0.0,
        timeout_s: float = 2.0,
        sample_rows: int = 0,
        schema_style: str = "ddl",
        instructions: str = SINGLE_TURN_INSTRUCTIONS,
        partial_weight: float = 0.0,
        response_prefix: str = "",
        constrain_names: bool = False,
    ) -> None:
        check_reward_args(no_sql_penalty, error_penalty, partial_weight)
        check_schema_style(schema_style)
        self.rewards = sql_rewards(no_sql_penalty, error_penalty, format_weight, timeout_s, partial_weight)
        self.timeout_s = timeout_s
        self.sample_rows = sample_rows
        self.schema_style = schema_style
        self.instructions = instructions
        self.response_prefix = response_prefix
        self.constrain_names = constrain_names
        # Generation ends at the closing fence of the ```sql block: nothing after it is graded. When the
        # prefix opened the fence, the reply's first fence is the closing one, even on the query's own line.
        self.stop = ("```",) if "```" in response_prefix else ("\n```\n",)

    def demonstration(self, task: Mapping[str, Any]) -> str | None:
        """The ideal reply to ``task``: its gold query in a ```sql fence (what a warm start trains on); None
        for a task known only by its answer."""
        return f"```sql\n{task['gold_sql']}\n```" if has_gold_sql(task) else None

    def start(self, task: Mapping[str, Any]) -> SqlEpisode:
        """Open an episode whose messages hold the schema and the question."""
        messages = task_messages(task, self.instructions, self.sample_rows, self.schema_style)
        constraint = None
        if self.constrain_names:  # the engine keeps the reply to the names of the task's database
            constraint = SchemaNames(schema_names(task["db_path"]), self.response_prefix)
        return SqlEpisode(task, messages, self.rewards, self.timeout_s, constraint)
