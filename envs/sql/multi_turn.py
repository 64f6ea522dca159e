"""``env=sql_multiturn``: explore with ``<sql>...</sql>``, read ``<observation>``, finish with ``<answer>``.

The reward is computed on the final answer only; running out of turns without an answer scores 0. An action
with neither tag is answered with an observation that explains the format, and it uses up a turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from envs.base import StepResult
from envs.rewards import WeightedRewards
from envs.sql.answers import has_gold_sql
from envs.sql.execution_env import ExecutionMatchEnv
from envs.sql.grading import check_reward_args, grade_completion, sql_rewards
from envs.sql.prompts import check_schema_style, format_result, task_messages
from envs.sql.sandbox import execute
from envs.sql.schema_constraint import SQL_TAGS, SchemaNames, schema_names

MULTI_TURN_INSTRUCTIONS = (
    "You are an expert SQLite assistant. Answer the question about the database below. You may explore it "
    "first: write one query as <sql>SELECT ...</sql> and you will receive its result as "
    "<observation>...</observation>. When you are sure, give your final query as "
    "<answer>SELECT ...</answer>. You have at most {max_turns} turns."
)
_ANSWER_TAG = re.compile(r"<answer>", re.IGNORECASE)
# An unclosed tag runs to the end of the text: generation often stops on the closing tag itself.
_SQL_TAG = re.compile(r"<sql>(.*?)(?:</sql>|\Z)", re.DOTALL | re.IGNORECASE)
_FORMAT_HINT = (
    "Error: no <sql>...</sql> query or <answer>...</answer> found. Write <sql>SELECT ...</sql> to run a "
    "query, or <answer>SELECT ...</answer> to give your final query."
)


def _observation(text: str) -> str:
    return f"\n<observation>\n{text}\n</observation>\n"


class SqlMultiTurnEpisode:
    """A text-to-SQL episode with up to ``max_turns`` actions."""

    def __init__(
        self,
        task: Mapping[str, Any],
        messages: list[dict[str, str]],
        env: SqlMultiTurnEnv,
        constraints: tuple[SchemaNames, SchemaNames] | None = None,
    ) -> None:
        self.task = task
        self.messages = messages
        self._constraints = constraints  # the first reply's (after the response prefix), the later ones'
        self.max_turns = env.max_turns
        self.num_turns = 0
        self.done = False
        self._env = env

    @property
    def constraint(self) -> SchemaNames | None:
        """The engine's constraint on the queries of the next reply (`envs.sql.schema_constraint`)."""
        if self._constraints is None:
            return None
        return self._constraints[min(self.num_turns, 1)]

    def step(self, action_text: str) -> StepResult:
        """Run an exploratory query, grade a final answer, or explain the expected tags."""
        if self.done:
            raise RuntimeError(f"this SQL episode is over after {self.num_turns} turns; start a new one")
        self.num_turns += 1
        env = self._env
        if _ANSWER_TAG.search(action_text):
            self.done = True
            breakdown = env.rewards(self.task, action_text)
            grade = grade_completion(self.task, action_text, env.timeout_s)
            info = {"sql": grade.sql, "match": grade.match, "error": grade.error, "turns": self.num_turns}
            return StepResult(None, breakdown.total, True, info=info, rewards=breakdown.components)
        queries = _SQL_TAG.findall(action_text)
        if self.num_turns >= self.max_turns:
            self.done = True
            zero = env.rewards.zero()
            info = {"reason": "ran out of turns without an <answer>", "turns": self.num_turns}
            return StepResult(None, zero.total, True, info=info, rewards=zero.components)
        if not queries:
            return StepResult(_observation(_FORMAT_HINT), 0.0, False, info={"malformed": True})
        result = execute(
            self.task["db_path"], queries[-1], timeout_s=env.timeout_s, max_rows=env.observation_max_rows
        )
        text = format_result(result, env.observation_max_rows, env.observation_max_chars)
        return StepResult(_observation(text), 0.0, False, info={"sql": queries[-1].strip(), "ok": result.ok})


class SqlMultiTurnEnv(ExecutionMatchEnv):
    """Multi-turn text-to-SQL in the style of SkyRL-SQL.

    ``constrain_names``: the engine keeps the queries of every reply (in <sql> and <answer>) to the tables and
    columns of the task's database (``envs.sql.schema_constraint.SchemaNames``)."""

    stop = ("</sql>", "</answer>")  # a turn ends where the env takes over

    def __init__(
        self,
        max_turns: int = 5,
        no_sql_penalty: float = 0.1,
        error_penalty: float = 0.1,
        timeout_s: float = 2.0,
        sample_rows: int = 0,
        schema_style: str = "ddl",
        observation_max_rows: int = 10,
        observation_max_chars: int = 1000,
        partial_weight: float = 0.0,
        response_prefix: str = "",
        constrain_names: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        check_reward_args(no_sql_penalty, error_penalty, partial_weight)
        check_schema_style(schema_style)
        self.max_turns = max_turns
        self.rewards: WeightedRewards = sql_rewards(
            no_sql_penalty, error_penalty, 0.0, timeout_s, partial_weight
        )
        self.timeout_s = timeout_s
        self.sample_rows = sample_rows
        self.schema_style = schema_style
        self.observation_max_rows = observation_max_rows
        self.observation_max_chars = observation_max_chars
        self.response_prefix = response_prefix
        self.constrain_names = constrain_names

    def demonstration(self, task: Mapping[str, Any]) -> str | None:
        """The ideal first reply to ``task``: its gold query as the final answer, so a warm start teaches the
        answer format and the SQL, and GRPO then finds when exploring first pays; None for a task known only
        by its answer."""
        return f"<answer>{task['gold_sql']}</answer>" if has_gold_sql(task) else None

    def start(self, task: Mapping[str, Any]) -> SqlMultiTurnEpisode:
        """Open an episode; the instructions state the tags and the turn budget."""
        instructions = MULTI_TURN_INSTRUCTIONS.format(max_turns=self.max_turns)
        messages = task_messages(task, instructions, self.sample_rows, self.schema_style)
        constraints = None
        if self.constrain_names:
            names = schema_names(task["db_path"])
            first = SchemaNames(names, self.response_prefix, SQL_TAGS)
            constraints = (first, SchemaNames(names, "", SQL_TAGS))
        return SqlMultiTurnEpisode(task, messages, self, constraints)
