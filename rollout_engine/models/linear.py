"""Every projection of the paged forward goes through `linears`, the one place where LoRA hooks in.

The base product reads the HF layer's own parameters at call time. On the CPU, the projections that read
one input (q/k/v, gate/up, and each of o, down and the LM head alone) multiply as one product, through one
packed copy of their stacked weights (pagedrl_kernels/cpu_gemm.py: MKL-packed for fp32, a bf16 copy for bf16;
about the weights' size in all, 540 MB for SmolLM2-135M in fp32), re-packed at the next call after a parameter
is updated in place or replaced. One product of
the stack runs 3-9% faster than one per projection at 64-128 rows (bench/RESULTS.md). A step whose tokens all
use the LoRA adapter multiplies through a pack of the merged weights instead (rollout_engine/lora.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pagedrl_kernels.cpu_gemm import PackPart, packed_stacked_linear
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
    """y = x W^T + b for each layer reading x, with the HF layer's own parameter tensors (read at call time),
    plus the engine's LoRA delta on the tokens that use the adapter. On the CPU the layers multiply as one
    product through a pack of their stacked weights, and each y is a view of its columns; when every token
    uses the adapter, the adapted weights in that pack are the merged W + scale B A. Otherwise (a mixed
    batch, fewer than MIN_PACKED_ROWS tokens, CUDA) one shrink per group adds the delta."""
    enabled = tokens is not None and tokens.enabled
    merged = enabled and tokens.mask is None and all(group.weights.updates for group in groups)
    updates = [None] * len(layers)
    if merged:
        for group in groups:
            for position, update in zip(group.positions, group.weights.updates, strict=True):
                updates[position] = update
    parts = [
        PackPart(layer.weight, layer.bias, update) for layer, update in zip(layers, updates, strict=True)
    ]
    stacked = packed_stacked_linear(x, parts)
    if stacked is None:
        ys = [F.linear(x, layer.weight, layer.bias) for layer in layers]
        merged = False
    else:
        ys = list(stacked.split([layer.weight.shape[0] for layer in layers], dim=-1))
    if enabled and not merged:
        for group in groups:
            add_lora_delta(ys, x, group, tokens.mask)
    return ys


def linear(
    x: torch.Tensor, layer: nn.Linear, groups: Sequence[LoraGroup] = (), tokens: LoraTokens | None = None
) -> torch.Tensor:
    """`linears` of one layer."""
    return linears(x, (layer,), groups, tokens)[0]
