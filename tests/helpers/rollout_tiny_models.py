"""Tiny random Llama / Qwen2 / Qwen3 models, with and without a random LoRA adapter, HF references and
engine builders for the engine tests."""

import torch

from rl.sync.adapter import add_lora, lora_tensors
from rollout_engine import LLMEngine
from tests.helpers.tiny_models import tiny_config, tiny_model

VOCAB = 256
_SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    # Peaked logits keep greedy argmax far from ties, so fp32 summation order cannot flip a token.
    initializer_range=0.2,
    attn_implementation="eager",
)
# What the engine's packed copies of the tiny Llama's fp32 weights hold, worked by hand: per layer q 64x64, k
# and v 32x64, o 64x64, gate and up 128x64, down 64x128 (36864 floats), 2 layers, and the 256x64 LM head:
# 90112 floats of 4 bytes
LLAMA_PACKED_BYTES = 360448
FAMILY_FIELDS = {"llama": {}, "qwen2": {}, "qwen3": {"head_dim": 32}}


def make_tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A seeded random model whose biases and norm weights are non-trivial, so each one matters."""
    model = tiny_model(tiny_config(family, **_SHAPE, **FAMILY_FIELDS[family]), seed).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.2)
            elif param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.2)
    return model


def randomize_lora(model, seed: int, std: float = 0.3) -> None:
    """peft starts B at zero (a no-op adapter); random A and B make every adapted projection matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in lora_tensors(model).values():
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)


def peft_model(family: str, targets, seed: int = 0):
    model = add_lora(make_tiny_model(family, seed=seed), rank=4, alpha=8.0, target_modules=targets)
    randomize_lora(model, seed=seed + 100)
    return model.eval()


def make_engine(model, tokenizer=None, **overrides) -> LLMEngine:
    kwargs = dict(
        block_size=4, memory_budget_bytes=2**26, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=128
    )
    kwargs.update(overrides)
    return LLMEngine(model, tokenizer, **kwargs)


def random_prompts(lengths, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos_token_id=None) -> list[int]:
    """transformers' own greedy continuation of one unpadded prompt."""
    out = model.generate(
        torch.tensor([prompt], device=model.device),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each completion token under one HF forward over prompt + completion."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / scale, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
