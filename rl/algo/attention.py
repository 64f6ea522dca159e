"""The trainer model's attention on the CPU: transformers' SDPA attention without copies of the KV heads.

With grouped-query attention and a mask (padding, or the packed rows of `rl.algo.logprobs`), transformers
copies every KV head once per query head before it calls SDPA, and autograd keeps those copies for the
backward in every layer: for SmolLM2 (9 query heads over 3 KV heads) about 300 MiB for a GRPO micro-batch of
8 samples. SDPA broadcasts the KV heads itself (`enable_gqa`) with the same result, faster. The CUDA path
stays transformers' own: there a mask with `enable_gqa` falls back to SDPA's math kernel.

Rows packed after a shared prefix (`rl.algo.logprobs`) come with their layout in the PACKED_ROWS keyword
argument, which transformers hands every attention function. Their mask lets each row see the prefix and
itself, most of the packed keys hidden; this attention runs one SDPA per row over exactly its keys instead,
about half the work of the whole masked square for a GRPO group. Other attention implementations ignore the
argument and apply the mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SDPA_GQA = "pagedrl_sdpa_gqa"
# (prefix length, the lengths of the rows packed after it): keyword argument of the model's forward
PACKED_ROWS = "pagedrl_packed_rows"


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
    packed = kwargs.get(PACKED_ROWS)
    if packed is not None:
        out = packed_rows_attention(query, key, value, *packed, dropout=dropout, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
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


def packed_rows_attention(
    query: torch.Tensor,  # [1, num_heads, sum(lengths), head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, prefix + sum(lengths), head_dim]
    value: torch.Tensor,
    prefix: int,
    lengths: list[int],
    dropout: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Each packed row's queries over the prefix's keys and, causally, its own: [1, heads, N, head_dim]."""
    # one slice of the prefix and one split of the rows, so that the backward adds their gradients up
    # instead of zero-filling the whole key tensor for every row
    prefix_k, prefix_v = key[:, :, :prefix], value[:, :, :prefix]
    rows = zip(
        lengths,
        query.split(lengths, dim=2),
        key[:, :, prefix:].split(lengths, dim=2),
        value[:, :, prefix:].split(lengths, dim=2),
        strict=True,
    )
    outs = []
    for length, q, k, v in rows:
        if length == 0:
            continue
        mask = torch.ones(length, prefix + length, dtype=torch.bool, device=query.device).tril(prefix)
        outs.append(
            F.scaled_dot_product_attention(
                q,
                torch.cat([prefix_k, k], dim=2),
                torch.cat([prefix_v, v], dim=2),
                attn_mask=mask,
                dropout_p=dropout,
                scale=scale,
                enable_gqa=key.shape[1] != query.shape[1],
            )
        )
    return torch.cat(outs, dim=2)


AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
AttentionMaskInterface.register(SDPA_GQA, sdpa_mask)
