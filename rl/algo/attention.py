"""The trainer model's attention on the CPU: transformers' SDPA attention without copies of the KV heads.

With grouped-query attention and a mask (padding, or the packed rows of `rl.algo.logprobs`), transformers
copies every KV head once per query head before it calls SDPA, and autograd keeps those copies for the
backward in every layer: for SmolLM2 (9 query heads over 3 KV heads) about 300 MiB for a GRPO micro-batch of
8 samples. SDPA broadcasts the KV heads itself (`enable_gqa`) with the same result, faster. The CUDA path
stays transformers' own: there a mask with `enable_gqa` falls back to SDPA's math kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA_GQA = "pagedrl_sdpa_gqa"


def sdpa_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, num_heads, q_len, head_dim]
    key: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    value: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; returns [batch, q_len, num_heads, head_dim]."""
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # transformers passes no mask only where SDPA's is_causal is exact: one query, or as many queries as keys
    is_causal = query.shape[2] > 1 and attention_mask is None and is_causal
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)
