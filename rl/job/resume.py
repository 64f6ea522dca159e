"""The run's bookkeeping around its GRPO steps: resuming from the latest checkpoint, opening the logger, and
logging each step."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rl.job import distributed as dp
from rl.job.checkpoint import find_latest, load_checkpoint
from rl.job.grpo_step import PolicyUpdate
from rl.job.parts import Parts, grpo_version
from rl.report.logger import RunLogger, SampleRow
from rl.sync.adapter import lora_tensors


def resume(cfg: DictConfig, parts: Parts, optimizer, scheduler, stream, update: PolicyUpdate) -> int | None:
    """With resume=true, load rank 0's latest checkpoint on every rank, the policy update's KL reference
    included; returns the step it ended (0: the warm start's), or None when the run starts afresh."""
    latest = dp.broadcast_object(
        find_latest(cfg.run_dir) if cfg.resume and parts.dist.is_main else None, parts.dist
    )
    if latest is None:
        if cfg.resume and parts.dist.is_main:
            print(f"resume=true, but {cfg.run_dir} holds no complete checkpoint: training starts at step 0")
        return None
    state = load_checkpoint(latest, parts.model, optimizer, scheduler)
    stream.restore(state.data_position)
    if state.reference is not None:
        device = next(parts.model.parameters()).device
        update.reference = {name: t.to(device) for name, t in state.reference.items()}
    parts.engine.update_lora(lora_tensors(parts.model), version=grpo_version(state.step, cfg.sft.steps))
    if parts.dist.is_main:
        print(f"resumed from {latest} at step {state.step}")
    return state.step


def open_logger(cfg: DictConfig, start_step: int) -> RunLogger:
    """The JSONL / W&B / progress-bar logger (rank 0's alone under torchrun)."""
    return RunLogger(
        cfg.run_dir,
        project=cfg.logger.wandb.project,
        run_name=cfg.logger.wandb.run_name,
        wandb_mode=cfg.logger.wandb.mode.value,
        config=OmegaConf.to_container(cfg, resolve=True),
        total_steps=cfg.num_steps,
        start_step=start_step,
        sample_every=cfg.logger.samples_every,
        progress=cfg.logger.progress,
        resume=cfg.resume,
    )


def log_step(logger: RunLogger, step: int, metrics: dict[str, float], trajectories, tokenizer) -> None:
    """The step's metrics, and every samples_every steps a table of this rank's samples."""
    logger.log(step, metrics)
    if logger.wants_samples(step):
        flat = [t for group in trajectories for t in group]
        rows = [SampleRow(tokenizer.decode(t.prompt_ids), t.text, t.reward) for t in flat]
        logger.log_samples(step, rows)
