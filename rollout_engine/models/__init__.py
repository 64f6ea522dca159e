"""Paged forward passes of the supported HF model families."""

from __future__ import annotations

from torch import nn

from rollout_engine.lora import LoraAdapter
from rollout_engine.models.attention import AttentionMetadata
from rollout_engine.models.decoder import PagedDecoder
from rollout_engine.models.inputs import StepInputs

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "AttentionMetadata",
    "PagedDecoder",
    "StepInputs",
    "build_paged_model",
    "unwrap_model",
]


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model under a peft PeftModel (or the model itself)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if get_base_model is not None else model


def build_paged_model(
    model: nn.Module, max_model_len: int, adapter: LoraAdapter | None = None
) -> PagedDecoder:
    """A paged forward over the HF model's own weights; ValueError for an unsupported architecture."""
    hf_model = unwrap_model(model)
    model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture {model_type!r} ({type(hf_model).__name__}); the rollout engine runs "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} causal LMs"
        )
    if getattr(hf_model.config, "use_sliding_window", False):
        raise ValueError(
            f"{model_type} with use_sliding_window=True is not supported: the paged attention is full-context"
        )
    return PagedDecoder(hf_model, max_model_len, adapter)
