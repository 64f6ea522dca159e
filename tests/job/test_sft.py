"""The supervised warm start: SQL demonstrations are right, and one step follows the NLL gradient."""

import math

import pytest
import torch

from envs import BaseEnv
from envs.sql.generator import generate_sql_tasks
from envs.sql.grading import grade_completion
from envs.sql.multi_turn import SqlMultiTurnEnv
from envs.sql.single_turn import SqlEnv
from rl.algo.batch import collate_rollouts
from rl.algo.losses import LossConfig
from rl.algo.trainer import train_step
from rl.config.schema import SftConfig
from rl.job.demos import Demonstration, DemoSampler, demo_batch, demonstrations
from rl.job.model_loading import load_model
from rl.job.warm_start import sft_step
from rl.rollout.prompts import prompt_token_ids
from rl.sync.adapter import add_lora

PREFIX = "```sql\nSELECT"


@pytest.fixture(scope="module")
def sql_tasks(tmp_path_factory):
    tasks = generate_sql_tasks(seed=0, db_dir=str(tmp_path_factory.mktemp("sft_tasks")), scale=0.2)
    return list(tasks["train"].select(range(0, len(tasks["train"]), 9)))


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model("tiny_llama", seed=3, dtype="float32")
    return add_lora(model, rank=4, alpha=8.0, target_modules="all"), tokenizer


def test_every_sql_demonstration_is_graded_an_execution_match(sql_tasks):
    env = SqlEnv(response_prefix=PREFIX)
    for task in sql_tasks:
        text = env.demonstration(task)
        assert text.startswith(PREFIX)
        assert grade_completion(task, text).match, (task["gold_sql"], text)


def test_every_multi_turn_demonstration_answers_at_once_with_an_execution_match(sql_tasks):
    env = SqlMultiTurnEnv()
    for task in sql_tasks:
        result = env.start(task).step(env.demonstration(task))
        assert result.done and result.info["turns"] == 1, task["gold_sql"]
        assert result.rewards["execution"] == 1.0, task["gold_sql"]


def test_a_demonstration_is_the_rollout_prompt_then_the_rest_of_the_gold_reply(sql_tasks, tiny):
    _, tokenizer = tiny
    env = SqlEnv(response_prefix=PREFIX)
    demos = demonstrations(env, sql_tasks, tokenizer, group_by="db_id")
    assert len(demos) == len(sql_tasks)
    for demo, task in zip(demos, sql_tasks, strict=True):
        assert demo.prompt_ids == prompt_token_ids(tokenizer, env.start(task).messages, PREFIX)
        assert PREFIX + tokenizer.decode(demo.completion_ids) == f"```sql\n{task['gold_sql']}\n```"
        assert demo.group == task["db_id"]


def test_an_env_without_demonstrations_is_refused_with_the_fix(sql_tasks, tiny):
    class NoDemos(BaseEnv):
        max_turns = 1

        def start(self, task):
            raise AssertionError("an env without demonstrations starts no episode")

    with pytest.raises(ValueError, match="no demonstration\\(task\\) method.*sft.steps=0"):
        demonstrations(NoDemos(), sql_tasks, tiny[1])


def test_sampler_batches_come_from_one_group_and_repeat_for_a_seed():
    demos = [Demonstration([1, 2], [i], group) for i, group in enumerate("aaaaaaaaaabbbbbbcccc")]
    batches = [DemoSampler(demos, batch_size=3, seed=7) for _ in range(2)]
    drawn = [[b.next_batch() for _ in range(20)] for b in batches]
    assert drawn[0] == drawn[1]
    for batch in drawn[0]:
        assert len({d.group for d in batch}) == 1
    # an epoch: a (10 rows) in round(10/3) = 3 batches of 3, 3 and 4, b (6) in 2 of 3, c (4) in 1 of 4
    assert batches[0].batches_per_epoch == 6
    for epoch in range(3):
        rows = drawn[0][6 * epoch : 6 * epoch + 6]
        assert sorted(len(batch) for batch in rows) == [3, 3, 3, 3, 4, 4]
        assert sorted(d.completion_ids[0] for batch in rows for d in batch) == list(range(20))
    assert drawn[0][:6] != drawn[0][6:12]  # each epoch its own order
    # batches by draw number: the same for the same draw, whatever came before
    sampler = DemoSampler(demos, batch_size=3, seed=7)
    first = [sampler.batch_at(draw) for draw in range(20)]
    sampler.next_batch()
    assert [sampler.batch_at(draw) for draw in range(20)] == first == drawn[0]
    assert [DemoSampler(demos, batch_size=3, seed=8).batch_at(d) for d in range(6)] != first[:6]
    # two ranks share each epoch: together they draw its every row once
    ranks = [DemoSampler(demos, batch_size=3, seed=7, rank=r, world_size=2) for r in range(2)]
    shared = [batch for d in range(3) for batch in (ranks[0].batch_at(d), ranks[1].batch_at(d))]
    assert shared == first[:6]
    # the sft.* keys' own rules (check_config applies them before the sampler is built)
    assert SftConfig.problems(SftConfig(batch_size=0), "sft.") == ["sft.batch_size=0: use an integer >= 1"]
    assert SftConfig.problems(SftConfig(anchor_coef=-1), "sft.") == [
        "sft.anchor_coef=-1: use a number >= 0 (0: GRPO steps take no demonstrations)"
    ]


