"""The one factory of the suite's tiny random models: a Llama, Qwen2 or Qwen3 config of the shape a test
asks for, and the seeded model built from a config."""

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def tiny_config(
    family: str,
    *,
    vocab_size: int,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    **fields,
) -> PretrainedConfig:
    """The `family` config of this shape; `fields` sets any other key (max_position_embeddings, head_dim,
    initializer_range ...), and a key left out keeps transformers' default."""
    return FAMILIES[family](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        **fields,
    )


def tiny_model(config: PretrainedConfig, seed: int | None = 0) -> PreTrainedModel:
    """A random model of `config`, drawn after torch.manual_seed(seed) (seed=None: from the torch RNG as it
    stands); the same config and seed give the same weights."""
    if seed is not None:
        torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def tiny_llama(vocab_size: int, seed: int = 0, num_hidden_layers: int = 2) -> PreTrainedModel:
    """The trainer's Llama (hidden 32, 4 heads over 2 KV heads, 64 positions), in train mode."""
    config = tiny_config(
        "llama", vocab_size=vocab_size, num_hidden_layers=num_hidden_layers, max_position_embeddings=64
    )
    return tiny_model(config, seed)
