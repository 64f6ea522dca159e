"""The env contract: BaseEnv's defaults for the optional features, a plugin's own overrides, the one error
for a plugin that is no BaseEnv, and success as each env says (the SQL envs: an execution match, whatever
the reward)."""

import sys
import types

import pytest

from envs import BaseEnv, EnvError, ScoreWords, StepResult, make_env, start_episodes
from envs.sql import SqlEnv, SqlMultiTurnEnv
from rl.rollout.play import Trajectory, succeeded

TASK = {"question": "What is 2 + 2?"}


class EchoEpisode:
    max_turns = 1

    def __init__(self, task):
        self.messages = [{"role": "user", "content": task["question"]}]

    def step(self, action_text):
        return StepResult(None, 0.3, True)


class Minimal(BaseEnv):
    """A plugin with the contract alone: max_turns and start."""

    max_turns = 2

    def start(self, task):
        return EchoEpisode(task)


class Declares(BaseEnv):
    """A plugin that overrides optional features of its own."""

    max_turns = 1
    stop = ("</answer>",)
    response_prefix = "<answer>"
    score_words = ScoreWords(success="answer accuracy", tasks="questions")

    def start(self, task):
        return EchoEpisode(task)

    def demonstration(self, task):
        return "<answer>4</answer>"

    def check_task(self, task):
        if "question" not in task:
            raise ValueError("a task needs a 'question'")

    def is_success(self, episode):
        return episode.rewards.get("right") == 1.0


class DuckTyped:
    """A plugin with max_turns and start that does not subclass BaseEnv."""

    max_turns = 1

    def start(self, task):
        return EchoEpisode(task)


class NoMaxTurns(BaseEnv):
    def start(self, task):
        return EchoEpisode(task)


class NoStart(BaseEnv):
    max_turns = 1


PLUGINS = types.ModuleType("env_base_plugins")  # importable by dotted path, as a user's package would be
PLUGINS.Minimal, PLUGINS.Declares, PLUGINS.DuckTyped = Minimal, Declares, DuckTyped
PLUGINS.NoMaxTurns, PLUGINS.NoStart = NoMaxTurns, NoStart
sys.modules[PLUGINS.__name__] = PLUGINS


def played(reward, **rewards):
    return Trajectory(prompt_ids=[1], reward=reward, rewards=rewards)


def test_a_plugin_with_the_contract_alone_gets_every_default():
    env = make_env("env_base_plugins.Minimal")
    assert type(env) is Minimal and env.max_turns == 2
    assert (env.stop, env.response_prefix, env.score_words) == ((), "", ScoreWords("success rate", "tasks"))
    assert env.demonstration(TASK) is None
    assert env.check_task({}) is None  # every row is playable
    assert env.is_success(played(0.3)) and not env.is_success(played(0.0))
    (episode,) = start_episodes(env, [TASK])
    assert isinstance(episode, EchoEpisode)


def test_a_plugin_overrides_the_features_it_has_and_is_used_as_it_was_built():
    env = make_env("env_base_plugins.Declares")
    assert type(env) is Declares
    assert (env.stop, env.response_prefix) == (("</answer>",), "<answer>")
    assert env.score_words.success == "answer accuracy"
    assert env.demonstration(TASK) == "<answer>4</answer>"
    with pytest.raises(ValueError, match="needs a 'question'"):
        env.check_task({})
    # its own rule, not the reward: 0.3 with the component that says right is a success, 0.9 without is not
    assert env.is_success(played(0.3, right=1.0)) and not env.is_success(played(0.9, right=0.0))


def test_a_plugin_that_is_no_base_env_is_refused_with_what_it_must_be():
    message = (
        r"built \S+\.DuckTyped, which is not an envs.BaseEnv: "
        r"an env subclasses envs.BaseEnv, sets 'max_turns' and defines 'start\(task\)'"
    )
    with pytest.raises(EnvError, match=message):
        make_env("env_base_plugins.DuckTyped")


def test_a_plugin_without_max_turns_is_refused_naming_it():
    with pytest.raises(EnvError, match=r"built \S+\.NoMaxTurns, which has no 'max_turns'"):
        make_env("env_base_plugins.NoMaxTurns")


def test_a_subclass_without_start_is_refused_when_built():
    no_start = "abstract method 'start'|abstract methods? start"
    with pytest.raises(TypeError, match=no_start):
        NoStart()
    with pytest.raises(EnvError, match=rf"NoStart' .*failed to construct.*({no_start})"):
        make_env("env_base_plugins.NoStart")


@pytest.mark.parametrize("env", [SqlEnv(partial_weight=0.5), SqlMultiTurnEnv(partial_weight=0.5)])
def test_the_sql_envs_count_an_execution_match_whatever_the_reward(env):
    assert env.is_success(played(0.9, execution=1.0, validity=-0.1))  # a match under a penalty
    assert not env.is_success(played(0.5, execution=0.0, partial=1.0, validity=0.0))  # partial credit alone
    assert not env.is_success(played(0.0))  # a failed episode has no components
    assert env.score_words.success == "execution accuracy"


def test_no_env_counts_a_non_finite_reward_as_a_success():
    env = make_env("env_base_plugins.Declares")
    assert succeeded(env, played(0.3, right=1.0))
    assert not succeeded(env, played(float("nan"), right=1.0))
    assert not succeeded(env, played(0.3, right=1.0, bonus=float("inf")))
