"""train.py end to end on a tiny model and a small SQL task set, composed through Hydra's compose API."""

import json
import math
import types
from collections.abc import Iterable

import pytest
import torch
from datasets import Dataset, DatasetDict

import train
from envs import BaseEnv, EnvError, StepResult
from rl.algo.advantages import compute_advantages, group_rewards
from rl.algo.batch import to_rollout_batch
from rl.job import distributed as dp
from rl.job import modes, stages
from rl.job.checkpoint import RunDirError, find_latest
from rl.job.grpo_step import collect_groups
from rl.job.parts import build_parts
from rl.job.resume import resume
from rl.job.warm_start import warm_start
from rl.report.metrics import StepTimer
from rl.settings import ConfigError
from rl.sync.adapter import lora_tensors
from rl.tasks.curriculum import task_key
from rl.tasks.stream import TaskStream
from rollout_engine import SamplingParams
from tests.helpers.outcome_files import read_outcomes
from tests.helpers.plugin_envs import (
    VOWEL_PLUGIN,
    VOWELS,
    VowelEnv,
    VowelEpisode,
    numbered_tasks,
    plugin_module,
    plugin_overrides,
)
from tests.helpers.train_runs import SMALL_SQL, adapted_checkpoint, compose_cfg

# The metrics a training run must log: TRL's names plus the engine's own. "rewards/" stands for one metric per
# reward component (rewards/<component>); eval/accuracy is logged on evaluation steps only.
METRIC_NAMES = (
    "reward",
    "rewards/",
    "reward_std",
    "frac_reward_zero_std",
    "informative_groups",
    "dynamic_sampling/prompts",
    "dynamic_sampling/rounds",
    "update_norm",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "kl",
    "entropy",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "grad_norm",
    "lr",
    "sampling/logp_difference/mean",
    "sampling/importance_ratio/mean",
    "rollout/tokens_per_s",
    "rollout/kv_utilization",
    "rollout/blocks_shared",
    "rollout/preemptions",
    "rollout/prefix_cache_hits",
    "rollout/constraint_vetoes",
    "rollout/constraint_unmet",
    "rollout/constraint_nats",
    "sync/ms",
    "time/generate",
    "time/env",
    "time/train",
    "time/sync",
    "memory/peak_rss_gb",
    "memory/kv_held_peak_gb",
    "memory/kv_reserved_gb",
    "eval/accuracy",
)


def missing_metrics(names: Iterable[str]) -> list[str]:
    """The METRIC_NAMES absent from ``names``; ``rewards/`` is present when any ``rewards/<component>`` is."""
    names = set(names)
    return [
        metric
        for metric in METRIC_NAMES
        if not (any(name.startswith(metric) for name in names) if metric.endswith("/") else metric in names)
    ]


class RightAnswerEnv(BaseEnv):
    """An env whose reward is 0.3 for a right answer, which its `right` component says, and 0.6 for a wrong
    one (a bonus for trying): only its own `is_success` tells them apart. The task row says which an answer
    is, so what a tiny random model writes does not matter."""

    max_turns = 1

    def start(self, task):
        return RightAnswerEpisode(task)

    def is_success(self, episode):
        return episode.rewards.get("right") == 1.0


class RightAnswerEpisode:
    max_turns = 1

    def __init__(self, task):
        self.right = task["right"]
        self.messages = [{"role": "user", "content": task["question"]}]

    def step(self, action):
        return StepResult(None, 0.3 if self.right else 0.6, True, rewards={"right": float(self.right)})


def right_answer_tasks():
    """Training tasks all answered wrong; held-out tasks half right."""
    train_rows = [{"question": f"Name the colour {i}.", "right": False} for i in range(16)]
    test = [{"question": f"Name the fruit {i}.", "right": i % 2 == 0} for i in range(4)]
    return DatasetDict(train=Dataset.from_list(train_rows), test=Dataset.from_list(test))


