"""LoRA in the engine: engine-owned A/B buffers for every adapted projection, updated in place.

A projection's output is `x W^T + b + scale * (x A^T) B^T`, where W is the shared base weight and A [r, in],
B [out, r] live in buffers the engine owns (copied from the peft model once, then overwritten by
`update_lora`). Per request, the adapter is on ("policy") or off (None, the base model); one batch may mix
both, through a per-token 0/1 mask. On the CPU, a step whose tokens all use the adapter multiplies by the
merged weights W + scale B A instead (models/linear.py puts each projection's StackedLora update into the
pack of its stack; for bf16 weights the sum is taken in fp32 and rounded once), packed once per adopted
version in place of the base weights' packs; a mixed or base-only step, and every step with fewer than 4
tokens, runs the base product plus the delta.

Projections that read the same input (q/k/v, gate/up) and share a rank and scale form a LoraGroup: their A
buffers are rows of one stacked tensor, so a single shrink serves them all. On the CPU the kernels read
transposed copies of the buffers (pagedrl_kernels.lora.StackedLora), re-derived whenever a version is adopted.

Names follow the weight-sync contract (sync_contract.py): the HF module path of the base Linear plus `.lora_A`
/ `.lora_B`, e.g. `model.layers.0.self_attn.q_proj.lora_A`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pagedrl_kernels.lora import StackedLora, lora_shrink_expand
from rollout_engine.sync_contract import active_adapter, lora_layers


@dataclass(slots=True)
class LoraTokens:
    """Which tokens of a step use the adapter: all of them (mask None), none (enabled False), or those whose
    entry of mask [num_tokens, 1] is 1."""

    enabled: bool
    mask: torch.Tensor | None


@dataclass(slots=True)
class LoraWeights:
    """One adapted projection: buffers A [r, in] (rows of its LoraGroup's stacked A), B [out, r] and the
    output scale."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float


@dataclass(slots=True)
class LoraGroup:
    """Adapted projections that read one input, with one rank and scale: their weights, stacked, and their
    places among the projections that `LoraAdapter.groups_for` was given."""

    positions: tuple[int, ...]
    weights: StackedLora


class LoraAdapter:
    """The engine's copy of the policy adapter: one LoraWeights per adapted projection path."""

    def __init__(self, model: nn.Module) -> None:
        adapter = active_adapter(model)
        self.weights: dict[str, LoraWeights] = {}
        self._by_module: dict[int, LoraWeights] = {}
        for path, layer in lora_layers(model):
            if adapter not in layer.lora_A:
                continue
            self.weights[path] = self._by_module[id(layer)] = LoraWeights(
                a=layer.lora_A[adapter].weight.detach().clone().contiguous(),
                b=layer.lora_B[adapter].weight.detach().clone().contiguous(),
                scale=float(layer.scaling[adapter]),
            )
        self._groups: dict[tuple[int, ...], list[LoraGroup]] = {}
        self._version = 0

    @property
    def version(self) -> int:
        """The version the buffers hold. Setting it adopts the weights now in the buffers: the CPU kernels'
        transposed copies are re-derived from them."""
        return self._version

    @version.setter
    def version(self, version: int) -> None:
        for groups in self._groups.values():
            for group in groups:
                group.weights.refresh()
        self._version = version

    def groups_for(self, modules: Sequence[nn.Module]) -> list[LoraGroup]:
        """The groups serving projection modules of the HF model (peft LoRA layers or plain Linears) that all
        read one input: the adapted ones, grouped by rank and scale. On the first call their A buffers move
        into the groups' stacked tensors; each sync name then resolves to a view of its rows."""
        key = tuple(id(module) for module in modules)
        if key not in self._groups:
            if any(module_id in other for other in self._groups for module_id in key):
                raise ValueError("each projection belongs to one set of projections sharing an input")
            self._groups[key] = self._stack(key)
        return self._groups[key]

    def _stack(self, key: tuple[int, ...]) -> list[LoraGroup]:
        by_rank_and_scale: dict[tuple[int, float], list[int]] = {}
        for position, module_id in enumerate(key):
            weights = self._by_module.get(module_id)
            if weights is not None:
                by_rank_and_scale.setdefault((weights.a.shape[0], weights.scale), []).append(position)
        groups = []
        for (rank, scale), positions in by_rank_and_scale.items():
            members = [self._by_module[key[p]] for p in positions]
            a = torch.cat([w.a for w in members])  # [num * r, in]
            for weights, rows in zip(members, a.split(rank), strict=True):
                weights.a = rows
            groups.append(LoraGroup(tuple(positions), StackedLora(a, tuple(w.b for w in members), scale)))
        return groups

    def buffers(self) -> dict[str, torch.Tensor]:
        """The engine-owned tensors by sync name (views, not copies)."""
        named: dict[str, torch.Tensor] = {}
        for path, w in self.weights.items():
            named[f"{path}.lora_A"], named[f"{path}.lora_B"] = w.a, w.b
        return named


def add_lora_delta(
    ys: Sequence[torch.Tensor], x: torch.Tensor, group: LoraGroup, token_mask: torch.Tensor | None
) -> None:
    """ys[p] += scale * (x A^T) B^T in place for each projection p of the group, on the tokens whose request
    uses the adapter (token_mask [num_tokens, 1], None for all); ys holds the outputs of every projection
    given to groups_for. One shrink serves the group; the [num_tokens, out] delta is never materialised where
    y is in the adapter's dtype. As peft does, x is cast to the adapter's dtype (fp32 for a bf16 model) and
    the delta is added to y with one rounding."""
    x = x.to(group.weights.a.dtype)
    lora_shrink_expand(x, group.weights, [ys[p] for p in group.positions], token_mask)
