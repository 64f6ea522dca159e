"""Off-policy guidance: a group with no success gets the task's demonstration in its last place, scored by
the env and with the trainer's logprobs at the sampling temperature; other groups stay as they were."""

import pytest
import torch

from envs.sql.generator import generate_sql_tasks
from envs.sql.single_turn import SqlEnv
from rl.job.guidance import guide_failed_groups
from rl.job.model_loading import load_model
from rl.rollout.play import Trajectory, record_step
from rl.rollout.prompts import prompt_token_ids
from rl.sync.adapter import add_lora

PREFIX = "```sql\nSELECT"
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    generated = generate_sql_tasks(seed=0, db_dir=str(tmp_path_factory.mktemp("guided")), scale=0.2)
    return list(generated["train"].select(range(3)))


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny_llama", seed=5, dtype="float32")
    return add_lora(model, rank=4, alpha=8.0, target_modules="all"), tokenizer


def played(env, tokenizer, task, replies):
    """A group of sampled episodes, each with its reply's tokens and the env's grade of it."""
    prompt = prompt_token_ids(tokenizer, env.start(task).messages, PREFIX)
    group = []
    for reply in replies:
        traj = Trajectory(list(prompt), num_turns=1, text=PREFIX + reply)
        ids = tokenizer.encode(reply, add_special_tokens=False)
        traj.append(ids, [-1.0] * len(ids))
        record_step(traj, env.start(task).step(PREFIX + reply), tokenizer, max_completion_tokens=256)
        group.append(traj)
    return group


def test_failed_groups_learn_the_demonstration_and_solved_ones_stay(tasks, tiny):
    model, tokenizer = tiny
    env = SqlEnv(response_prefix=PREFIX, partial_weight=0.0)
    # its demonstration does not start with the response prefix, so no reply can continue into it
    lower = {**tasks[2], "gold_sql": "select" + tasks[2]["gold_sql"][len("SELECT") :]}
    solved_reply = tasks[1]["gold_sql"][len("SELECT") :] + "\n```"
    groups = [
        played(env, tokenizer, tasks[0], [" 1\n```", " nope\n```", " 2\n```"]),
        played(env, tokenizer, tasks[1], [" 1\n```", solved_reply, " 3\n```"]),
        played(env, tokenizer, lower, [" 1\n```", " 2\n```", " 3\n```"]),
    ]
    assert [[t.reward for t in g] for g in groups][1] == [0.0, 1.0, 0.0]
    guided = guide_failed_groups(
        env, tokenizer, model, groups, [tasks[0], tasks[1], lower],
        micro_batch_size=2, temperature=TEMPERATURE, max_completion_tokens=256, timeout_s=5.0,
    )  # fmt: skip
    assert guided[0][:2] == groups[0][:2] and guided[1] == groups[1] and guided[2] == groups[2]
    demo = guided[0][-1]
    assert demo.demonstration and demo.done and demo.reward == 1.0 and demo.info["match"]
    assert demo.prompt_ids == groups[0][0].prompt_ids
    assert PREFIX + tokenizer.decode(demo.completion_ids) == f"```sql\n{tasks[0]['gold_sql']}\n```"
    assert demo.completion_mask == [1] * len(demo.completion_ids)
    ids = torch.tensor([demo.prompt_ids + demo.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(demo.prompt_ids) - 1 : -1].float() / TEMPERATURE
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(demo.completion_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(demo.logprobs), expected, atol=1e-4, rtol=1e-4)
