"""Stepping plugins safely: a hung step times out, a bad reward fails its episode, Ctrl-C never waits."""

import logging
import math
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

from envs import BaseEnv, EnvError, StepResult, step_episodes, stepping
from envs.sql import SqlEnv
from envs.stepping import NUM_WORKERS
from rl.report.metrics import reward_metrics
from rl.rollout.play import Trajectory, record_step, succeeded
from tests.helpers.ctrl_c import popen_interruptible

REPO = Path(__file__).resolve().parents[2]
RELEASE = threading.Event()  # lets the hung steps of this process go once the module's tests are done


@pytest.fixture(autouse=True, scope="module")
def release_hung_steps():
    yield
    RELEASE.set()


class HangingEpisode:
    max_turns = 1

    def __init__(self, question="What is 6 times 7?"):
        self.task = {"question": question}
        self.messages = [{"role": "user", "content": question}]

    def step(self, action_text):
        RELEASE.wait()
        return StepResult(None, 1.0, True)


class FixedEpisode:
    """Returns whatever reward and components it was built with."""

    max_turns = 1

    def __init__(self, reward=1.0, rewards=None, question="Add 2 and 3."):
        self.reward, self.rewards = reward, rewards or {}
        self.messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]

    def step(self, action_text):
        return StepResult(None, self.reward, True, rewards=self.rewards)


class FixedEnv(BaseEnv):
    """Every optional feature at its default: a success is a positive reward."""

    max_turns = 1

    def start(self, task):
        return FixedEpisode()


def test_a_hung_step_fails_its_episode_with_a_warning_and_the_others_go_on(caplog):
    episodes = [FixedEpisode(0.5), HangingEpisode(), FixedEpisode(0.25)]
    with caplog.at_level(logging.WARNING, logger="envs.stepping"):
        results = step_episodes(episodes, ["a", "b", "c"], timeout_s=0.3)
    assert [r.reward for r in results] == [0.5, 0.0, 0.25]
    hung = results[1]
    assert hung.done and hung.timed_out is True and hung.info == {}
    assert hung.error == "timed out after 0.3s (env.step_timeout_s)"
    assert (results[0].error, results[0].timed_out) == (None, False)
    assert "HangingEpisode did not return from step()" in caplog.text
    assert "(task 'What is 6 times 7?')" in caplog.text


def test_more_hung_steps_than_workers_never_block_the_pool():
    hung = step_episodes([HangingEpisode() for _ in range(NUM_WORKERS + 2)], ["x"] * (NUM_WORKERS + 2), 0.2)
    assert all(r.timed_out for r in hung)
    # every worker that was stuck has been replaced: fresh steps still run
    fine = step_episodes([FixedEpisode(float(i)) for i in range(2 * NUM_WORKERS)], ["y"] * 2 * NUM_WORKERS)
    assert [r.reward for r in fine] == [float(i) for i in range(2 * NUM_WORKERS)]


def test_a_plugin_whose_steps_all_hang_stops_the_run_with_one_message(monkeypatch):
    monkeypatch.setattr(stepping, "MAX_HUNG_STEPS", stepping._WORKERS.num_hung + 2)
    with pytest.raises(EnvError, match=r"HangingEpisode: \d+ calls of step\(\) are still running past"):
        step_episodes([HangingEpisode() for _ in range(3)], ["x"] * 3, timeout_s=0.2)


def test_a_single_episode_is_under_the_time_limit_too():
    (result,) = step_episodes([HangingEpisode()], ["x"], timeout_s=0.2)
    assert result.timed_out is True


