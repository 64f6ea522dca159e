"""Finding envs by name, entry point or dotted path; clear errors; crash-proof stepping; rewards."""

import logging
import textwrap

import pytest
from omegaconf import OmegaConf

from envs import (
    EnvError,
    StepResult,
    WeightedRewards,
    available_envs,
    make_env,
    start_episodes,
    step_episodes,
)
from envs.sql import SqlEnv, SqlMultiTurnEnv

PLUGIN_SOURCE = """
from envs import BaseEnv, StepResult

class Exploding:
    def __init__(self, **kwargs):
        raise RuntimeError("boom in constructor")

class NotAnEnv:
    pass

class FlakyEpisode:
    max_turns = 1
    messages = []
    def step(self, action_text):
        if action_text == "crash":
            raise ZeroDivisionError("flaky step")
        return StepResult(None, 1.0, True)

class FlakyEnv(BaseEnv):
    max_turns = 1
    def start(self, task):
        if task.get("bad"):
            raise KeyError("question")
        return FlakyEpisode()
"""


@pytest.fixture()
def plugin_module(tmp_path, monkeypatch):
    (tmp_path / "local_plugins.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    (tmp_path / "broken_plugin.py").write_text("import module_that_does_not_exist_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "local_plugins"


def test_builtin_names_and_flat_kwargs():
    assert isinstance(make_env("sql"), SqlEnv)
    env = make_env("sql_multiturn", max_turns=3)
    assert isinstance(env, SqlMultiTurnEnv) and env.max_turns == 3
    assert make_env({"name": "sql_multiturn", "timeout_s": 1.0}).timeout_s == 1.0
    assert isinstance(make_env({"_target_": "envs.sql.single_turn.SqlEnv", "format_weight": 0.2}), SqlEnv)
    assert isinstance(make_env("envs.sql.multi_turn:SqlMultiTurnEnv"), SqlMultiTurnEnv)
    assert {"sql", "sql_multiturn"} <= set(available_envs())
    hydra_node = OmegaConf.create({"name": "sql_multiturn", "max_turns": 4, "observation_max_rows": 3})
    assert make_env(hydra_node).observation_max_rows == 3


def test_unknown_name_lists_the_available_ones():
    with pytest.raises(EnvError) as err:
        make_env("sqll")
    assert "unknown env 'sqll'" in str(err.value)
    assert "sql, sql_multiturn" in str(err.value) and "pagedrl.envs" in str(err.value)


def test_broken_plugins_are_named(plugin_module):
    with pytest.raises(EnvError, match=r"'broken_plugin.Env' failed to import: ModuleNotFoundError"):
        make_env({"_target_": "broken_plugin.Env"})
    with pytest.raises(EnvError, match=r"'local_plugins.Missing' failed to import: AttributeError"):
        make_env("local_plugins.Missing")
    with pytest.raises(
        EnvError, match=r"'local_plugins.Exploding'.*failed to construct.*boom in constructor"
    ):
        make_env("local_plugins.Exploding", level=3)
    with pytest.raises(EnvError, match=r"local_plugins.NotAnEnv, which is not an envs.BaseEnv"):
        make_env("local_plugins.NotAnEnv")
    with pytest.raises(EnvError, match="max_turns"):
        make_env("sql_multiturn", max_turns=0)


def test_exception_in_step_becomes_zero_reward(plugin_module, caplog):
    env = make_env("local_plugins.FlakyEnv")
    episodes = start_episodes(env, [{}, {}, {}])
    with caplog.at_level(logging.WARNING, logger="envs.stepping"):
        results = step_episodes(episodes, ["fine", "crash", "fine"])
    assert [r.reward for r in results] == [1.0, 0.0, 1.0]
    assert results[1].done and results[1].error == "ZeroDivisionError: flaky step"
    assert (results[1].info, results[1].timed_out, results[0].error) == ({}, False, None)
    assert "local_plugins.FlakyEpisode raised in step(): ZeroDivisionError: flaky step" in caplog.text
    with pytest.raises(EnvError, match=r"local_plugins.FlakyEnv failed to start .* task row 1: KeyError"):
        start_episodes(env, [{}, {"bad": True}])
    with pytest.raises(ValueError, match="one action per episode"):
        step_episodes(episodes, ["only one"])


def test_weighted_rewards_by_hand():
    rewards = WeightedRewards(
        {
            "exact": (lambda task, text: float(text == task["answer"]), 2.0),
            "short": (lambda task, text: 1.0 / len(text), 0.5),
            "off": (lambda task, text: 100.0, 0.0),
        }
    )
    result = rewards({"answer": "four"}, "four")
    assert result.components == {"exact": 1.0, "short": 0.25}
    assert result.total == pytest.approx(2.0 * 1.0 + 0.5 * 0.25)
    assert rewards.zero().components == {"exact": 0.0, "short": 0.0}
    with pytest.raises(TypeError, match="'bad' must be"):
        WeightedRewards({"bad": 1.0})


def test_step_result_defaults_are_independent():
    a, b = StepResult(None, 0.0, True), StepResult(None, 0.0, True)
    a.info["x"] = 1
    assert b.info == {} and a.rewards == {}
