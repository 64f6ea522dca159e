"""Paged forward of the Llama / Qwen2 / Qwen3 decoder, reading the HF model's own parameters.

Qwen2 differs from Llama only by q/k/v biases (handled by `linear`), Qwen3 by an RMSNorm over each
head of q and k before rotary. The modules are held, not their tensors, so a parameter replaced or
updated in the HF model is what the next step reads (on the CPU the fp32 and bf16 projections and LM head
multiply through one packed copy of each weight, re-packed when the parameter changes: see linear.py). A bf16
model runs in bf16 throughout, as transformers does, with a bf16 KV cache; the logits are fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedrl_kernels.activation import silu_and_mul
from pagedrl_kernels.rms_norm import rms_norm
from pagedrl_kernels.rotary_embedding import rotary_embedding
from rollout_engine.lora import LoraAdapter, LoraTokens
from rollout_engine.models.attention import AttentionMetadata, paged_attention
from rollout_engine.models.linear import base_linear, linear, linears


def _eps(norm: nn.Module) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


class PagedDecoderLayer:
    """One decoder layer: attention over the paged cache, then the gated MLP."""

    def __init__(
        self,
        hf_layer: nn.Module,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        adapter: LoraAdapter | None,
    ) -> None:
        attn, mlp = hf_layer.self_attn, hf_layer.mlp
        # LoRA groups of the projections that read one input: q/k/v share x, gate/up share x
        lora = adapter.groups_for if adapter is not None else lambda modules: []
        self.qkv_lora = lora((attn.q_proj, attn.k_proj, attn.v_proj))
        self.o_lora, self.down_lora = lora((attn.o_proj,)), lora((mlp.down_proj,))
        self.gate_up_lora = lora((mlp.gate_proj, mlp.up_proj))
        self.input_norm = hf_layer.input_layernorm
        self.post_attention_norm = hf_layer.post_attention_layernorm
        self.q_proj, self.k_proj = base_linear(attn.q_proj), base_linear(attn.k_proj)
        self.v_proj, self.o_proj = base_linear(attn.v_proj), base_linear(attn.o_proj)
        self.q_norm = getattr(attn, "q_norm", None)
        self.k_norm = getattr(attn, "k_norm", None)
        self.gate_proj, self.up_proj = base_linear(mlp.gate_proj), base_linear(mlp.up_proj)
        self.down_proj = base_linear(mlp.down_proj)
        # the products of one step, in order, each a stack of the projections that read one input
        self.qkv, self.gate_up = (self.q_proj, self.k_proj, self.v_proj), (self.gate_proj, self.up_proj)
        self.products = (self.qkv, (self.o_proj,), self.gate_up, (self.down_proj,))
        self.scale = float(getattr(attn, "scaling", head_dim**-0.5))
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim

    def _head_norm(self, x: torch.Tensor, norm: nn.Module | None) -> torch.Tensor:
        if norm is None:
            return x
        return rms_norm(x.reshape(-1, self.head_dim), norm.weight, _eps(norm)).view(x.shape)

    def __call__(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        lora: LoraTokens,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens = hidden.shape[0]
        if residual is None:
            x, residual = rms_norm(hidden, self.input_norm.weight, _eps(self.input_norm)), hidden
        else:
            x, residual = rms_norm(hidden, self.input_norm.weight, _eps(self.input_norm), residual)
        q, k, v = linears(x, self.qkv, self.qkv_lora, lora)
        q = self._head_norm(q.view(num_tokens, self.num_heads, self.head_dim), self.q_norm)
        k = self._head_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim), self.k_norm)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = rotary_embedding(positions, q, k, cos_sin_cache)
        attn = paged_attention(
            q, k, v, k_cache, v_cache, meta, self.scale
        )  # [num_tokens, num_heads, head_dim]
        hidden = linear(attn.reshape(num_tokens, -1), self.o_proj, self.o_lora, lora)
        x, residual = rms_norm(
            hidden, self.post_attention_norm.weight, _eps(self.post_attention_norm), residual
        )
        gate, up = linears(x, self.gate_up, self.gate_up_lora, lora)
        hidden = linear(silu_and_mul(gate, up), self.down_proj, self.down_lora, lora)
        return hidden, residual


class PagedDecoder:
    """The whole causal LM: embeddings, decoder layers, final norm, and the LM head on selected rows."""

    def __init__(self, hf_model: nn.Module, max_model_len: int, adapter: LoraAdapter | None = None) -> None:
        config = hf_model.config
        body = hf_model.model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = body.layers[0].self_attn.q_proj.weight.shape[0] // self.num_heads
        self.embed_tokens = body.embed_tokens
        self.layers = [
            PagedDecoderLayer(layer, self.num_heads, self.num_kv_heads, self.head_dim, adapter)
            for layer in body.layers
        ]
        self.norm = body.norm
        self.adapter = adapter
        self.lm_head = base_linear(hf_model.get_output_embeddings())
        self.cos_sin_cache = _cos_sin_cache(body.rotary_emb, max_model_len, self.embed_tokens.weight.device)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @torch.inference_mode()
    def __call__(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,  # [num_logits]
        lora: LoraTokens,
    ) -> torch.Tensor:
        """Logits [num_logits, vocab] (fp32) of the hidden states at logits_indices."""
        hidden = torch.nn.functional.embedding(input_ids, self.embed_tokens.weight)
        residual = None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(
                hidden, residual, positions, self.cos_sin_cache, k_cache, v_cache, meta, lora
            )
        hidden = hidden.index_select(0, logits_indices)
        residual = residual.index_select(0, logits_indices)
        hidden, _ = rms_norm(hidden, self.norm.weight, _eps(self.norm), residual)
        return linear(hidden, self.lm_head).float()


def _cos_sin_cache(rotary_emb: nn.Module, max_positions: int, device: torch.device) -> torch.Tensor:
    """cat(cos, sin) [max_positions, head_dim] (fp32) from the HF rotary module itself."""
    positions = torch.arange(max_positions, device=device)[None]
    with torch.no_grad():
        cos, sin = rotary_emb(torch.zeros(1, dtype=torch.float32, device=device), positions)
    half = cos.shape[-1] // 2
    return torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1).contiguous()
