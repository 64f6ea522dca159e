"""Every projection of the paged forward goes through `linears`, the one place where LoRA hooks in.

The base product reads the HF layer's own parameters at call time. On the CPU, fp32 weights are multiplied
through one MKL-packed copy each (kernels/cpu_gemm.py; about the weights' size in all, 540 MB for
SmolLM2-135M), re-packed at the next call after the parameter is updated in place or replaced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kernels.cpu_gemm import packed_linear
from rollout_engine.lora import LoraGroup, LoraTokens, add_lora_delta


def base_linear(module: nn.Module) -> nn.Linear:
    """The plain nn.Linear under a module, unwrapping a peft LoRA layer to its base layer."""
    get_base_layer = getattr(module, "get_base_layer", None)
    layer = get_base_layer() if get_base_layer is not None else module
    if not isinstance(layer, nn.Linear):
        raise ValueError(f"expected an nn.Linear projection, found {type(layer).__name__}")
    return layer


def linears(
    x: torch.Tensor,
    layers: Sequence[nn.Linear],
    groups: Sequence[LoraGroup] = (),
    tokens: LoraTokens | None = None,
) -> list[torch.Tensor]:
    """y = x W^T + b for each layer reading x, with the HF layer's own parameter tensors (read at call time;
    on the CPU through their packed copies), plus the engine's LoRA delta (one shrink per group) on the tokens
    that use the adapter."""
    ys = [packed_linear(x, layer.weight, layer.bias) for layer in layers]
    if tokens is not None and tokens.enabled:
        for group in groups:
            add_lora_delta(ys, x, group, tokens.mask)
    return ys


def linear(
    x: torch.Tensor, layer: nn.Linear, groups: Sequence[LoraGroup] = (), tokens: LoraTokens | None = None
) -> torch.Tensor:
    """`linears` of one layer."""
    return linears(x, (layer,), groups, tokens)[0]
