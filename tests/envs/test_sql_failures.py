"""Why a SQL answer failed (`ExecutionMatchEnv.failure`): each kind from a reply SQLite itself refuses or runs
on the staff database, played through env=sql and env=sql_multiturn."""

import pytest

from envs import BaseEnv
from envs.sql import SqlEnv, SqlMultiTurnEnv
from envs.sql.execution_env import sql_failure
from rl.rollout.play import Trajectory

GOLD = "SELECT name FROM emp WHERE dept = 'Research'"
# a recursive CTE that never ends: only the sandbox's time limit stops it
RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture()
def task(staff_db):
    return {"question": "Who works in Research?", "db_path": staff_db, "gold_sql": GOLD}


def played(step) -> Trajectory:
    """The step as the training loop records an episode's last step."""
    return Trajectory(prompt_ids=[], reward=step.reward, rewards=dict(step.rewards), info=step.info)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (f"```sql\n{GOLD}\n```", None),
        ("```sql\nSELECT name FROM emp\n```", "wrong result"),
        ("```sql\nSELECT name FROM employees\n```", "unknown table"),
        ("```sql\nSELECT fullname FROM emp\n```", "unknown column"),
        ("```sql\nSELECT name FROM emp WHERE\n```", "syntax error"),
        ("```sql\nSELECT name FROM emp WHERE dept = 'Research\n```", "syntax error"),
        ("```sql\nSELECT nme(name) FROM emp\n```", "other error"),
        ("I do not know.", "no SQL"),
    ],
)
def test_single_turn_failure_kinds(task, reply, kind):
    env = SqlEnv()
    episode = played(env.start(task).step(reply))
    assert env.is_success(episode) == (kind is None)
    assert env.failure(episode) == kind


def test_a_query_past_the_time_limit_is_a_timeout(task):
    env = SqlEnv(timeout_s=0.3)
    assert env.failure(played(env.start(task).step(f"```sql\n{RUNAWAY}\n```"))) == "timeout"


def test_multi_turn_failure_kinds(task):
    env = SqlMultiTurnEnv(max_turns=2)
    out_of_turns = env.start(task)
    out_of_turns.step("<sql>SELECT 1</sql>")
    assert env.failure(played(out_of_turns.step("<sql>SELECT 2</sql>"))) == "no answer"
    explored = env.start(task)
    # an exploratory query's error is not the answer's: the answer decides
    explored.step("<sql>SELECT nope FROM emp</sql>")
    assert env.failure(played(explored.step("<answer>SELECT name FROM dept</answer>"))) == "wrong result"
    unknown = env.start(task).step("<answer>SELECT x FROM staff</answer>")
    assert env.failure(played(unknown)) == "unknown table"
    assert env.failure(played(env.start(task).step(f"<answer>{GOLD}</answer>"))) is None


def test_an_episode_cut_before_any_graded_answer_is_no_answer():
    # the last step the loop saw was an exploration (the token budget ended the episode there)
    assert sql_failure({"sql": "SELECT 1", "ok": True}) == "no answer"


class SilentEnv(BaseEnv):
    """A plugin that keeps BaseEnv's failure: it names none."""

    max_turns = 1

    def start(self, task):
        raise NotImplementedError


class LabelledEnv(SilentEnv):
    """A plugin that names its failures."""

    def failure(self, episode):
        return "negative" if episode.reward < 0 else None


def test_a_plugin_names_its_failures_and_the_default_names_none():
    env = LabelledEnv()
    assert env.failure(Trajectory(prompt_ids=[], reward=-1.0)) == "negative"
    assert env.failure(Trajectory(prompt_ids=[], reward=0.0)) is None
    assert SilentEnv().failure(Trajectory(prompt_ids=[], reward=-1.0)) is None
