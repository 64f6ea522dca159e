"""The job's config and parts, composed and built as `train.py` does, for benchmarks that time one piece of a
run. The run directory is a temporary one, and W&B is off."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rl.config.schema import register_configs  # noqa: E402
from rl.job.parts import Parts, build_parts  # noqa: E402


def job_parts(overrides: list[str]) -> tuple[DictConfig, Parts]:
    """(cfg, parts) of the job under these Hydra overrides of conf/train.yaml."""
    register_configs()
    with tempfile.TemporaryDirectory() as run_dir:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=[*overrides, f"run_dir={run_dir}", "logger.wandb.mode=disabled"])
        return cfg, build_parts(cfg)