RIGHT_ANSWER = plugin_module("e2e_right_answer_env", RightAnswerEnv, right_answer_tasks)


class HalfFlatEnv(VowelEnv):
    """Vowel shares as rewards for half the tasks, a constant reward for the other half: only the first
    half's groups carry an advantage, and the task row says which half it is in."""

    def start(self, task):
        return HalfFlatEpisode(task)


class HalfFlatEpisode(VowelEpisode):
    def step(self, action):
        if self.task["flat"]:
            return StepResult(None, 0.5, True, rewards={"vowels": 0.5})
        return super().step(action)


def half_flat_tasks():
    return numbered_tasks(lambda i: {"flat": i % 2 == 0})


HALF_FLAT = plugin_module("e2e_half_flat_env", HalfFlatEnv, half_flat_tasks)
HALF_FLAT_ENV = plugin_overrides(HALF_FLAT, HalfFlatEnv, half_flat_tasks)


class ScreenEnv(VowelEnv):
    """Three kinds of task: every reply solves a "solved" task, none solves a "hopeless" one, and a reply of
    even length solves a "mixed" one (so a random model's samples of it differ, or by chance agree)."""

    def start(self, task):
        return ScreenEpisode(task)


class ScreenEpisode(VowelEpisode):
    def step(self, action):
        kind = self.task["kind"]
        solved = kind == "solved" or (kind == "mixed" and len(action) % 2 == 0)
        return StepResult(None, float(solved), True)


def screen_tasks():
    return numbered_tasks(lambda i: {"kind": ("solved", "hopeless", "mixed")[i % 3]})


SCREEN = plugin_module("e2e_screen_env", ScreenEnv, screen_tasks)
SCREEN_ENV = plugin_overrides(SCREEN, ScreenEnv, screen_tasks)


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run(run_dir, *overrides):
    cfg = compose_cfg(run_dir, *overrides)
    torch.manual_seed(cfg.seed)
    return train.train(cfg)


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run3")
    return run_dir, run(run_dir, "num_steps=3", *VOWELS)


def test_three_steps_train_the_adapter_and_log_every_metric(three_steps):
    run_dir, result = three_steps
    assert len(result.history) == 3
    assert all(math.isfinite(m["policy_loss"]) for m in result.history)
    # peft starts every B at zero; training moved them
    b_norm = sum(
        t.abs().sum().item() for n, t in lora_tensors(result.parts.model).items() if n.endswith("lora_B")
    )
    assert b_norm > 0
    records = read_metrics(run_dir)
    keys = set().union(*records)
    assert missing_metrics(keys) == []
    assert [r["step"] for r in records if "policy_loss" in r] == [1, 2, 3]
    assert find_latest(run_dir).name == "step_3"
    assert (run_dir / "samples.jsonl").stat().st_size > 0


def test_after_sync_the_engine_samples_from_the_trainers_weights(three_steps, causal_lm_logprobs):
    _, result = three_steps
    model, engine = result.parts.model.eval(), result.parts.engine
    prompt = [1, 520, 9531, 198, 4093, 17, 88]
    greedy = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[])
    sample = engine.generate([prompt], greedy)[0].samples[0]
    expected = causal_lm_logprobs(model, prompt, sample.token_ids)
    assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
    with model.disable_adapter():
        base = causal_lm_logprobs(model, prompt, sample.token_ids)
    assert not torch.allclose(base, expected, atol=1e-4)  # the adapter matters, so the check above can fail


