"""play_groups drives the engine and the episodes turn by turn, checked with a scripted engine and env."""

import dataclasses

import pytest
import torch
from transformers import AutoTokenizer

from envs import StepResult, step_episodes
from rl.algo.advantages import compute_advantages, group_rewards
from rl.algo.batch import to_rollout_batch
from rl.job.model_loading import smollm2_checkpoint_dir
from rl.rollout.play import play_groups
from rl.rollout.prompts import prompt_token_ids
from rl.tasks.stream import TaskStream
from rollout_engine import SamplingParams
from rollout_engine.outputs import Completion, GroupResult


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(smollm2_checkpoint_dir()))


class ScriptedEngine:
    """Answers each generate call with the next scripted texts, one per sample, and records its inputs."""

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.calls = tokenizer, list(script), []

    def generate(self, prompts, params, on_finished=None):
        self.calls.append(([list(p) for p in prompts], params))
        texts = self.script.pop(0)
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        results, k = [], 0
        for i, prompt in enumerate(prompts):
            samples = []
            for s in range(per_prompt[i].n):
                ids = self.tokenizer.encode(texts[k], add_special_tokens=False)
                samples.append(Completion(list(prompt), ids, [-0.5] * len(ids), "stop", s))
                k += 1
            results.append(GroupResult(i, list(prompt), samples))
        for i in reversed(range(len(prompts))):  # the engine finishes requests in any order
            if on_finished is not None:
                on_finished(i)
        return results


class ExploreThenAnswer:
    """Turn 1 must explore with <sql>, turn 2 answers; reward 1 for an answer containing 'ok'."""

    max_turns = 3

    def __init__(self):
        self.messages = [{"role": "user", "content": "Count the rows."}]

    def step(self, action):
        if "<answer>" in action:
            reward = 1.0 if "ok" in action else 0.0
            return StepResult(None, reward, True, rewards={"execution": reward})
        return StepResult("\n<observation>\n3\n</observation>\n", 0.0, False)


def test_multi_turn_masks_observations_and_continues_from_the_whole_conversation(tokenizer):
    script = [["<sql>SELECT 1</sql>", "<answer>ok</answer>"], ["<answer>ok</answer>"]]
    engine = ScriptedEngine(tokenizer, script)
    episodes = [[ExploreThenAnswer(), ExploreThenAnswer()]]
    params = SamplingParams(n=2, max_tokens=32, seed=5)
    (group,) = play_groups(engine, tokenizer, episodes, params, step_episodes, max_completion_tokens=100)

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    explore, answer, obs = (
        encode("<sql>SELECT 1</sql>"),
        encode("<answer>ok</answer>"),
        encode("\n<observation>\n3\n</observation>\n"),
    )
    prompt = prompt_token_ids(tokenizer, episodes[0][0].messages)
    first, second = group
    assert first.completion_ids == explore + obs + answer
    assert first.completion_mask == [1] * len(explore) + [0] * len(obs) + [1] * len(answer)
    assert first.logprobs == [-0.5] * len(explore) + [0.0] * len(obs) + [-0.5] * len(answer)
    assert (first.reward, first.num_turns, first.rewards) == (1.0, 2, {"execution": 1.0})
    assert second.completion_ids == answer and second.num_turns == 1
    # the continuation re-sends the whole conversation once, with n=1 and a fresh seed
    ((cont_prompts, (cont_params,)),) = engine.calls[1:]  # one request, with its own SamplingParams
    assert cont_prompts == [prompt + explore + obs]
    assert (cont_params.n, cont_params.max_tokens) == (1, 32) and cont_params.seed != params.seed


def test_episode_is_truncated_at_the_completion_budget(tokenizer):
    engine = ScriptedEngine(tokenizer, [["<sql>SELECT 1</sql>"]])
    episodes = [[ExploreThenAnswer()]]
    (group,) = play_groups(engine, tokenizer, episodes, SamplingParams(n=1), step_episodes, 5)
    assert group[0].truncated and group[0].done and len(engine.calls) == 1


def test_rollout_batch_masks_prompt_and_observations_and_scales_advantages(tokenizer):
    script = [["<sql>SELECT 1</sql>", "<answer>no</answer>"], ["<answer>ok</answer>"]]
    engine = ScriptedEngine(tokenizer, script)
    episodes = [[ExploreThenAnswer(), ExploreThenAnswer()]]
    groups = play_groups(engine, tokenizer, episodes, SamplingParams(n=2), step_episodes, 100)
    rewards = group_rewards(groups)
    batch = to_rollout_batch(
        groups, compute_advantages(rewards, "grpo", "group"), tokenizer.pad_token_id or 0
    )
    assert rewards.tolist() == [[1.0, 0.0]]
    # mean 0.5, Bessel std sqrt(0.5); advantages +-0.5 / (sqrt(0.5) + 1e-4)
    expected = 0.5 / (0.5**0.5 + 1e-4)
    assert torch.allclose(batch.advantages, torch.tensor([expected, -expected]))
    first = groups[0][0]
    start = len(first.prompt_ids)
    row_mask = batch.loss_mask[0, start : start + len(first.completion_ids)].int().tolist()
    assert row_mask == first.completion_mask
    assert not batch.loss_mask[0, :start].any()
    assert batch.loss_mask[0].sum().item() == sum(first.completion_mask)


