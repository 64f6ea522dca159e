"""The stages around the GRPO steps: the evaluation points (greedy held-out and transfer sets, pass@k from
samples) and, before GRPO, the base model's evaluation and the supervised warm start."""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial

from omegaconf import DictConfig

from envs import start_episodes, step_episodes
from rl.algo.optim import build_lr_scheduler, build_optimizer
from rl.eval.eval_sets import HELD_OUT, EvalSet, score_eval_set, score_samples
from rl.eval.evaluate import EvalResult, play_eval
from rl.eval.pass_at_k import PassAtK, play_samples
from rl.job import distributed as dp
from rl.job.demos import demo_sampler
from rl.job.parts import Parts, warm_start_version
from rl.job.sampling import sampling_params
from rl.job.warm_start import warm_start
from rl.report.logger import ProgressBars, RunLogger
from rl.report.metrics import StepTimer
from rl.report.summary import EvalPoint
from rl.sync.adapter import lora_tensors
from rollout_engine import SamplingParams


def set_player(parts: Parts, cfg: DictConfig, play_fn, labels, **params):
    """`play_fn` (play_eval, play_samples) bound to everything but the tasks of a rank's shard of a set."""
    return partial(
        play_fn,
        parts.engine,
        parts.tokenizer,
        parts.env,
        step_fn=partial(step_episodes, timeout_s=cfg.env.step_timeout_s),
        start_fn=start_episodes,
        max_completion_tokens=cfg.rollout.max_completion_tokens,
        labels=labels,
        **params,
    )


def with_progress(play, bars: ProgressBars, desc: str):
    """`play` (a shard's tasks -> their records) drawing a bar that counts the shard's tasks as they end."""

    def played(tasks):
        with bars.bar(desc, len(tasks), "task") as bar:
            return play(tasks, on_done=bar.update)

    return played


def eval_desc(eval_set: EvalSet, stage: str, step: int, what: str = "eval") -> str:
    """What a progress bar of an evaluation says: the set, and the model it scores."""
    model = {
        "base": "base model",
        "sft": f"after {step} warm-start steps",
        "grpo": f"GRPO step {step}",
        "checkpoint": f"checkpoint step {step}",
    }[stage]
    return f"{eval_set.name.replace('_', '-')} {what}, {model}"


def run_eval(
    parts: Parts, cfg: DictConfig, eval_set: EvalSet, stage: str, step: int, bars: ProgressBars
) -> EvalResult:
    """Score `eval_set` greedily, sharded over the ranks; its outcomes go to RUN_DIR/evals/."""
    greedy = SamplingParams(
        n=1,
        temperature=0.0,
        max_tokens=cfg.rollout.max_tokens,
        stop=list(parts.env.stop) or None,
    )
    play = set_player(parts, cfg, play_eval, eval_set.labels, greedy_params=greedy)
    play = with_progress(play, bars, eval_desc(eval_set, stage, step))
    return score_eval_set(play, eval_set, parts.dist, cfg.run_dir, stage, step)


def run_pass_at_k(
    parts: Parts, cfg: DictConfig, eval_set: EvalSet, stage: str, step: int, bars: ProgressBars
) -> PassAtK:
    """pass@k of `eval_set` from eval.samples samples per task, drawn as GRPO groups are (one request with
    n=K per task, at the rollout's sampling settings); the per-task counts go to RUN_DIR/evals/."""
    params = replace(sampling_params(cfg, parts.env, step, rank=parts.dist.rank), n=cfg.eval.samples)
    play = set_player(parts, cfg, play_samples, eval_set.labels, params=params)
    play = with_progress(play, bars, eval_desc(eval_set, stage, step, f"pass@{cfg.eval.samples}"))
    return score_samples(play, eval_set, cfg.eval.samples, parts.dist, cfg.run_dir, stage, step)


def held_out_set(parts: Parts, cfg: DictConfig) -> EvalSet:
    """The env's held-out tasks as an evaluation set, scored by env.eval_labels."""
    return EvalSet(HELD_OUT, parts.test_tasks, cfg.env.eval_labels)


