"""Typed schemas for the Hydra config tree in `conf/`.

Every group's YAML is merged into these dataclasses, so an unknown key or a value of the wrong type is rejected
at composition with a message that names the key. Only `train.py` reads the config tree; components take flat
arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from rl.models import DTYPES, MODEL_NAMES

ModelName = Enum("ModelName", [(name, name) for name in MODEL_NAMES], type=str)
DType = Enum("DType", [(name, name) for name in ("auto", *DTYPES)], type=str)


@dataclass
class ModelConfig:
    name: ModelName = MISSING
    path: str | None = None  # model=hf: a local checkpoint directory or Hub id
    dtype: DType = DType.auto  # auto: bf16 on CUDA, fp32 on CPU
    device: str = "auto"
    seed: int = 0  # initialisation seed of the tiny random models


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    seed: int = 0


def register_configs() -> None:
    """Register the schemas that conf/*.yaml extend through their defaults lists."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