def test_a_bf16_run_trains_an_fp32_adapter_and_logs_the_sampler_mismatch(tmp_path):
    result = run(tmp_path, "num_steps=2", "model.dtype=bfloat16", *VOWELS)
    model, engine = result.parts.model, result.parts.engine
    assert engine.runner.kv_pool.dtype == torch.bfloat16
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {t.dtype for t in lora_tensors(model).values()} == {torch.float32}
    assert sum(t.abs().sum().item() for n, t in lora_tensors(model).items() if n.endswith("lora_B")) > 0
    for record in result.history:
        assert 0.0 < record["sampling/logp_difference/mean"] <= record["sampling/logp_difference/max"] < 1.0
        assert 0.0 < record["sampling/importance_ratio/mean"] < 3.0


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_resume_gives_the_same_fourth_step_as_no_interruption(tmp_path):
    straight = run(tmp_path / "a", "num_steps=4", *VOWELS)
    run(tmp_path / "b", "num_steps=3", *VOWELS)
    resumed = run(tmp_path / "b", "num_steps=4", "resume=true", *VOWELS)
    assert [p.stage for p in resumed.evals] == ["grpo"] and len(resumed.history) == 1
    assert resumed.summary["base_accuracy"] is None  # a resumed run did not see the base model
    assert resumed.history[0]["policy_loss"] == straight.history[3]["policy_loss"]
    assert resumed.history[0]["reward"] == straight.history[3]["reward"]
    a, b = lora_tensors(straight.parts.model), lora_tensors(resumed.parts.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_resume_with_the_curriculum_gives_the_same_fourth_step_as_no_interruption(tmp_path):
    curriculum = ["curriculum.enabled=true", *VOWELS]
    straight = run(tmp_path / "a", "num_steps=4", *curriculum)
    run(tmp_path / "b", "num_steps=3", *curriculum)
    resumed = run(tmp_path / "b", "num_steps=4", "resume=true", *curriculum)
    assert resumed.history[0]["policy_loss"] == straight.history[3]["policy_loss"]
    assert resumed.history[0]["reward"] == straight.history[3]["reward"]
    state = json.loads((tmp_path / "b" / "checkpoints" / "step_4" / "state.json").read_text())
    records = state["data_position"]["records"]
    assert sum(tries for _, tries in records.values()) == 4 * 2 * 4  # steps x prompts x samples


KL_TO_START = ["algo.beta=0.1", "algo.kl_reference=start", *VOWELS]


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_the_kl_to_the_start_is_taken_against_the_runs_first_adapter_and_a_resume_keeps_it(tmp_path):
    start = f"checkpoint={adapted_checkpoint(tmp_path / 'start')}"  # an adapter far from the base model
    straight = run(tmp_path / "a", "num_steps=3", start, *KL_TO_START)
    assert straight.history[0]["kl"] == 0.0 < straight.history[2]["kl"]  # the first step is the start
    to_base = run(tmp_path / "c", "num_steps=1", start, "algo.beta=0.1", *VOWELS)
    assert to_base.history[0]["kl"] > 0.0
    run(tmp_path / "b", "num_steps=2", start, *KL_TO_START)
    resumed = run(tmp_path / "b", "num_steps=3", "resume=true", start, *KL_TO_START)
    # without the checkpoint's reference, the resumed run would take step 2's adapter for the start: kl 0
    assert resumed.history[0]["kl"] == straight.history[2]["kl"]
    assert resumed.history[0]["policy_loss"] == straight.history[2]["policy_loss"]


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_the_screen_drops_the_tasks_its_samples_all_solved_or_all_failed_before_the_first_step(tmp_path):
    screen = ["curriculum.enabled=true", "curriculum.screen_tasks=32", "curriculum.screen_samples=4"]
    run(tmp_path, "num_steps=1", *screen, *SCREEN_ENV)
    state = json.loads((tmp_path / "checkpoints" / "step_1" / "state.json").read_text())
    records, dropped = state["data_position"]["records"], set(state["data_position"]["dropped"])
    rows = list(screen_tasks()["train"])
    keys = {
        kind: {task_key(r) for r in rows if r["kind"] == kind} for kind in ("solved", "hopeless", "mixed")
    }
    assert keys["solved"] | keys["hopeless"] <= dropped  # the 22 tasks no sample can tell apart
    for key in keys["mixed"]:  # dropped exactly when its screen's four samples agreed; never drawn then
        wins, tries = records[key]
        assert (key in dropped) == (wins in (0, tries)) and (key not in dropped or tries == 4)
    assert sum(tries for _, tries in records.values()) == 32 * 4 + 2 * 4  # the screen, then one step
    (logged,) = [m for m in read_metrics(tmp_path) if "curriculum/screen_tasks" in m]
    assert logged["curriculum/screen_tasks"] == 32.0
    assert logged["curriculum/screen_kept"] == 32 - len(dropped)
    assert logged["curriculum/screen_solved"] >= 11 and logged["curriculum/screen_hopeless"] >= 11


def test_default_sql_env_runs_a_step_and_scores_the_held_out_split(tmp_path):
    result = run(tmp_path, "num_steps=1", SMALL_SQL)
    assert math.isfinite(result.history[0]["policy_loss"])
    final = result.evals[-1].result
    assert final.num_tasks == 4 and 0.0 <= final.accuracy <= 1.0
    assert "rewards/execution" in result.history[0]
    # the SQL env's schema constraint steers the rollouts: a random model's names are refused all the time
    assert result.history[0]["rollout/constraint_vetoes"] > 0
    # and the trainer recomputes the logprobs of the renormalised distribution that sampled them (fp32)
    assert result.history[0]["rollout/constraint_nats"] > 0.1
    assert result.history[0]["sampling/logp_difference/max"] < 1e-3


def test_multi_turn_masks_observation_tokens_out_of_the_loss(tmp_path):
    multi_turn = ["env=sql_multiturn", "env.args.max_turns=2", SMALL_SQL]
    result = run(tmp_path, "num_steps=1", *multi_turn)
    parts = result.parts
    cfg = compose_cfg(tmp_path, *multi_turn)
    stream = TaskStream(parts.train_tasks, seed=1)
    groups = collect_groups(parts, cfg, stream, step=9, timer=StepTimer()).groups
    advantages = compute_advantages(group_rewards(groups), "grpo", "group")
    batch = to_rollout_batch(groups, advantages, parts.tokenizer.pad_token_id)
    flat = [t for g in groups for t in g]
    observed = [t for t in flat if 0 in t.completion_mask]
    assert observed, "a random model writes no tags, so the env answers with a format hint"
    for row, traj in enumerate(flat):
        start = len(traj.prompt_ids)
        in_loss = batch.loss_mask[row, start : start + len(traj.completion_ids)].tolist()
        assert in_loss == [bool(m) for m in traj.completion_mask]
        obs_text = parts.tokenizer.decode(
            [t for t, m in zip(traj.completion_ids, traj.completion_mask, strict=True) if not m]
        )
        assert obs_text == "" or "<observation>" in obs_text


def test_guidance_puts_a_demonstration_in_every_group_a_random_model_fails(tmp_path):
    result = run(tmp_path, "num_steps=1", "algo.guidance=true", SMALL_SQL)
    assert result.history[0]["guidance/demonstrations"] == 2.0  # prompts_per_step, none solved
    cfg = compose_cfg(tmp_path, "algo.guidance=true", SMALL_SQL)
    groups = collect_groups(
        result.parts, cfg, TaskStream(result.parts.train_tasks, seed=1), 9, StepTimer()
    ).groups
    for group in groups:
        assert [t.demonstration for t in group] == [False] * (len(group) - 1) + [True]
        assert [t.reward > 0.5 for t in group] == [False] * (len(group) - 1) + [True]


@pytest.mark.parametrize("oversample", [1.0, 2.0])
def test_dynamic_sampling_plays_oversample_times_the_missing_groups_a_round_and_keeps_those_that_differ(
    tmp_path, oversample
):
    cfg = compose_cfg(tmp_path, *HALF_FLAT_ENV, "algo.dynamic_sampling=true", f"algo.oversample={oversample}")
    parts = build_parts(cfg)
    collected = collect_groups(parts, cfg, TaskStream(parts.train_tasks, seed=1), 1, StepTimer())
    # the same draws by hand: a round takes ceil(oversample x the missing groups) tasks, and keeps the
    # varied ones up to prompts_per_step (a random model's replies differ in their vowel shares)
    order, kept, prompts, rounds = TaskStream(parts.train_tasks, seed=1), 0, 0, 0
    while kept < cfg.prompts_per_step and rounds < 4:
        tasks = order.next_batch(math.ceil((cfg.prompts_per_step - kept) * oversample))
        kept = min(cfg.prompts_per_step, kept + sum(not task["flat"] for task in tasks))
        prompts, rounds = prompts + len(tasks), rounds + 1
    assert (collected.prompts, collected.rounds) == (prompts, rounds)
    assert len(collected.groups) == cfg.prompts_per_step
    assert all(len({t.reward for t in group}) > 1 for group in collected.groups)


def test_warm_start_then_curriculum_grpo_writes_every_stage_into_the_summary(tmp_path):
    result = run(
        tmp_path, "num_steps=2", "sft.steps=3", "sft.batch_size=4", "curriculum.enabled=true",
        "curriculum.pool_by=[family]", "curriculum.group_by=db_id", "sft.anchor_coef=0.5", SMALL_SQL,
    )  # fmt: skip
    assert [(p.stage, p.step) for p in result.evals] == [("base", 0), ("sft", 3), ("grpo", 2)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["base_accuracy"] == result.evals[0].result.accuracy
    assert summary["grpo_start_accuracy"] == result.evals[1].result.accuracy
    assert summary["final_accuracy"] == result.evals[-1].result.accuracy
    assert (summary["num_eval_tasks"], summary["seed"], summary["sft_steps"]) == (4, 0, 3)
    assert set(summary["by_label"]) == {"family", "difficulty", "db_id"} and summary["wall_s"] > 0
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r.get("stage") == "sft" and "sft/nll" in r] == [1, 2, 3]
    assert all(math.isfinite(r["sft/nll"]) for r in records if "sft/nll" in r)
    # the anchor's demonstrations join each GRPO step's loss
    assert all(math.isfinite(step["anchor/nll"]) and step["anchor/nll"] > 0 for step in result.history)
    rates = {k: v for k, v in result.history[-1].items() if k.startswith("curriculum/pass_rate/")}
    assert rates and all(0.0 < v < 1.0 for v in rates.values())  # Beta(1, 1) posteriors stay inside


@pytest.mark.parametrize("sft_micro, used", [("sft.micro_batch_size=4", 4), ("sft.micro_batch_size=null", 2)])
def test_the_warm_start_runs_micro_batches_of_sft_micro_batch_size_else_the_trainers(
    tmp_path, monkeypatch, sft_micro, used
):
    seen = []

    def recording(*args):
        seen.append(
            args[5]
        )  # warm_start(model, optimizer, sampler, num_steps, pad_token_id, micro_batch_size...
        return warm_start(*args)

    monkeypatch.setattr(stages, "warm_start", recording)
    run(
        tmp_path,
        "num_steps=0",
        "sft.steps=1",
        "sft.batch_size=4",
        "trainer.micro_batch_size=2",
        sft_micro,
        SMALL_SQL,
    )
    assert seen == [used]


def test_the_warm_starts_cosine_schedule_warms_up_then_decays_to_zero_at_its_last_step(tmp_path, monkeypatch):
    histories = []

    def recording(*args):
        histories.append(warm_start(*args))
        return histories[-1]

    monkeypatch.setattr(stages, "warm_start", recording)
    run(
        tmp_path,
        "num_steps=0",
        "sft.steps=5",
        "sft.batch_size=2",
        "sft.lr=0.001",
        "sft.lr_schedule=cosine",
        "sft.warmup_steps=1",
        SMALL_SQL,
    )
    # the LR each step took, by hand: 0 at step 0 (warmup), then 0.5 (1 + cos(pi k / 4)) for k = 0 .. 3
    lrs = [m["sft/lr"] for m in histories[0]]
    assert lrs == pytest.approx([0.0, 1e-3, 8.5355e-4, 5e-4, 1.4645e-4], rel=1e-4)


def test_the_envs_is_success_decides_what_evaluation_and_the_curriculum_count_as_solved(tmp_path):
    env = [
        "env=plugin",
        "env.name=e2e_right_answer_env.RightAnswerEnv",
        "env.tasks._target_=e2e_right_answer_env.right_answer_tasks",
    ]
    result = run(tmp_path, "num_steps=1", "curriculum.enabled=true", *env)
    # every reward is positive, so a positive reward would count every task solved (1.0, and 0.9 below)
    assert [(p.stage, p.result.accuracy, p.result.num_tasks) for p in result.evals] == [
        ("base", 0.5, 4),
        ("grpo", 0.5, 4),
    ]
    # 2 groups of 4 wrong answers: the Beta(1, 1) posterior of 0 successes in 8 attempts, (0 + 1) / (8 + 2)
    assert result.history[-1]["curriculum/pass_rate/all"] == pytest.approx(0.1)


def test_zero_grpo_steps_run_the_warm_start_alone_and_report_it_as_final(tmp_path):
    result = run(tmp_path, "num_steps=0", "sft.steps=2", "sft.batch_size=4", SMALL_SQL)
    assert [(p.stage, p.step) for p in result.evals] == [("base", 0), ("sft", 2)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final_accuracy"] == summary["grpo_start_accuracy"] == result.evals[1].result.accuracy
    assert result.history == []


def test_warm_start_eval_points_score_the_adapter_of_their_step(tmp_path):
    # unconstrained and at a high rate, so the tiny model's replies move within a few steps
    overrides = ["num_steps=0", "sft.batch_size=4", "sft.lr=0.05", SMALL_SQL]
    overrides.append("env.args.constrain_names=false")
    every = run(tmp_path / "a", *overrides, "sft.steps=4", "sft.eval_every=2")
    assert [(p.stage, p.step) for p in every.evals] == [("base", 0), ("sft", 2), ("sft", 4)]
    # a run stopped at step 2 trains the same adapter (same seed, same batches): its greedy replies are the
    # intermediate point's, so that point scored the step-2 adapter, not the base model or the final one
    run(tmp_path / "b", *overrides, "sft.steps=2")

    def replies(run_dir, point):
        return [r["completion"] for r in read_outcomes(run_dir / "evals" / f"held_out_{point}.jsonl")]

    assert replies(tmp_path / "a", "sft_2") == replies(tmp_path / "b", "sft_2")
    # and the three adapters answer differently, so the equality above could not hold for another one
    assert replies(tmp_path / "a", "sft_2") != replies(tmp_path / "a", "base_0")
    assert replies(tmp_path / "a", "sft_4") != replies(tmp_path / "a", "sft_2")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    accuracies = [p["accuracy"] for p in summary["eval_history"]]
    best = accuracies.index(max(accuracies))
    point = summary["eval_history"][best]
    assert summary["best_eval"] == {k: point[k] for k in ("stage", "step", "accuracy")}


WARM = ["sft.steps=2", "sft.batch_size=4", SMALL_SQL]


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_the_warm_start_saves_step_0_and_a_resume_from_it_goes_on_with_grpo(tmp_path):
    straight = run(tmp_path / "a", "num_steps=2", *WARM)
    run(tmp_path / "b", "num_steps=0", *WARM)  # the warm start alone, then a stop
    assert find_latest(tmp_path / "b").name == "step_0"
    resumed = run(tmp_path / "b", "num_steps=2", "resume=true", *WARM)
    assert [p.stage for p in resumed.evals] == ["grpo"] and len(resumed.history) == 2  # no second warm start
    assert [m["policy_loss"] for m in resumed.history] == [m["policy_loss"] for m in straight.history]
    a, b = lora_tensors(straight.parts.model), lora_tensors(resumed.parts.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.usefixtures("fixed_cpu_threads")
def test_a_new_run_starts_from_another_runs_checkpoint(tmp_path):
    warm = run(tmp_path / "a", "num_steps=0", *WARM)
    step_0 = tmp_path / "a" / "checkpoints" / "step_0"
    grpo = run(tmp_path / "b", "num_steps=1", f"checkpoint={step_0}", SMALL_SQL)
    assert [(p.stage, p.step) for p in grpo.evals] == [("checkpoint", 0), ("grpo", 1)]
    # the same adapter: the same replies to the same held-out tasks as the first run's warm start gave
    scored = read_outcomes(tmp_path / "b" / "evals" / "held_out_checkpoint_0.jsonl")
    assert scored == read_outcomes(tmp_path / "a" / "evals" / "held_out_sft_2.jsonl")
    assert grpo.summary["base_accuracy"] is None  # the untouched model was not scored
    assert grpo.summary["grpo_start_accuracy"] == warm.evals[-1].result.accuracy
    more = run(tmp_path / "c", "num_steps=0", f"checkpoint={step_0}", *WARM)
    assert [(p.stage, p.step) for p in more.evals] == [("checkpoint", 0), ("sft", 2)]  # a warm start on top
    # without scoring the checkpoint again: the same GRPO step, from the same adapter
    unscored = run(tmp_path / "d", "num_steps=1", f"checkpoint={step_0}", "eval.at_start=false", SMALL_SQL)
    assert [(p.stage, p.step) for p in unscored.evals] == [("grpo", 1)]
    assert not (tmp_path / "d" / "evals" / "held_out_checkpoint_0.jsonl").exists()
    assert unscored.summary["grpo_start_accuracy"] is None
    assert unscored.history[0]["policy_loss"] == grpo.history[0]["policy_loss"]
    a, b = lora_tensors(grpo.parts.model), lora_tensors(unscored.parts.model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_start_checkpoint_that_is_not_one_stops_the_run_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "build_parts", never_built)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        train.train(compose_cfg(tmp_path / "run", f"checkpoint={tmp_path / 'nope'}"))


def never_built(*args, **kwargs):
    raise AssertionError("build_parts ran: the check came too late")


@pytest.mark.parametrize("override", ["prompts_per_step=-1", "algo.group_size=1", "rollout.temperature=nan"])
def test_a_value_out_of_range_stops_the_run_before_the_model_loads(tmp_path, monkeypatch, override):
    monkeypatch.setattr(train, "build_parts", never_built)
    monkeypatch.setattr(modes, "build_parts", never_built)
    with pytest.raises(ValueError, match=f"config values out of range:\n  {override.split('=')[0]}="):
        train.train(compose_cfg(tmp_path, override))
    with pytest.raises(ValueError, match="config values out of range"):
        modes.eval_only(compose_cfg(tmp_path, override, "mode=eval"))


def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    cfg = compose_cfg(tmp_path)

    def train_raising(error):
        def raising(cfg, dist):
            raise error

        return raising

    monkeypatch.setattr(train, "train", train_raising(ConfigError("algo.beta=-1.0: use a number >= 0")))
    with pytest.raises(SystemExit, match="^error: algo.beta=-1.0: use a number >= 0$"):
        train.main(cfg)
    monkeypatch.setattr(train, "train", train_raising(ValueError("an internal bug")))
    with pytest.raises(ValueError, match="an internal bug"):
        train.main(cfg)


def test_a_run_dir_that_is_a_file_stops_the_run_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "build_parts", never_built)
    (tmp_path / "run").write_text("")
    with pytest.raises(RunDirError, match="run_dir=.*run cannot be written"):
        train.train(compose_cfg(tmp_path / "run"))


def test_a_new_run_into_an_earlier_runs_directory_stops_before_the_model_loads(
    tmp_path, monkeypatch, three_steps
):
    run_dir, _ = three_steps
    monkeypatch.setattr(train, "build_parts", never_built)
    with pytest.raises(RunDirError, match="earlier run's checkpoints .the last: step_3"):
        train.train(compose_cfg(run_dir))
    assert find_latest(run_dir).name == "step_3"


def test_resume_without_a_checkpoint_says_so_and_starts_at_step_0(tmp_path, capsys):
    parts = types.SimpleNamespace(dist=dp.SINGLE_PROCESS)
    assert resume(compose_cfg(tmp_path, "resume=true"), parts, None, None, None, None) is None
    assert f"resume=true, but {tmp_path} holds no complete checkpoint: training starts at step 0" in (
        capsys.readouterr().out
    )
    assert resume(compose_cfg(tmp_path), parts, None, None, None, None) is None
    assert capsys.readouterr().out == ""  # no resume asked, nothing to say


def list_tasks():
    return [{"question": "a row"}] * 10


VOWEL_PLUGIN.list_tasks = list_tasks


def test_a_task_source_returning_a_list_is_one_error_naming_it(tmp_path):
    cfg = compose_cfg(tmp_path, *VOWELS, "env.tasks._target_=e2e_vowel_env.list_tasks")
    with pytest.raises(
        EnvError, match="the task source e2e_vowel_env.list_tasks returned a list; it must return"
    ):
        build_parts(cfg)


def test_mode_eval_prints_accuracy_with_its_interval_by_family_difficulty_and_schema(tmp_path, capsys):
    cfg = compose_cfg(tmp_path, "mode=eval", "env.eval_tasks=6", SMALL_SQL)
    modes.eval_only(cfg)
    out = capsys.readouterr().out
    assert "held-out greedy execution accuracy (base model):" in out
    header, overall = out.splitlines()[1:3]
    assert "95% CI" in header and overall.split()[0] == "all" and overall.split()[-1] == "6"
    labels = {line.split()[0].split("=")[0] for line in out.splitlines()[3:] if "=" in line.split()[0]}
    assert labels == {"family", "difficulty", "db_id"}


def bar_frames(err: str) -> dict[str, list[str]]:
    """Each progress bar's redraws, by its description, in the order the bars first appeared (tqdm starts
    each redraw with a carriage return)."""
    shown: dict[str, list[str]] = {}
    for frame in (f.strip() for f in err.replace("\n", "\r").split("\r")):
        if ": " in frame and "%|" in frame:
            shown.setdefault(frame.split(": ")[0], []).append(frame)
    return shown


def test_with_progress_on_every_stage_shows_a_bar_from_zero_to_its_total(tmp_path, capsys):
    stages = ["num_steps=2", "sft.steps=2", "sft.batch_size=4", SMALL_SQL]
    capsys.readouterr()
    result = run(tmp_path / "on", *stages, "logger.progress=true")
    shown = bar_frames(capsys.readouterr().err)
    num_demos = len(result.parts.train_tasks)  # every built-in task has its gold query
    totals = {
        "held-out eval, base model": "4",  # env.eval_tasks=4
        f"warm start on {num_demos} demonstrations": "2",
        "held-out eval, after 2 warm-start steps": "4",
        "GRPO": "2",
        "held-out eval, GRPO step 2": "4",
    }
    assert list(shown) == list(totals)
    for desc, total in totals.items():
        assert f"| 0/{total} [" in shown[desc][0], shown[desc]
        assert "100%|" in shown[desc][-1] and f"| {total}/{total} [" in shown[desc][-1], shown[desc]
    run(tmp_path / "off", *stages, "logger.progress=false")
    assert bar_frames(capsys.readouterr().err) == {}