def eval_point(
    parts: Parts, cfg: DictConfig, stage: str, step: int, bars: ProgressBars, transfer: bool = False
) -> EvalPoint:
    """The held-out set's evaluation, and with `transfer` the transfer set's too (when there is one). With
    eval.samples = K > 0 the held-out set's pass@k from K samples a task follows its greedy accuracy: the
    sampled objective GRPO trains, where a gain shows before it reaches the greedy score."""
    on_transfer = transfer and parts.transfer is not None
    held_out = held_out_set(parts, cfg)
    return EvalPoint(
        stage,
        step,
        run_eval(parts, cfg, held_out, stage, step, bars),
        run_eval(parts, cfg, parts.transfer, stage, step, bars) if on_transfer else None,
        run_pass_at_k(parts, cfg, held_out, stage, step, bars) if cfg.eval.samples else None,
    )


def supervised_warm_start(
    parts: Parts, cfg: DictConfig, logger: RunLogger | None, bars: ProgressBars, timer: StepTimer
) -> list[EvalPoint]:
    """sft.steps supervised steps on the env's demonstrations of training tasks, on the same LoRA adapter
    (its own AdamW); then the adapter is synced into the engine. Under torchrun the ranks share each epoch
    of batches (`DemoSampler`) and DDP averages their gradients. With sft.eval_every = k the held-out set is
    scored every k steps before the last (the adapter synced into the engine first); those points are
    returned."""
    sampler = demo_sampler(parts, cfg)
    optimizer = build_optimizer(parts.model, cfg.sft.lr, weight_decay=cfg.trainer.weight_decay)
    scheduler = build_lr_scheduler(
        optimizer, cfg.sft.lr_schedule.value, cfg.sft.warmup_steps, num_training_steps=cfg.sft.steps
    )
    evals = []
    with bars.bar(f"warm start on {sampler.num_demos} demonstrations", cfg.sft.steps, "step") as bar:

        def on_step(step: int, metrics: dict[str, float]) -> None:
            bar.set_postfix(nll=f"{metrics['sft/nll']:.3f}", refresh=False)
            bar.update()
            every = cfg.sft.eval_every
            if every and step % every == 0 and step != cfg.sft.steps:
                parts.engine.update_lora(lora_tensors(parts.model), version=warm_start_version(step))
                started = time.perf_counter()
                evals.append(eval_point(parts, cfg, "sft", step, bars))
                seconds = time.perf_counter() - started
                timer.add("eval", seconds)
                timer.add("sft", -seconds)  # the warm start's time is its steps'
                metrics = {**metrics, **evals[-1].metrics()}
            if logger is not None:
                logger.log_stage("sft", step, metrics)

        warm_start(
            parts.train_model,
            optimizer,
            sampler,
            cfg.sft.steps,
            parts.tokenizer.pad_token_id,
            cfg.sft.micro_batch_size or cfg.trainer.micro_batch_size,
            cfg.trainer.max_grad_norm,
            on_step,
            scheduler,
        )
    dp.check_replicas(lora_tensors(parts.model), parts.dist)
    parts.engine.update_lora(lora_tensors(parts.model), version=warm_start_version(cfg.sft.steps))
    return evals


def stages_before_grpo(
    parts: Parts,
    cfg: DictConfig,
    logger: RunLogger | None,
    bars: ProgressBars,
    timer: StepTimer,
    start: tuple[str, int] = ("base", 0),
) -> list[EvalPoint]:
    """A fresh run scores the policy it starts from (`start`: the base model, or ("checkpoint", its step)
    when cfg.checkpoint gave the adapter; not with eval.at_start=false), then (sft.steps > 0) runs the warm
    start and scores it again; step 0 of the log holds what GRPO starts from, where it was scored."""
    evals = []
    if cfg.eval.at_start:
        with timer("eval"):
            evals.append(eval_point(parts, cfg, *start, bars, transfer=True))
    if cfg.sft.steps > 0:
        if logger is not None and evals:
            logger.log_stage(start[0], 0, evals[-1].metrics())
        with timer("sft"):
            evals += supervised_warm_start(parts, cfg, logger, bars, timer)
        with timer("eval"):
            evals.append(eval_point(parts, cfg, "sft", cfg.sft.steps, bars, transfer=True))
    if logger is not None and evals:
        logger.log(0, evals[-1].metrics())
    return evals
