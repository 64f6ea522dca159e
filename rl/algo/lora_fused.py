"""The trainer's forward through peft LoRA Linears, fused: one autograd node per adapted projection.

peft computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`, which in training builds three temporaries
the size of the output ([num_tokens, out]: lora_B's product, its scaled copy and the sum) and their
backward ops, for a delta of rank r. `LoraLinear` adds `scale * (x A^T) B^T` into the base product in place
(addmm) and applies the scale to the rank-r tensors only, forward and backward. Same maths, fewer
full-size ops: the trainer's step was spending a sixth of its time in them.

`fused_lora(model)` routes the forward of every plain LoRA Linear (one active adapter, no dropout, no
variant such as DoRA, not merged, adapters enabled, no lora bias) through `LoraLinear` for the duration of
the block; every other layer keeps peft's own forward. Gradients reach peft's own lora_A/lora_B
parameters, so the optimizer and checkpoints see no difference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from peft.tuners.lora.layer import Linear as PeftLoraLinear
from torch import nn


class LoraLinear(torch.autograd.Function):
    """y = x W^T + b + scale * (x A^T) B^T, with x [..., in], W [out, in], A [r, in], B [out, r]."""

    @staticmethod
    def forward(ctx: Any, x, weight, bias, a, b, scale: float) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        h = rows @ a.t()  # [num_tokens, r]
        y = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        y.addmm_(h, b.t(), alpha=scale)
        ctx.save_for_backward(rows, weight, a, b, h)
        ctx.scale, ctx.has_bias, ctx.x_shape = scale, bias is not None, x.shape
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        rows, weight, a, b, h = ctx.saved_tensors
        needs = ctx.needs_input_grad
        dy = dy.reshape(-1, dy.shape[-1])
        dh = (dy @ b).mul_(ctx.scale)  # [num_tokens, r]: the scale stays on rank-r tensors
        dx = dw = dbias = da = db = None
        if needs[0]:
            dx = (dy @ weight).addmm_(dh, a).view(ctx.x_shape)
        if needs[1]:
            dw = dy.t() @ rows
        if needs[2] and ctx.has_bias:
            dbias = dy.sum(0)
        if needs[3]:
            da = dh.t() @ rows
        if needs[4]:
            db = (dy.t() @ h).mul_(ctx.scale)
        return dx, dw, dbias, da, db, None


def _plain_adapter(layer: nn.Module) -> str | None:
    """The one active adapter of a vanilla, unmerged, enabled LoRA Linear without dropout; else None."""
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if layer.disable_adapters or layer.merged or len(active) != 1:
        return None
    (name,) = active
    vanilla = name not in getattr(layer, "lora_variant", {}) and not getattr(layer, "lora_bias", {}).get(name)
    plain_linear = isinstance(layer.get_base_layer(), nn.Linear) and isinstance(layer.lora_A[name], nn.Linear)
    no_dropout = isinstance(layer.lora_dropout[name], nn.Identity)
    return name if vanilla and plain_linear and no_dropout else None


def _fused_forward(layer: nn.Module, adapter: str):
    base, a, b = layer.get_base_layer(), layer.lora_A[adapter], layer.lora_B[adapter]
    scale = float(layer.scaling[adapter])

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if args or kwargs or x.dtype != a.weight.dtype:
            return type(layer).forward(layer, x, *args, **kwargs)
        return LoraLinear.apply(x, base.weight, base.bias, a.weight, b.weight, scale)

    return forward


@contextlib.contextmanager
def fused_lora(model: nn.Module) -> Iterator[None]:
    """Within the block, plain LoRA Linears of `model` run their forward through `LoraLinear`."""
    patched = []
    for layer in model.modules():
        adapter = _plain_adapter(layer) if type(layer) is PeftLoraLinear else None
        if adapter is not None:
            layer.forward = _fused_forward(layer, adapter)
            patched.append(layer)
    try:
        yield
    finally:
        for layer in patched:
            del layer.forward
