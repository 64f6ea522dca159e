"""pagedrl: GRPO post-training with a colocated paged rollout engine.

    python train.py [group=option ...] [key=value ...]      (Hydra; see conf/train.yaml)

Reads top to bottom: build the parts from the config, evaluate, then each step sample GRPO groups with the
engine, play them against the environment, turn rewards into advantages, take an optimisation step on the LoRA
weights, hot-sync them into the engine, log, checkpoint and evaluate.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import hydra
import torch
from datasets import Dataset
from omegaconf import DictConfig, OmegaConf

from envs import EnvError, make_env, start_episodes, step_episodes
from rl.checkpoint import find_latest, load_checkpoint, save_checkpoint
from rl.config import register_configs
from rl.data import TaskStream
from rl.evaluate import EvalResult, evaluate
from rl.lora import add_lora, lora_tensors
from rl.metrics import RunLogger, SampleRow
from rl.models import ModelLoadError, load_model
from rl.optim import build_lr_scheduler, build_optimizer
from rl.rollout import play_groups, to_rollout_batch
from rl.rollout_worker import RemoteEngine, build_worker
from rl.step_metrics import StepTimer, engine_metrics, memory_metrics, reward_metrics, summary_text
from rl.trainer import train_step
from rl.weight_sync import DistributedSync, InProcessSync
from rollout_engine import LLMEngine, SamplingParams

register_configs()
USER_ERRORS = (ModelLoadError, EnvError, ValueError, FileNotFoundError)


@dataclass
class Parts:
    model: torch.nn.Module
    tokenizer: object
    engine: object
    sync: object
    env: object
    train_tasks: object
    test_tasks: object


def build_engine(model, tokenizer, cfg: DictConfig, model_kwargs: dict, lora_kwargs: dict):
    """The engine and the transport that hot-syncs LoRA weights into it (colocated, or in a worker)."""
    r = cfg.rollout
    engine_kwargs = dict(
        block_size=r.block_size,
        memory_fraction=r.memory_fraction,
        max_num_seqs=r.max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens,
        memory_budget_bytes=r.memory_budget_bytes,
        max_model_len=r.max_model_len,
    )
    if r.placement.value == "inprocess":
        engine = LLMEngine(model, tokenizer, **engine_kwargs)
        return engine, InProcessSync(engine)
    sync = DistributedSync(
        build_worker,
        factory_args=(model_kwargs, lora_kwargs, engine_kwargs),
        bucket_bytes=r.sync_bucket_mb << 20,
    )
    return RemoteEngine(sync), sync


def build_parts(cfg: DictConfig) -> Parts:
    model_kwargs = dict(
        name=cfg.model.name.value,
        path=cfg.model.path,
        dtype=cfg.model.dtype.value,
        device=cfg.model.device,
        seed=cfg.model.seed,
    )
    lora_kwargs = dict(
        rank=cfg.lora.rank,
        alpha=cfg.lora.alpha,
        dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules,
        use_rslora=cfg.lora.use_rslora,
    )
    model, tokenizer = load_model(**model_kwargs)
    model = add_lora(model, **lora_kwargs)
    engine, sync = build_engine(model, tokenizer, cfg, model_kwargs, lora_kwargs)
    sync.push(lora_tensors(model), version=0)
    env = make_env(cfg.env.name, **cfg.env.args)
    tasks = hydra.utils.call(cfg.env.tasks)
    if isinstance(tasks, Dataset):
        tasks = tasks.train_test_split(test_size=0.1, seed=cfg.seed)
    test_tasks = tasks["test"].select(range(min(cfg.env.eval_tasks, len(tasks["test"]))))
    return Parts(model, tokenizer, engine, sync, env, tasks["train"], test_tasks)


def sampling_params(cfg: DictConfig, env, step: int, round_: int = 0) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        n=cfg.algo.group_size,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        max_tokens=r.max_tokens,
        seed=cfg.seed * 1_000_003 + step * 7919 + round_,
        stop=list(getattr(env, "stop", ())) or None,
    )


def run_eval(parts: Parts, cfg: DictConfig) -> EvalResult:
    greedy = SamplingParams(
        n=1,
        temperature=0.0,
        max_tokens=cfg.rollout.max_tokens,
        stop=list(getattr(parts.env, "stop", ())) or None,
    )
    return evaluate(
        parts.engine,
        parts.tokenizer,
        parts.env,
        list(parts.test_tasks),
        greedy,
        step_episodes,
        start_episodes,
        cfg.rollout.max_completion_tokens,
    )


def collect_groups(parts: Parts, cfg: DictConfig, stream: TaskStream, step: int, timer: StepTimer):
    """Play prompts_per_step GRPO groups; with DAPO dynamic sampling, groups whose rewards are all equal are
    replaced by fresh prompts (up to 4 rounds), since they carry no advantage signal."""

    def timed_env_step(episodes, actions):
        with timer("env"):
            return step_episodes(episodes, actions)

    kept = []
    for round_ in range(4 if cfg.algo.dynamic_sampling else 1):
        tasks = stream.next_batch(cfg.prompts_per_step - len(kept))
        groups = [start_episodes(parts.env, [task] * cfg.algo.group_size) for task in tasks]
        played = play_groups(
            parts.engine,
            parts.tokenizer,
            groups,
            sampling_params(cfg, parts.env, step, round_),
            timed_env_step,
            cfg.rollout.max_completion_tokens,
        )
        kept += [g for g in played if not cfg.algo.dynamic_sampling or len({t.reward for t in g}) > 1]
        if len(kept) == cfg.prompts_per_step:
            break
    return kept or played


@dataclass
class RunResult:
    parts: Parts
    before: EvalResult | None
    after: EvalResult
    history: list[dict[str, float]]


def train_step_metrics(parts: Parts, cfg: DictConfig, optimizer, scheduler, stream, step: int, timer):
    """One GRPO step: generate groups, play them out, update the LoRA weights, sync them into the engine."""
    timer.begin_step()
    engine_before = parts.engine.stats()
    with timer("generate"):
        trajectories = collect_groups(parts, cfg, stream, step, timer)
    timer.add("generate", -timer.last("env"))
    with timer("train"):
        batch, rewards = to_rollout_batch(
            trajectories, parts.tokenizer.pad_token_id, cfg.algo.estimator.value, cfg.algo.scale.value
        )
        stats = train_step(
            parts.model,
            optimizer,
            scheduler,
            batch,
            num_iterations=cfg.algo.num_iterations,
            micro_batch_size=cfg.trainer.micro_batch_size,
            max_grad_norm=cfg.trainer.max_grad_norm,
            loss_type=cfg.algo.loss_type.value,
            eps_low=cfg.algo.eps_low,
            eps_high=cfg.algo.eps_high,
            dual_clip_c=cfg.algo.dual_clip_c,
            gspo=cfg.algo.gspo,
            beta=cfg.algo.beta,
            kl_estimator=cfg.algo.kl_estimator.value,
            is_mode=None if cfg.algo.is_mode.value == "none" else cfg.algo.is_mode.value,
            is_cap=cfg.algo.is_cap,
            mask_truncated_completions=cfg.algo.mask_truncated_completions,
            max_completion_length=cfg.rollout.max_completion_tokens,
            temperature=cfg.rollout.temperature,
        )
    with timer("sync"):
        sync_stats = parts.sync.push(lora_tensors(parts.model), version=step + 1)
    metrics = {
        **reward_metrics(trajectories, rewards),
        **stats.as_dict(),
        **sync_stats.metrics(),
        **engine_metrics(parts.engine, engine_before, timer.last("generate")),
        **timer.metrics(),
        **memory_metrics(parts.engine),
    }
    return metrics, trajectories


def train(cfg: DictConfig) -> RunResult:
    parts = build_parts(cfg)
    optimizer = build_optimizer(parts.model, cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
    scheduler = build_lr_scheduler(
        optimizer,
        cfg.trainer.lr_schedule.value,
        warmup_steps=cfg.trainer.warmup_steps,
        num_training_steps=cfg.num_steps * cfg.algo.num_iterations,
    )
    stream = TaskStream(parts.train_tasks, seed=cfg.seed)
    start_step = 0
    latest = find_latest(cfg.run_dir) if cfg.resume else None
    if latest is not None:
        state = load_checkpoint(latest, parts.model, optimizer, scheduler)
        stream.restore(state.data_position)
        start_step = state.step
        parts.sync.push(lora_tensors(parts.model), version=start_step + 1)
        print(f"resumed from {latest} at step {start_step}")
    logger = RunLogger(
        cfg.run_dir,
        project=cfg.logger.wandb.project,
        run_name=cfg.logger.wandb.run_name,
        wandb_mode=cfg.logger.wandb.mode.value,
        config=OmegaConf.to_container(cfg, resolve=True),
        total_steps=cfg.num_steps,
        start_step=start_step,
        sample_every=cfg.logger.samples_every,
        progress=cfg.logger.progress,
    )
    timer, history, before = StepTimer(), [], None
    if start_step == 0:
        with timer("eval"):
            before = run_eval(parts, cfg)
        logger.log(0, before.metrics())
    for step in range(start_step + 1, cfg.num_steps + 1):
        metrics, trajectories = train_step_metrics(parts, cfg, optimizer, scheduler, stream, step, timer)
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.num_steps:
            with timer("eval"):
                metrics.update(run_eval(parts, cfg).metrics())
        logger.log(step, metrics)
        history.append(metrics)
        if logger.wants_samples(step):
            flat = [t for group in trajectories for t in group]
            rows = [SampleRow(parts.tokenizer.decode(t.prompt_ids), t.text, t.reward) for t in flat]
            logger.log_samples(step, rows)
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.num_steps):
            save_checkpoint(
                cfg.run_dir,
                step,
                parts.model,
                optimizer,
                scheduler,
                data_position=stream.position(),
                config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
                keep_last=cfg.keep_checkpoints,
            )
    with timer("eval"):
        after = run_eval(parts, cfg)
    logger.log(cfg.num_steps, after.metrics())
    logger.close()
    print(summary_text(before, after, history, timer))
    return RunResult(parts, before, after, history)


def eval_only(cfg: DictConfig) -> None:
    parts = build_parts(cfg)
    if cfg.checkpoint:
        load_checkpoint(cfg.checkpoint, parts.model, restore_rng=False)
        parts.sync.push(lora_tensors(parts.model), version=1)
    result = run_eval(parts, cfg)
    print(f"held-out greedy execution accuracy ({cfg.checkpoint or 'base model'}):")
    print(result.table())


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    torch.manual_seed(cfg.seed)
    try:
        (train if cfg.mode.value == "train" else eval_only)(cfg)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
