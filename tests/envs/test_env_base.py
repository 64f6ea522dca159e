"""An env's optional features: BaseEnv's defaults, a duck-typed plugin's own features read by name, and
success as each env says (the SQL envs: an execution match, whatever the reward)."""

import sys
import types

import pytest

from envs import BaseEnv, ScoreWords, StepResult, make_env, start_episodes, with_defaults
from envs.sql import SqlEnv, SqlMultiTurnEnv
from rl.rollout.play import Trajectory, succeeded

TASK = {"question": "What is 2 + 2?"}


class EchoEpisode:
    max_turns = 1

    def __init__(self, task):
        self.messages = [{"role": "user", "content": task["question"]}]

    def step(self, action_text):
        return StepResult(None, 0.3, True)


class ProtocolOnly:
    """A plugin with the protocol alone: max_turns and start."""

    max_turns = 2

    def start(self, task):
        return EchoEpisode(task)


class Declares:
    """A plugin that declares every optional feature by name, without subclassing BaseEnv."""

    max_turns = 1
    stop = ["</answer>"]
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


PLUGINS = types.ModuleType("env_base_plugins")  # importable by dotted path, as a user's package would be
PLUGINS.ProtocolOnly, PLUGINS.Declares = ProtocolOnly, Declares
sys.modules[PLUGINS.__name__] = PLUGINS


def played(reward, **rewards):
    return Trajectory(prompt_ids=[1], reward=reward, rewards=rewards)


def test_a_plugin_with_the_protocol_alone_gets_every_default():
    env = make_env("env_base_plugins.ProtocolOnly")
    assert isinstance(env, BaseEnv) and env.max_turns == 2
    assert (env.stop, env.response_prefix, env.score_words) == ((), "", ScoreWords("success rate", "tasks"))
    assert env.demonstration(TASK) is None
    assert env.check_task({}) is None  # every row is playable
    assert env.is_success(played(0.3)) and not env.is_success(played(0.0))
    (episode,) = start_episodes(env, [TASK])
    assert isinstance(episode, EchoEpisode)


def test_a_plugin_declares_its_features_by_name_without_subclassing():
    env = make_env("env_base_plugins.Declares")
    assert (env.stop, env.response_prefix) == (("</answer>",), "<answer>")
    assert env.score_words.success == "answer accuracy"
    assert env.demonstration(TASK) == "<answer>4</answer>"
    with pytest.raises(ValueError, match="needs a 'question'"):
        env.check_task({})
    # its own rule, not the reward: 0.3 with the component that says right is a success, 0.9 without is not
    assert env.is_success(played(0.3, right=1.0)) and not env.is_success(played(0.9, right=0.0))


def test_a_subclass_is_used_as_it_is_and_overrides_what_it_has():
    class Subclass(BaseEnv):
        max_turns = 1
        stop = ("\n",)

        def start(self, task):
            return EchoEpisode(task)

    env = Subclass()
    assert with_defaults(env) is env
    assert (env.stop, env.response_prefix, env.demonstration(TASK)) == (("\n",), "", None)


def test_a_subclass_without_start_is_refused_when_built():
    class NoStart(BaseEnv):
        max_turns = 1

    with pytest.raises(TypeError, match="abstract method 'start'|abstract methods? start"):
        NoStart()


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