@pytest.mark.parametrize(
    "reward, rewards, message",
    [
        ("1.0", {}, "StepResult.reward='1.0' is a str, not a number"),
        (None, {}, "StepResult.reward=None is a NoneType, not a number"),
        (math.nan, {}, "StepResult.reward=nan is not finite"),
        (math.inf, {}, "StepResult.reward=inf is not finite"),
        (-math.inf, {}, "StepResult.reward=-inf is not finite"),
        (1.0, {"exact": math.nan}, "StepResult.rewards['exact']=nan is not finite"),
        (1.0, {"exact": "yes"}, "StepResult.rewards['exact']='yes' is a str, not a number"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_fails_the_episode(reward, rewards, message, caplog):
    with caplog.at_level(logging.WARNING, logger="envs.stepping"):
        bad, good = step_episodes([FixedEpisode(reward, rewards), FixedEpisode(1)], ["a", "b"])
    assert (bad.reward, bad.rewards, bad.done) == (0.0, {}, True)
    assert bad.error.startswith(message) and not bad.timed_out
    assert "FixedEpisode returned a bad result from step()" in caplog.text and message in caplog.text
    assert "(task 'Add 2 and 3.')" in caplog.text
    assert good.reward == 1.0 and type(good.reward) is float


def test_failures_are_counted_and_never_succeed():
    results = step_episodes(
        [HangingEpisode(), FixedEpisode(math.inf), FixedEpisode(1.0)], ["a", "b", "c"], timeout_s=0.2
    )
    trajectories = [Trajectory(prompt_ids=[1]) for _ in results]
    for traj, result in zip(trajectories, results, strict=True):
        record_step(traj, result, tokenizer=None, max_completion_tokens=10)
    metrics = reward_metrics([trajectories], rewards=torch.tensor([[0.0, 0.0, 1.0]]))
    assert (metrics["env/errors"], metrics["env/timeouts"]) == (2.0, 1.0)
    assert [succeeded(FixedEnv(), t) for t in trajectories] == [False, False, True]
    assert [t.error for t in trajectories] == [r.error for r in results] and trajectories[2].error is None


def test_informative_groups_are_those_whose_rewards_differ():
    groups = [[Trajectory(prompt_ids=[1]) for _ in range(3)] for _ in range(4)]
    rewards = torch.tensor([[0.0, 0.0, 0.0], [0.0, -0.1, 0.0], [1.0, 1.0, 1.0], [0.5, 1.0, 0.0]])
    assert reward_metrics(groups, rewards)["informative_groups"] == 2.0


def test_an_error_the_env_reports_in_info_is_no_failed_step():
    traj = Trajectory(prompt_ids=[1])
    record_step(traj, StepResult(None, -0.1, True, info={"error": "no such column: x"}), None, 10)
    assert (traj.error, traj.timed_out, traj.info["error"]) == (None, False, "no such column: x")


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_accuracy_never_comes_from_a_non_finite_reward(value):
    assert not succeeded(FixedEnv(), Trajectory(prompt_ids=[1], reward=value))
    assert not succeeded(SqlEnv(), Trajectory(prompt_ids=[1], reward=1.0, rewards={"execution": value}))


HUNG_SCRIPT = textwrap.dedent(
    """
    import signal, sys, threading
    from envs import StepResult, step_episodes

    class Hang:
        max_turns = 1
        messages = []
        def step(self, action_text):
            print("IN_STEP", flush=True)
            threading.Event().wait()

    class Quick:
        max_turns = 1
        messages = []
        def step(self, action_text):
            return StepResult(None, 1.0, True)

    timeout = float(sys.argv[1])
    step_episodes([Quick()], ["a"])  # the workers start with SIGINT unblocked
    # The kernel may hand SIGINT to any thread; here it always picks a worker, the case that used to hang.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    results = step_episodes([Hang(), Hang()], ["a", "b"], timeout_s=timeout)
    print("DONE", [r.timed_out for r in results], flush=True)
    """
)


def spawn_hung(timeout_s):
    return popen_interruptible(
        [sys.executable, "-c", HUNG_SCRIPT, str(timeout_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_interpreter_exits_although_a_step_never_returned():
    child = spawn_hung(0.5)
    try:
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 0 and "DONE [True, True]" in out


def test_ctrl_c_stops_a_run_waiting_on_a_hung_step():
    child = spawn_hung(3600)
    try:
        assert child.stdout.readline().startswith("IN_STEP")  # two threads may share a line
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in err
