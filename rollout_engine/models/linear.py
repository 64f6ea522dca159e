"""Every projection of the paged forward goes through `linear`, the one place where LoRA hooks in."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rollout_engine.lora import LoraTokens, LoraWeights, add_lora_delta


def base_linear(module: nn.Module) -> nn.Linear:
    """The plain nn.Linear under a module, unwrapping a peft LoRA layer to its base layer."""
    get_base_layer = getattr(module, "get_base_layer", None)
    layer = get_base_layer() if get_base_layer is not None else module
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"expected an nn.Linear projection, found {type(layer).__name__}")
    return layer


def linear(
    x: torch.Tensor, layer: nn.Linear, lora: LoraWeights | None = None, tokens: LoraTokens | None = None
) -> torch.Tensor:
    """y = x W^T + b with the HF layer's own parameter tensors (read at call time, never copied), plus the
    engine's LoRA delta on the tokens that use the adapter."""
    y = F.linear(x, layer.weight, layer.bias)
    if lora is not None and tokens is not None and tokens.enabled:
        add_lora_delta(y, x, lora, tokens.mask)
    return y
