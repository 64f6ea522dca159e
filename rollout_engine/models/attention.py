"""Paged attention of one layer over a packed batch: prefill chunks first, then single-token decodes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedrl_kernels.paged_attention import paged_attention_decode, paged_attention_prefill
from pagedrl_kernels.reshape_and_cache import reshape_and_cache


@dataclass(slots=True)
class AttentionMetadata:
    """Where each token's K/V goes and what each query attends to, for one engine step.

    Tokens [0, num_prefill_tokens) belong to chunks of more than one query (prefill / extend); the
    remaining tokens are one query per sequence (decode), sorted by context length. Which kernel attends is
    chosen in pagedrl_kernels.paged_attention.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64
    num_prefill_tokens: int
    prefill_block_tables: torch.Tensor  # [num_prefill_seqs, max_num_blocks] int32
    prefill_cu_seqlens_q: torch.Tensor  # [num_prefill_seqs + 1] int32
    prefill_context_lens: torch.Tensor  # [num_prefill_seqs] int32
    prefill_max_query_len: int
    decode_block_tables: torch.Tensor  # [num_decode_seqs, max_num_blocks] int32
    decode_context_lens: torch.Tensor  # [num_decode_seqs] int32


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write k, v into the cache, then attend. q [num_tokens, num_heads, head_dim] -> same shape."""
    reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
    split = meta.num_prefill_tokens
    if split == q.shape[0]:
        return _prefill(q, k_cache, v_cache, meta, scale)
    if split == 0:
        return _decode(q, k_cache, v_cache, meta, scale)
    return torch.cat(
        (
            _prefill(q[:split], k_cache, v_cache, meta, scale),
            _decode(q[split:], k_cache, v_cache, meta, scale),
        )
    )


def _prefill(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    return paged_attention_prefill(
        q,
        k_cache,
        v_cache,
        meta.prefill_block_tables,
        meta.prefill_cu_seqlens_q,
        meta.prefill_context_lens,
        scale,
        meta.prefill_max_query_len,
    )


def _decode(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    return paged_attention_decode(
        q, k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale
    )
