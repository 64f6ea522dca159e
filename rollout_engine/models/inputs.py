"""What one engine step hands the paged model: packed tokens, attention metadata, logits rows, LoRA mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollout_engine.lora import LoraTokens
from rollout_engine.models.attention import AttentionMetadata


@dataclass(slots=True)
class StepInputs:
    """One step's tensors, made by ModelRunner.prepare and read by the eager forward and the CUDA graphs."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_rows] int64
    lora: LoraTokens
