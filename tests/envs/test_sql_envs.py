"""env=sql and env=sql_multiturn driven by scripted actions on the staff database."""

import pytest

from envs import step_episodes
from envs.sql import SqlEnv, SqlMultiTurnEnv

GOLD = "SELECT name FROM emp WHERE dept = 'Research'"


@pytest.fixture()
def task(staff_db):
    return {
        "question": "Who works in Research?",
        "db_path": staff_db,
        "gold_sql": GOLD,
        "schema": "CREATE ...",
    }


def test_single_turn_rewards(task):
    env = SqlEnv()
    cases = {
        "```sql\nSELECT name FROM emp WHERE dept = 'Research';\n```": (
            1.0,
            {"execution": 1.0, "validity": 0.0},
        ),
        "```sql\nSELECT name FROM emp WHERE salary > 70000\n```": (1.0, {"execution": 1.0, "validity": 0.0}),
        "```sql\nSELECT name FROM emp\n```": (0.0, {"execution": 0.0, "validity": 0.0}),
        "I don't know.": (-0.1, {"execution": 0.0, "validity": -0.1}),
        "```sql\nSELECT name FROM employees\n```": (-0.1, {"execution": 0.0, "validity": -0.1}),
    }
    for action, (reward, components) in cases.items():
        result = env.start(task).step(action)
        assert result.done and result.observation is None
        assert result.reward == pytest.approx(reward)
        assert result.rewards == pytest.approx(components)


def test_penalties_and_format_component_are_configurable(task):
    env = SqlEnv(no_sql_penalty=0.5, error_penalty=0.25, format_weight=0.5)
    fenced = env.start(task).step(f"```sql\n{GOLD}\n```")
    assert fenced.reward == pytest.approx(1.5) and fenced.rewards["format"] == 1.0
    bare = env.start(task).step(GOLD)
    assert bare.reward == pytest.approx(1.0) and bare.rewards["format"] == 0.0
    assert env.start(task).step("no idea").reward == pytest.approx(-0.5)
    assert env.start(task).step("```sql\nSELECT x FROM nowhere\n```").reward == pytest.approx(-0.25 + 0.5)
    with pytest.raises(ValueError, match="penalties"):
        SqlEnv(error_penalty=-1)


def test_single_turn_messages_and_misuse(task, staff_db):
    episode = SqlEnv().start(task)
    assert episode.max_turns == 1
    assert episode.messages[1]["content"].endswith("Question: Who works in Research?")
    assert "CREATE ..." in episode.messages[1]["content"]
    episode.step(GOLD)
    with pytest.raises(RuntimeError, match="over"):
        episode.step(GOLD)
    sampled = SqlEnv(sample_rows=1).start(task).messages[1]["content"]
    assert "CREATE TABLE emp" in sampled and "1 | Ann | Sales" in sampled
    with pytest.raises(ValueError, match="gold_sql"):
        SqlEnv().start({"question": "q", "db_path": staff_db})


def test_multi_turn_explore_then_answer(task):
    env = SqlMultiTurnEnv()
    episode = env.start(task)
    assert episode.max_turns == 5 and "<answer>" in episode.messages[0]["content"]
    first = episode.step("Let me look.\n<sql>SELECT name, dept FROM emp WHERE id <= 2</sql>")
    assert not first.done and first.reward == 0.0
    assert first.observation == "\n<observation>\nname | dept\nAnn | Sales\nBob | Sales\n</observation>\n"
    second = episode.step("<sql>SELECT nope FROM emp</sql>")
    assert not second.done and "Error:" in second.observation and "no such column: nope" in second.observation
    final = episode.step(f"Now I know.\n<answer>{GOLD}</answer>")
    assert final.done and final.observation is None and final.reward == 1.0
    assert final.info["turns"] == 3 and final.rewards == {"execution": 1.0, "validity": 0.0}


def test_multi_turn_runs_out_of_turns(task):
    episode = SqlMultiTurnEnv(max_turns=2).start(task)
    assert not episode.step("<sql>SELECT 1</sql>").done
    last = episode.step(f"<sql>{GOLD}</sql>")
    assert last.done and last.reward == 0.0 and last.observation is None
    assert last.rewards == {"execution": 0.0, "validity": 0.0} and "ran out of turns" in last.info["reason"]
    with pytest.raises(RuntimeError, match="over"):
        episode.step(f"<answer>{GOLD}</answer>")