def test_task_stream_resumes_exactly():
    tasks = list(range(7))
    a = TaskStream(tasks, seed=3)
    a.next_batch(5)
    position = a.position()
    expected = a.next_batch(6)  # crosses into the second epoch
    b = TaskStream(tasks, seed=3)
    b.restore(position)
    assert b.next_batch(6) == expected
    assert sorted(TaskStream(tasks, seed=3).next_batch(7)) == tasks
    with pytest.raises(ValueError, match="resume with seed=3"):
        TaskStream(tasks, seed=4).restore(position)


def test_params_are_not_mutated_between_turns(tokenizer):
    params = SamplingParams(n=1, max_tokens=8, seed=1)
    before = dataclasses.asdict(params)
    engine = ScriptedEngine(tokenizer, [["<sql>x</sql>"], ["<answer>ok</answer>"]])
    play_groups(engine, tokenizer, [[ExploreThenAnswer()]], params, step_episodes, 100)
    assert dataclasses.asdict(params) == before


class RecordsActions(ExploreThenAnswer):
    def __init__(self):
        super().__init__()
        self.actions = []

    def step(self, action):
        self.actions.append(action)
        return super().step(action)


def test_response_prefix_ends_the_prompt_and_opens_only_the_first_action(tokenizer):
    prefix = "<sql>SELECT"
    engine = ScriptedEngine(tokenizer, [[" 1</sql>"], ["<answer>ok</answer>"]])
    episode = RecordsActions()
    (group,) = play_groups(engine, tokenizer, [[episode]], SamplingParams(n=1), step_episodes, 100, prefix)
    chat = tokenizer.apply_chat_template(
        episode.messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    ((first_prompts, _), (cont_prompts, _)) = engine.calls
    assert first_prompts == [list(chat) + prefix_ids]
    assert episode.actions == ["<sql>SELECT 1</sql>", "<answer>ok</answer>"]
    (traj,) = group
    assert traj.prompt_ids == list(chat) + prefix_ids  # the prefix is prompt: never trained on
    assert traj.completion_ids[: len(tokenizer.encode(" 1</sql>", add_special_tokens=False))] == (
        tokenizer.encode(" 1</sql>", add_special_tokens=False)
    )
    assert traj.text.startswith("<sql>SELECT 1</sql>") and traj.reward == 1.0
    assert cont_prompts[0][: len(traj.prompt_ids)] == traj.prompt_ids


class Rule:
    def accepts(self, text, start):
        return True


class Constrained(ExploreThenAnswer):
    def __init__(self, constraint):
        super().__init__()
        self.constraint = constraint


def test_an_episodes_constraint_goes_with_each_of_its_replies(tokenizer):
    """Each group's first request carries its episodes' constraint, and each continuation its episode's."""
    rule_a, rule_b = Rule(), Rule()
    engine = ScriptedEngine(
        tokenizer, [["<sql>x</sql>", "<sql>y</sql>", "<sql>z</sql>"], ["<answer>ok</answer>"] * 3]
    )
    groups = [[Constrained(rule_a)], [ExploreThenAnswer()], [Constrained(rule_b)]]
    params = SamplingParams(n=1, max_tokens=8, seed=1)
    play_groups(engine, tokenizer, groups, params, step_episodes, 100)
    (_, first), (_, continuation) = engine.calls
    assert [p.constraint for p in first] == [rule_a, None, rule_b]
    assert [p.max_tokens for p in first] == [8, 8, 8] and params.constraint is None
    assert [p.constraint for p in continuation] == [rule_a, None, rule_b]
    assert [p.n for p in continuation] == [1, 1, 1]


class OneTry(ExploreThenAnswer):
    max_turns = 1


def test_each_group_is_reported_done_once_when_its_last_episode_ends(tokenizer):
    """Group 0 explores then answers (one episode) and answers at once (the other); group 1 has one try
    each, so their replies must end it: it is done while the first generate call runs. Group 0 is done
    after its second turn's step. Groups 2 and 3 answer at once: done together after the first step."""
    events = []
    turn_1 = ["<sql>SELECT 1</sql>", "<answer>no</answer>", "<answer>ok</answer>", "<answer>no</answer>"]
    turn_1 += ["<answer>ok</answer>"] * 4
    engine = ScriptedEngine(tokenizer, [turn_1, ["<answer>ok</answer>"]])
    generate = engine.generate

    def logged(prompts, params, on_finished=None):
        events.append(f"generate {len(engine.calls) + 1}")
        results = generate(prompts, params, on_finished)
        events.append("returned")
        return results

    engine.generate = logged
    groups = [[ExploreThenAnswer(), ExploreThenAnswer()], [OneTry(), OneTry()]]
    groups += [[ExploreThenAnswer(), ExploreThenAnswer()] for _ in range(2)]
    on_done = events.append
    play_groups(engine, tokenizer, groups, SamplingParams(n=2), step_episodes, 100, on_done=on_done)
    assert events == ["generate 1", 1, "returned", 2, "generate 2", "returned", 1]
