"""Every projection of the paged forward goes through `linears`, the one place where LoRA hooks in.

The base product reads the HF layer's own parameters at call time. On the CPU, fp32 weights are multiplied
through one MKL-packed copy each (kernels/cpu_gemm.py; about the weights' size in all, 540 MB for
SmolLM2-135M), re-packed at the next call after the parameter is updated in place or replaced. A step whose
tokens all use the LoRA adapter multiplies the adapted projections through packs of their merged weights
instead (rollout_engine/lora.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from kernels.cpu_gemm import packed_linear
from rollout_engine.lora import LoraGroup, LoraTokens, add_lora_delta, merged_products


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
    on the CPU through their packed copies), plus the engine's LoRA delta on the tokens that use the adapter:
    merged into the packed weights when every token does, else one shrink per group."""
    ys: list[torch.Tensor | None] = [None] * len(layers)
    with_delta = []
    if tokens is not None and tokens.enabled:
        for group in groups:
            merged = merged_products(x, layers, group) if tokens.mask is None else None
            if merged is None:
                with_delta.append(group)
                continue
            for position, y in zip(group.positions, merged, strict=True):
                ys[position] = y
    ys = [
        packed_linear(x, layer.weight, layer.bias) if y is None else y
        for y, layer in zip(ys, layers, strict=True)
    ]
    for group in with_delta:
        add_lora_delta(ys, x, group, tokens.mask)
    return ys


def linear(
    x: torch.Tensor, layer: nn.Linear, groups: Sequence[LoraGroup] = (), tokens: LoraTokens | None = None
) -> torch.Tensor:
    """`linears` of one layer."""
    return linears(x, (layer,), groups, tokens)[0]