def test_multi_turn_malformed_tags(task):
    episode = SqlMultiTurnEnv(max_turns=4).start(task)
    for action in ("SELECT name FROM emp", "<sq>SELECT 1</sq>", "</sql> SELECT 1"):
        result = episode.step(action)
        assert not result.done and result.reward == 0.0 and result.info["malformed"]
        assert "no <sql>...</sql> query or <answer>...</answer> found" in result.observation
    # A tag left open when generation stops on the closer still counts.
    final = episode.step(f"<answer>{GOLD}")
    assert final.done and final.reward == 1.0


def test_multi_turn_wrong_or_broken_answers(task):
    env = SqlMultiTurnEnv()
    assert env.start(task).step("<answer>SELECT name FROM emp</answer>").reward == 0.0
    assert env.start(task).step("<answer>SELECT nope</answer>").reward == pytest.approx(-0.1)
    assert env.start(task).step("<answer></answer>").reward == pytest.approx(-0.1)


def test_multi_turn_observation_is_truncated(task):
    episode = SqlMultiTurnEnv(observation_max_rows=2).start(task)
    observation = episode.step("<sql>SELECT id FROM big</sql>").observation
    assert observation == "\n<observation>\nid\n1\n2\n... (more than 2 rows in total)\n</observation>\n"


def test_concurrent_stepping_matches_sequential(task, staff_db):
    env = SqlMultiTurnEnv()
    actions = [f"<sql>SELECT name FROM emp WHERE id = {i % 6 + 1}</sql>" for i in range(16)]
    actions += [f"<answer>{GOLD}</answer>", "<answer>SELECT name FROM emp</answer>"] * 4
    together = step_episodes([env.start(task) for _ in actions], actions)
    one_by_one = [env.start(task).step(a) for a in actions]
    assert together == one_by_one
    assert [r.reward for r in together[16:]] == [1.0, 0.0] * 4


def test_partial_credit_component_and_response_prefix(task):
    env = SqlEnv(partial_weight=0.5, response_prefix="```sql\nSELECT")
    assert env.response_prefix == "```sql\nSELECT"
    # the prefix opened the fence, so the reply's first fence closes it; without one, the opening fence of
    # the reply must not stop generation
    assert env.stop == ("```",) and SqlEnv().stop == ("\n```\n",)
    # every name in emp: the 2 Research names among 6 give an F1 of 0.5
    loose = env.start(task).step("```sql\nSELECT name FROM emp\n```")
    assert loose.rewards == pytest.approx({"execution": 0.0, "partial": 0.5, "validity": 0.0})
    assert loose.reward == pytest.approx(0.25)
    exact = env.start(task).step(f"```sql\n{GOLD}\n```")
    assert exact.reward == pytest.approx(1.5) and exact.rewards["partial"] == 1.0
    broken = env.start(task).step("```sql\nSELECT name FROM employees\n```")
    assert broken.reward == pytest.approx(-0.1) and broken.rewards["partial"] == 0.0
    with pytest.raises(ValueError, match="partial_weight"):
        SqlEnv(partial_weight=-0.5)
    assert SqlMultiTurnEnv(partial_weight=0.5).rewards.terms["partial"][1] == 0.5


@pytest.mark.parametrize("env_class", [SqlEnv, SqlMultiTurnEnv])
@pytest.mark.parametrize(
    "change, message",
    [
        ({"db_path": "/no/such/staff.sqlite"}, "db_path='/no/such/staff.sqlite' does not exist"),
        ({"question": None}, "the task's 'question' is None; it must be a non-empty string"),
        ({"gold_sql": "  "}, "has neither a 'gold_sql' nor an 'answer'"),
        ({"gold_sql": "", "answer": ""}, "has neither a 'gold_sql' nor an 'answer'"),
    ],
)
def test_a_task_the_env_cannot_play_is_refused_before_any_reward(task, env_class, change, message):
    bad = {**task, **change}  # the row still carries a schema, so a prompt could be written without the file
    env = env_class()
    with pytest.raises(ValueError, match=message):
        env.check_task(bad)
    with pytest.raises(ValueError, match=message):
        env.start(bad)
    env.check_task(task)
