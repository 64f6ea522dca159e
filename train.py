"""pagedrl: GRPO post-training with a colocated paged rollout engine.

    python train.py [group=option ...] [key=value ...]      (Hydra; see conf/train.yaml)
    torchrun --nproc-per-node N train.py [overrides ...]     (data parallel: one rank per GPU, gloo on CPU)

Under torchrun each rank colocates its own trainer and engine on its own device (cuda:LOCAL_RANK). Every
rank walks the same task stream; prompts_per_step is per rank (like TRL's per-device batch), so a step
trains on prompts_per_step x N groups. LoRA gradients are all-reduced (DDP), each rank hot-syncs the
identical weights into its own engine, the held-out set is sharded over the ranks, and rank 0 alone logs
(metrics combined over the ranks) and checkpoints. On CPU the ranks of a node split the engine's RAM budget.

Reads top to bottom: build the parts from the config (rl/job/parts.py), score the base model and run the warm
start (rl/job/stages.py), screen the curriculum's tasks when asked (rl/job/screen.py), then take the GRPO
steps (rl/job/grpo_step.py: sample groups with the engine, play them against the environment, turn rewards
into advantages, take an optimisation step on the LoRA weights, hot-sync them into the engine), logging,
checkpointing and evaluating between them. mode=eval and mode=export run from rl/job/modes.py, and so does
mode=serve (its server is serve/).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import dataclass

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from envs import EnvError
from rl.algo.optim import build_lr_scheduler, build_optimizer
from rl.config.checks import check_config
from rl.config.schema import register_configs
from rl.job import distributed as dp
from rl.job.checkpoint import RunDirError, check_checkpoint, check_run_dir, save_checkpoint
from rl.job.grpo_step import grpo_step, policy_update, task_stream
from rl.job.model_loading import ModelLoadError
from rl.job.modes import eval_only, export_only, serve_only
from rl.job.parts import Parts, build_parts, load_policy_checkpoint
from rl.job.resume import log_step, open_logger, resume
from rl.job.screen import screen_tasks
from rl.job.stages import eval_point, stages_before_grpo
from rl.report.logger import ProgressBars
from rl.report.metrics import StepTimer, combine_rank_metrics
from rl.report.summary import EvalPoint, run_summary, summary_text, write_summary
from rl.settings import ConfigError

register_configs()
# what the user can fix: printed as one line; any other exception is a bug and keeps its traceback
USER_ERRORS = (ConfigError, ModelLoadError, EnvError, FileNotFoundError, RunDirError)


@dataclass
class RunResult:
    parts: Parts
    evals: list[EvalPoint]
    history: list[dict[str, float]]
    summary: dict


def train(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> RunResult:
    started = time.monotonic()
    check_config(cfg)
    cfg.run_dir = dp.broadcast_object(cfg.run_dir, dist)  # Hydra may stamp each rank's directory differently
    if dist.is_main:
        check_run_dir(cfg.run_dir, cfg.resume)  # before the model loads: the logs and checkpoints go there
    if cfg.checkpoint:
        check_checkpoint(cfg.checkpoint)
    parts = build_parts(cfg, dist)
    start = ("base", 0)
    if cfg.checkpoint:  # the adapter a new run starts from: its weights alone (a fresh optimizer, step 0)
        start = ("checkpoint", load_policy_checkpoint(cfg, parts.model, parts.engine))
    optimizer = build_optimizer(parts.model, cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
    scheduler = build_lr_scheduler(
        optimizer,
        cfg.trainer.lr_schedule.value,
        warmup_steps=cfg.trainer.warmup_steps,
        num_training_steps=cfg.num_steps * cfg.algo.num_iterations,
    )
    update = policy_update(parts, cfg, optimizer, scheduler)
    stream = task_stream(parts, cfg)
    resumed_at = resume(cfg, parts, optimizer, scheduler, stream, update)  # None: a fresh run
    start_step = resumed_at or 0
    logger = open_logger(cfg, start_step) if dist.is_main else None  # rank 0 alone logs and checkpoints
    bars = logger.bars if logger is not None else ProgressBars(enabled=False)
    timer, history = StepTimer(), []

    def save(step: int) -> None:
        save_checkpoint(
            cfg.run_dir,
            step,
            parts.model,
            optimizer,
            scheduler,
            data_position=stream.position(),
            config_yaml=OmegaConf.to_yaml(cfg, resolve=True),
            keep_last=cfg.keep_checkpoints,
            reference=update.reference,
        )

    evals = []
    if resumed_at is None:
        evals = stages_before_grpo(parts, cfg, logger, bars, timer, start)
        if cfg.curriculum.screen_tasks:  # the curriculum's first records, from the policy GRPO starts from
            screened = screen_tasks(parts, cfg, stream, timer)
            if logger is not None:
                logger.log(0, screened)
        if logger is not None and cfg.sft.steps > 0 and cfg.checkpoint_every:
            save(0)  # the warm start's adapter, what GRPO starts from: step_0
    if logger is not None:
        logger.start_grpo()
    for step in range(start_step + 1, cfg.num_steps + 1):
        local, trajectories = grpo_step(parts, cfg, update, stream, step, timer)
        metrics = combine_rank_metrics(dp.gather_objects(local, dist))
        if cfg.eval_every and step % cfg.eval_every == 0 and step != cfg.num_steps:
            with timer("eval"):
                evals.append(eval_point(parts, cfg, "grpo", step, bars))  # the transfer set: not here
            metrics.update(evals[-1].metrics())
        history.append(metrics)
        if logger is None:
            continue
        log_step(logger, step, metrics, trajectories, parts.tokenizer)
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or step == cfg.num_steps):
            save(step)
    if logger is not None:
        logger.end_grpo()
    final_eval = cfg.num_steps > 0 or not evals  # num_steps=0: the warm start's evaluation is the last
    if final_eval:
        with timer("eval"):
            evals.append(eval_point(parts, cfg, "grpo", cfg.num_steps, bars, transfer=True))
    words = parts.env.score_words
    summary = run_summary(evals, cfg.seed, time.monotonic() - started, cfg.sft.steps, words)
    if logger is not None:
        if final_eval:
            logger.log(cfg.num_steps, evals[-1].metrics())
        logger.log_summary(summary)
        logger.close()
        write_summary(cfg.run_dir, summary)
        print(summary_text(summary, history, timer))
    return RunResult(parts, evals, history, summary)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    torch.manual_seed(cfg.seed)
    try:
        with dp.distributed(cfg.model.device) as dist:
            modes = {"train": train, "eval": eval_only, "export": export_only, "serve": serve_only}
            modes[cfg.mode.value](cfg, dist)
    except USER_ERRORS as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"error: {err}")
    except KeyboardInterrupt:
        sys.exit("interrupted (Ctrl-C)")
    finally:
        gc.collect()  # under `-m` (multirun) the next job's engine must not meet this one's KV pool


if __name__ == "__main__":
    main()
