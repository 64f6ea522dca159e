"""peft LoRA setup, export of the LoRA tensors by name, and other weights put in for a while.

Naming contract with the engine: a tensor's name is the HF module path of the base Linear layer (no peft
prefix) plus ``.lora_A`` (``[r, in_features]``) or ``.lora_B`` (``[out_features, r]``), for example
``model.layers.0.self_attn.q_proj.lora_A``. The layer's output is ``W x + scale * B (A x)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import peft
import torch
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn

from rl.settings import ConfigError, Settings, at_least, check_args, number, positive
from rollout_engine.sync_contract import active_adapter, lora_layers

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGET_SHORTHANDS = {
    "all": PROJECTIONS,
    "all-linear": PROJECTIONS,
    "attention": PROJECTIONS[:4],
    "mlp": PROJECTIONS[4:],
}


def _known_targets(value: str | Sequence[str]) -> bool:
    try:
        resolve_target_modules(value)
    except ConfigError:
        return False
    return True


@dataclass
class LoraConfig(Settings):
    """The adapter's settings (the lora.* keys); `add_lora` takes them as flat arguments."""

    RULES = (
        (
            "target_modules",
            _known_targets,
            f"use one of {sorted(TARGET_SHORTHANDS)} or comma-separated names from {list(PROJECTIONS)}",
        ),
        ("rank", at_least(1), "use an integer >= 1"),
        ("alpha", positive, "use a finite number > 0"),
        ("dropout", lambda v: number(v) and 0 <= v < 1, "use a number in [0, 1)"),
    )

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str = "all"  # a TARGET_SHORTHANDS name, or comma-separated PROJECTIONS
    use_rslora: bool = False


def resolve_target_modules(target_modules: str | Sequence[str]) -> list[str]:
    """Projection names from a shorthand (``all``, ``all-linear``, ``attention``, ``mlp``), comma-separated
    names (``q_proj,v_proj``) or a list."""
    if isinstance(target_modules, str) and "," not in target_modules:
        if target_modules not in TARGET_SHORTHANDS:
            raise ConfigError(
                f"Unknown LoRA target shorthand {target_modules!r}: use one of {sorted(TARGET_SHORTHANDS)} "
                f"or names drawn from {list(PROJECTIONS)} (a list, or comma-separated)."
            )
        return list(TARGET_SHORTHANDS[target_modules])
    if isinstance(target_modules, str):
        names = [name.strip() for name in target_modules.split(",")]
    else:
        names = list(target_modules)
    unknown = [name for name in names if name not in PROJECTIONS]
    if unknown or not names:
        raise ConfigError(
            f"LoRA target_modules {names!r} must be a non-empty list drawn from {list(PROJECTIONS)}"
            f"{f'; unknown: {unknown}' if unknown else ''}. Shorthands: {sorted(TARGET_SHORTHANDS)}."
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"LoRA target_modules {names!r} lists a projection twice: list each once.")
    return [name for name in PROJECTIONS if name in names]


def add_lora(
    model: nn.Module,
    rank: int = LoraConfig.rank,
    alpha: float = LoraConfig.alpha,
    dropout: float = LoraConfig.dropout,
    target_modules: str | Sequence[str] = LoraConfig.target_modules,
    use_rslora: bool = LoraConfig.use_rslora,
) -> PeftModel:
    """Wrap a causal LM in a peft LoRA adapter on the chosen projections; only the LoRA weights train. The
    values are refused as the lora.* keys are (`LoraConfig.RULES`); a bad target list is named by
    `resolve_target_modules`."""
    check_args(LoraConfig.RULES, rank=rank, alpha=alpha, dropout=dropout)
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=resolve_target_modules(target_modules),
        use_rslora=use_rslora,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def _lora_layers(peft_model: PeftModel) -> tuple[str, list[tuple[str, LoraLayer]]]:
    """The active adapter and (HF module path, LoRA layer) for each adapted Linear of the base model."""
    if not isinstance(peft_model, PeftModel):
        raise TypeError(
            f"Expected a peft PeftModel (see rl.sync.adapter.add_lora), got {type(peft_model).__name__}."
        )
    layers = lora_layers(peft_model)
    if not layers:
        raise ValueError("The peft model holds no LoRA layers: build it with rl.sync.adapter.add_lora.")
    return active_adapter(peft_model), layers


def lora_tensors(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """The active adapter's LoRA weights by engine name, detached views of the live parameters (no copy)."""
    adapter, layers = _lora_layers(peft_model)
    named: dict[str, torch.Tensor] = {}
    for path, layer in layers:
        named[f"{path}.lora_A"] = layer.lora_A[adapter].weight.detach()  # [r, in_features]
        named[f"{path}.lora_B"] = layer.lora_B[adapter].weight.detach()  # [out_features, r]
    return named


@contextlib.contextmanager
def adapter_weights(peft_model: PeftModel, weights: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """The active adapter holds `weights` (named as `lora_tensors` names them) for the block, then its own
    again; the parameters keep their identity and storage, so an optimizer or an engine holding them stays
    valid. The KL reference of kl_reference=start runs this way."""
    live = lora_tensors(peft_model)
    if live.keys() != weights.keys():
        missing, extra = sorted(live.keys() - weights.keys()), sorted(weights.keys() - live.keys())
        raise ValueError(f"the weights do not fit the adapter: missing {missing[:3]}, unknown {extra[:3]}")
    own = {name: tensor.clone() for name, tensor in live.items()}
    try:
        _copy_into(live, weights)
        yield
    finally:
        _copy_into(live, own)


@torch.no_grad()
def _copy_into(live: dict[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> None:
    for name, tensor in live.items():
        tensor.copy_(weights[name])
