"""One GRPO step, as the algorithm reads: sample and play the groups, rewards to group-relative advantages,
the batch, the policy update on the LoRA weights (`rl.algo.trainer.train_step`), the new adapter into the
engine, and what the step did (its metrics)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from omegaconf import DictConfig, OmegaConf
from peft import PeftModel

from envs import start_episodes, step_episodes
from rl.algo.advantages import compute_advantages, filter_zero_std_groups, group_rewards
from rl.algo.batch import RolloutBatch, to_rollout_batch
from rl.algo.step_stats import StepStats
from rl.algo.trainer import train_step
from rl.job import distributed as dp
from rl.job.demos import demo_batch, demo_sampler
from rl.job.guidance import guide_failed_groups
from rl.job.parts import Parts, grpo_version
from rl.job.sampling import sampling_params
from rl.report.metrics import StepTimer, engine_metrics, memory_metrics, reward_metrics
from rl.rollout.play import group_outcomes, play_groups
from rl.sync.adapter import lora_tensors
from rl.tasks import TaskOrder
from rl.tasks.curriculum import Curriculum
from rl.tasks.stream import TaskStream

# DAPO dynamic sampling: rounds of fresh prompts that may replace the groups whose rewards are all equal
DYNAMIC_SAMPLING_ROUNDS = 4


def task_stream(parts: Parts, cfg: DictConfig) -> TaskOrder:
    """The order training tasks come in: seeded epochs, or the adaptive curriculum."""
    c = cfg.curriculum
    if not c.enabled:
        return TaskStream(parts.train_tasks, seed=cfg.seed)
    return Curriculum(parts.train_tasks, cfg.seed, c.pool_by, c.prior_strength, c.min_attempts, c.group_by)


@dataclass
class PolicyUpdate:
    """The run's policy update, `update(batch, step)`: `step_fn` (train_step bound to everything but the
    batch) with, at GRPO step s, `anchor(s)`'s demonstrations. With algo.beta > 0 and
    algo.kl_reference=start it holds `reference`, the adapter weights the KL is taken against: those of
    `model` at the first GRPO step (the warm start's end, or the checkpoint= the run began from), kept in
    every checkpoint and given back by a resume."""

    step_fn: Callable[..., StepStats]
    anchor: Callable[[int], RolloutBatch] | None = None
    model: PeftModel | None = None  # whose adapter becomes the reference; None: no start reference
    reference: dict[str, torch.Tensor] | None = None

    def __call__(self, batch: RolloutBatch, step: int) -> StepStats:
        if self.model is not None and self.reference is None:
            self.reference = {name: t.clone() for name, t in lora_tensors(self.model).items()}
        anchor = None if self.anchor is None else self.anchor(step)
        return self.step_fn(batch, anchor=anchor, reference=self.reference)


def policy_update(parts: Parts, cfg: DictConfig, optimizer, scheduler) -> PolicyUpdate:
    """train_step bound to everything but the batch and the step: the model, its optimizer and LR schedule,
    the algo.* settings of the update (a LossConfig, checked once here), micro-batches and the sampling
    settings. With sft.anchor_coef > 0 each step's loss also takes that much of the NLL of a batch of the
    env's demonstrations, drawn by the step (`DemoSampler.batch_at`), so a resume draws the same."""
    loss = OmegaConf.to_object(cfg.algo)
    step_fn = partial(
        train_step,
        parts.train_model,
        optimizer,
        scheduler,
        loss=loss,
        micro_batch_size=cfg.trainer.micro_batch_size,
        max_grad_norm=cfg.trainer.max_grad_norm,
        temperature=cfg.rollout.temperature,
        max_completion_length=cfg.rollout.max_completion_tokens,
    )
    keeps_start = loss.beta > 0.0 and loss.kl_reference.value == "start"
    update = PolicyUpdate(step_fn, model=parts.model if keeps_start else None)
    if cfg.sft.anchor_coef > 0.0:
        sampler = demo_sampler(parts, cfg)
        pad, coef, after = parts.tokenizer.pad_token_id, cfg.sft.anchor_coef, cfg.sft.steps
        # GRPO step s takes the batch after the warm start's sft.steps and the s - 1 before it
        update.anchor = lambda step: demo_batch(sampler.batch_at(after + step - 1), pad, coef)
    return update


@dataclass(slots=True)
class Collected:
    groups: list  # the groups the step trains on
    prompts: int  # prompts played for them on this rank, over all rounds (dynamic sampling's cost)
    rounds: int  # engine calls made


def collect_groups(parts: Parts, cfg: DictConfig, stream, step: int, timer: StepTimer) -> Collected:
    """Play prompts_per_step GRPO groups. With DAPO dynamic sampling, groups whose rewards are all equal carry
    no advantage signal: they are dropped and fresh prompts replace them, in up to DYNAMIC_SAMPLING_ROUNDS
    rounds; each round plays ceil(algo.oversample x the groups still needed) prompts in one engine call and
    keeps the first whose rewards differ (when none is kept, the last round's groups are used). A curriculum
    hears every played group's successes (from all ranks), before algo.guidance puts demonstrations in the
    groups that all failed (rl.job.guidance), which dynamic sampling then keeps."""

    def timed_env_step(episodes, actions):
        with timer("env"):
            return step_episodes(episodes, actions, timeout_s=cfg.env.step_timeout_s)

    dynamic = cfg.algo.dynamic_sampling
    kept, prompts, rounds = [], 0, 0
    for round_ in range(DYNAMIC_SAMPLING_ROUNDS if dynamic else 1):
        needed = cfg.prompts_per_step - len(kept)
        count = math.ceil(needed * cfg.algo.oversample) if dynamic and needed else needed
        tasks = dp.next_shard(stream, count, parts.dist)
        groups = [start_episodes(parts.env, [task] * cfg.algo.group_size) for task in tasks]
        played = play_groups(
            parts.engine,
            parts.tokenizer,
            groups,
            sampling_params(cfg, parts.env, step, round_, parts.dist.rank),
            timed_env_step,
            cfg.rollout.max_completion_tokens,
            response_prefix=parts.env.response_prefix,
        )
        prompts, rounds = prompts + len(tasks), rounds + 1
        outcomes = group_outcomes(parts.env, tasks, played)
        stream.record([o for rank in dp.gather_objects(outcomes, parts.dist) for o in rank])
        if cfg.algo.guidance:
            played = guide_failed_groups(
                parts.env,
                parts.tokenizer,
                parts.train_model,
                played,
                tasks,
                micro_batch_size=cfg.trainer.micro_batch_size,
                temperature=cfg.rollout.temperature,
                max_completion_tokens=cfg.rollout.max_completion_tokens,
                timeout_s=cfg.env.step_timeout_s,
            )
        if dynamic and played:
            keep = filter_zero_std_groups(group_rewards(played)).tolist()
            kept += [group for group, differs in zip(played, keep, strict=True) if differs][:needed]
        else:
            kept += played
        if dp.all_ranks(len(kept) == cfg.prompts_per_step, parts.dist):
            break
    return Collected(kept or played[: cfg.prompts_per_step], prompts, rounds)


def grpo_step(parts: Parts, cfg: DictConfig, update, stream, step: int, timer: StepTimer):
    """One GRPO step on this rank: its metrics and the groups it played. `update` is the run's
    `policy_update`."""
    timer.begin_step()
    engine_before = parts.engine.stats()
    with timer("generate"):
        collected = collect_groups(parts, cfg, stream, step, timer)  # 1. sample and play the groups
        groups = collected.groups
    timer.add("generate", -timer.last("env"))
    with timer("train"):
        rewards = group_rewards(groups)  # 2. rewards -> group-relative advantages
        advantages = compute_advantages(rewards, cfg.algo.estimator.value, cfg.algo.scale.value)
        batch = to_rollout_batch(groups, advantages, parts.tokenizer.pad_token_id)  # 3. the batch
        stats = update(batch, step)  # 4. the clipped policy-gradient step on the LoRA weights
    with timer("sync"):  # 5. the new adapter into the engine
        adapter = lora_tensors(parts.model)
        dp.check_replicas(adapter, parts.dist)
        sync_stats = parts.engine.update_lora(adapter, version=grpo_version(step, cfg.sft.steps))
    metrics = {  # 6. what the step did
        **reward_metrics(groups, rewards),
        **stats.as_dict(),
        **sync_stats.metrics(),
        **engine_metrics(parts.engine, engine_before, timer.last("generate")),
        **timer.metrics(),
        **memory_metrics(parts.engine),
        **stream.metrics(),
        "dynamic_sampling/prompts": float(collected.prompts),
        "dynamic_sampling/rounds": float(collected.rounds),
    }
    return metrics, groups