def reference_nll(model, demos):
    """Per-sequence mean NLL of the completions from plain HF forwards, one row at a time."""
    losses = []
    for demo in demos:
        ids = torch.tensor([demo.prompt_ids + demo.completion_ids])
        logits = model(input_ids=ids).logits[0, len(demo.prompt_ids) - 1 : -1]
        target = torch.tensor(demo.completion_ids)
        losses.append(torch.nn.functional.cross_entropy(logits.float(), target))
    return torch.stack(losses).mean()


# two rows share a 5-token prompt prefix (the trainer runs it once), one does not
DEMOS = [
    Demonstration([5, 6, 7, 8, 9, 10], [11, 12, 13], "x"),
    Demonstration([5, 6, 7, 8, 9, 20, 21], [22, 23], "x"),
    Demonstration([30, 31], [32, 33, 34, 35], "y"),
]


class Recorder(torch.optim.SGD):
    """Keeps the gradients it is asked to step on, and leaves the weights alone."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.params = params

    def step(self, closure=None):
        self.seen = [p.grad.clone() for p in self.params]


def perturbed_lora(tiny):
    model, _ = tiny
    torch.manual_seed(0)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0.0, 0.05)
    return model, [p for p in model.parameters() if p.requires_grad]


def nll_gradient(model, params, demos):
    model.zero_grad()
    loss = reference_nll(model, demos)
    loss.backward()
    grads = [p.grad.clone() for p in params]
    model.zero_grad()
    return loss, grads


def test_one_step_has_the_gradient_of_the_mean_sequence_nll(tiny):
    model, params = perturbed_lora(tiny)
    demos = DEMOS
    expected_loss, expected = nll_gradient(model, params, demos)
    optimizer = Recorder(params)
    metrics = sft_step(model, optimizer, demos, pad_token_id=0, micro_batch_size=2, max_grad_norm=None)
    assert metrics["sft/nll"] == pytest.approx(expected_loss.item(), rel=1e-5)
    assert metrics["sft/num_tokens"] == 9
    for got, want in zip(optimizer.seen, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_an_anchored_grpo_step_adds_coef_times_the_demonstrations_nll_gradient(tiny):
    model, params = perturbed_lora(tiny)
    rollouts = collate_rollouts(
        prompt_ids=[[40, 41, 42], [40, 41, 42]],
        completion_ids=[[43, 44], [45, 46, 47]],
        completion_logprobs=[[-1.0, -1.0], [-1.0, -1.0, -1.0]],
        advantages=torch.tensor([1.0, -1.0]),
        truncated=[False, False],
        pad_token_id=0,
    )
    step = dict(loss=LossConfig(), micro_batch_size=2, max_grad_norm=None, temperature=1.0)
    alone = Recorder(params)
    train_step(model, alone, None, rollouts, **step)
    expected_nll, nll_grads = nll_gradient(model, params, DEMOS)
    anchored = Recorder(params)
    stats = train_step(model, anchored, None, rollouts, anchor=demo_batch(DEMOS, 0, 0.3), **step)
    assert stats.as_dict()["anchor/nll"] == pytest.approx(expected_nll.item(), rel=1e-5)
    assert "anchor/nll" not in train_step(model, alone, None, rollouts, **step).as_dict()
    for got, rl, nll in zip(anchored.seen, alone.seen, nll_grads, strict=True):
        torch.testing.assert_close(got, rl + 0.3 * nll, rtol=1e-4, atol=1e-6)
    # the two gradients' norms are logged apart
    norm = lambda grads: math.sqrt(sum(g.pow(2).sum().item() for g in grads))  # noqa: E731
    logged = stats.as_dict()
    assert logged["grad_norm/policy"] == pytest.approx(norm(alone.seen), rel=1e-4)
    assert logged["grad_norm/anchor"] == pytest.approx(norm([0.3 * g for g in nll_grads]), rel=1e-4)
