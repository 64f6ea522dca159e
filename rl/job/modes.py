"""The modes that run no training: mode=eval scores the base model or a checkpoint, mode=export merges a
checkpoint's adapter into a plain Hugging Face model (mode=serve lives in serve/command.py)."""

from __future__ import annotations

from omegaconf import DictConfig

from rl.job import distributed as dp
from rl.job.config_checks import check_config
from rl.job.export import export_checkpoint
from rl.job.logger import ProgressBars
from rl.job.parts import build_parts, load_policy_checkpoint, model_settings
from rl.job.stages import eval_point, held_out_set, run_pass_at_k


def eval_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=eval: the held-out (and transfer) sets scored greedily, then with eval.samples their pass@k."""
    check_config(cfg)
    parts = build_parts(cfg, dist)
    stage, step = "base", 0
    if cfg.checkpoint:
        stage, step = "checkpoint", load_policy_checkpoint(cfg, parts.model, parts.engine)
    bars = ProgressBars(enabled=cfg.logger.progress and dist.is_main)
    # outcomes: RUN_DIR/evals/<set>_<stage>_<step>
    point = eval_point(parts, cfg, stage, step, bars, transfer=True)
    success = parts.env.score_words.success
    if dist.is_main:
        print(f"held-out greedy {success} ({cfg.checkpoint or 'base model'}):")
        print(point.result.table())
        if point.transfer is not None:
            print(f"transfer set greedy {success} ({cfg.checkpoint or 'base model'}):")
            print(point.transfer.table())
    for eval_set, greedy in [(held_out_set(parts, cfg), point.result), (parts.transfer, point.transfer)]:
        if cfg.eval.samples and greedy is not None:  # counts: RUN_DIR/evals/<set>_passk_<stage>_<step>
            passk = run_pass_at_k(parts, cfg, eval_set, stage, step, bars)
            if dist.is_main:
                print(
                    f"{eval_set.name} pass@k from {cfg.eval.samples} samples per task at rollout.temperature="
                    f"{cfg.rollout.temperature} ({cfg.checkpoint or 'base model'}):\n{passk.table(greedy)}"
                )


def export_only(cfg: DictConfig, dist: dp.DistInfo = dp.SINGLE_PROCESS) -> None:
    """mode=export: the checkpoint's adapter merged into the base model, as a plain Hugging Face model."""
    check_config(cfg)
    export_checkpoint(cfg.checkpoint, cfg.export.dir, *model_settings(cfg, dist), dist.world_size)
