"""Attention over the paged KV cache: decode (one query token per sequence) and prefill/extend (a chunk of
queries per sequence attending to its cached prefix and causally within the chunk).

paged_attention_decode and paged_attention_prefill are the entry points, and the only places that choose an
implementation (under the kernel backend, pagedrl_kernels.backend): the Triton kernel for CUDA tensors; for
decode over an fp32 or bf16 CPU cache the C kernel (paged_decode_cpu.py) where it could be built; else the
PyTorch reference."""

from itertools import accumulate
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pagedrl_kernels.backend import use_triton
from pagedrl_kernels.paged_decode import paged_attention_decode_triton
from pagedrl_kernels.paged_decode_cpu import cpu_decode_supported, paged_attention_decode_cpu
from pagedrl_kernels.paged_prefill import paged_attention_prefill_triton

__all__ = [
    "paged_attention_decode",
    "paged_attention_decode_cpu",
    "paged_attention_decode_torch",
    "paged_attention_decode_triton",
    "paged_attention_prefill",
    "paged_attention_prefill_torch",
    "paged_attention_prefill_triton",
]


def _slots(
    cache: torch.Tensor, block_tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Flat cache slot of each (table row, position) pair, broadcast together."""
    block_size = cache.shape[1]
    return block_tables.long()[rows, positions // block_size] * block_size + positions % block_size


def _gather_packed(
    cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
) -> torch.Tensor:
    """Every row's context, rows one after another without padding: [sum(context_lens), kv, head_dim]."""
    lens = context_lens.to(cache.device).long()
    rows = torch.repeat_interleave(torch.arange(lens.shape[0], device=cache.device), lens)
    row_starts = lens.cumsum(0) - lens
    positions = torch.arange(rows.shape[0], device=cache.device) - row_starts[rows]
    return cache.flatten(0, 1).index_select(0, _slots(cache, block_tables, rows, positions))


class _DecodeGather(NamedTuple):
    """Where a batch of decode sequences reads its K/V, padded to the batch's longest context."""

    rows: torch.Tensor  # [num_seqs * num_kv_heads * max_len] int64 rows of cache.view(-1, head_dim)
    bias: torch.Tensor  # [num_seqs, 1, 1, max_len] fp32: 0 inside the context, -inf on padding
    empty: torch.Tensor | None  # [num_seqs] bool, True for a sequence with no context; None when none is
    max_len: int


def _decode_gather(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, num_kv_heads: int
) -> _DecodeGather:
    """The cache rows of positions [0, context_lens) of each sequence, head-major, for a cache of
    `block_size`-token blocks. Padding positions read the sequence's last valid position instead (its first
    when it has none), so padding never brings in the NaN or garbage the cache may hold there (nor follows
    table entries past the context); `bias` masks them out of the softmax."""
    device = block_tables.device
    lens = context_lens.to(device).long()
    max_len = int(lens.max()) if lens.numel() else 0
    offsets = torch.arange(max_len, device=device)
    positions = torch.minimum(offsets, (lens - 1).clamp(min=0)[:, None])  # [seqs, max_len]
    slots = block_tables.long().gather(1, positions // block_size) * block_size + positions % block_size
    heads = torch.arange(num_kv_heads, device=device)[:, None]
    # One cache row per (slot, kv head) so the copy lands directly in the head-major layout SDPA wants.
    rows = (slots[:, None, :] * num_kv_heads + heads).flatten()  # [seqs * kv * max_len]
    padding = (offsets >= lens[:, None])[:, None, None, :]
    bias = torch.zeros(padding.shape, device=device).masked_fill_(padding, float("-inf"))
    empty = lens == 0
    return _DecodeGather(rows, bias, empty if bool(empty.any()) else None, max_len)


def _gather_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, gather: _DecodeGather
) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V copied out of the cache by `gather`, each [num_seqs, num_kv_heads, max_len, head_dim] fp32."""
    num_kv_heads, head_dim = k_cache.shape[2:]
    shape = (gather.bias.shape[0], num_kv_heads, gather.max_len, head_dim)
    k = k_cache.view(-1, head_dim).index_select(0, gather.rows).view(shape).float()
    v = v_cache.view(-1, head_dim).index_select(0, gather.rows).view(shape).float()
    return k, v


def paged_attention_decode_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Reference: gathers every sequence's K/V at once, padded to the longest context, and runs one masked
    SDPA in fp32, the query heads of a KV head acting as that head's query rows."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    gather = _decode_gather(block_tables, context_lens, k_cache.shape[1], num_kv_heads)
    if gather.max_len == 0:
        return torch.zeros_like(q)
    k, v = _gather_kv(k_cache, v_cache, gather)
    q_grouped = q.float().view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=gather.bias, scale=scale)
    if gather.empty is not None:  # a sequence with no context attends to nothing
        out = out.masked_fill(gather.empty[:, None, None, None], 0.0)
    return out.reshape(num_seqs, num_heads, head_dim).to(q.dtype)


def paged_attention_prefill_torch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Reference: gathers every sequence's prefix in one copy, then per sequence runs one causal SDPA in
    fp32, with the query heads of a KV head stacked along the query axis so K/V are never repeated."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    k_all = _gather_packed(k_cache, block_tables, context_lens).float()  # [sum(context_lens), kv, dim]
    v_all = _gather_packed(v_cache, block_tables, context_lens).float()
    starts, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for seq, (context_len, context_end) in enumerate(zip(lens, accumulate(lens), strict=True)):
        start, end = starts[seq], starts[seq + 1]
        q_len = end - start
        if q_len == 0:
            continue
        k = k_all[context_end - context_len : context_end].transpose(0, 1)  # [kv, len, dim]
        v = v_all[context_end - context_len : context_end].transpose(0, 1)
        q_seq = q[start:end].float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        q_seq = q_seq.reshape(num_kv_heads, group * q_len, head_dim)  # [kv, group * q_len, dim]
        query_pos = torch.arange(context_len - q_len, context_len, device=q.device)
        allowed = torch.arange(context_len, device=q.device)[None, :] <= query_pos[:, None]  # [q_len, len]
        attn = F.scaled_dot_product_attention(q_seq, k, v, attn_mask=allowed.repeat(group, 1), scale=scale)
        attn = attn.view(num_kv_heads, group, q_len, head_dim).permute(2, 0, 1, 3)
        out[start:end] = attn.reshape(q_len, num_heads, head_dim).to(q.dtype)
    return out


def _check_common(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor
) -> None:
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"paged attention needs q [tokens, num_heads, head_dim] and k_cache, v_cache "
            f"[num_blocks, block_size, num_kv_heads, head_dim]; got q {tuple(q.shape)}, "
            f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    num_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"q has {num_heads} heads of dim {head_dim} but the cache has {num_kv_heads} KV heads of dim "
            f"{k_cache.shape[3]}; head dims must match and num_heads must be a multiple of num_kv_heads"
        )
    if block_tables.dim() != 2 or block_tables.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"block_tables must be an integer [num_seqs, max_num_blocks] tensor; got {block_tables.dtype} "
            f"{tuple(block_tables.shape)}"
        )


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of one query token per sequence, q `[num_seqs, num_heads, head_dim]`, over the first
    context_lens[s] cached tokens of its sequence, read through `block_tables` `[num_seqs, max_num_blocks]`.
    A sequence with context length 0 gets zeros."""
    _check_common(q, k_cache, v_cache, block_tables)
    if block_tables.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise ValueError(
            f"decode with {q.shape[0]} query tokens needs block_tables [{q.shape[0]}, max_num_blocks] and "
            f"context_lens [{q.shape[0]}]; got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}"
        )
    if use_triton(q):
        return paged_attention_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale)
    if cpu_decode_supported(k_cache, q.shape[1]):
        return paged_attention_decode_cpu(q, k_cache, v_cache, block_tables, context_lens, scale)
    return paged_attention_decode_torch(q, k_cache, v_cache, block_tables, context_lens, scale)


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Attention of packed query chunks q `[num_tokens, num_heads, head_dim]` (sequence s owns rows
    cu_seqlens_q[s]:cu_seqlens_q[s+1]); query i of a chunk of q_len sits at position
    context_lens[s] - q_len + i and attends to every cached position up to its own."""
    _check_common(q, k_cache, v_cache, block_tables)
    num_seqs = context_lens.shape[0]
    if cu_seqlens_q.shape != (num_seqs + 1,) or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"prefill with {num_seqs} sequences needs cu_seqlens_q [{num_seqs + 1}] and block_tables "
            f"[{num_seqs}, max_num_blocks]; got {tuple(cu_seqlens_q.shape)} and {tuple(block_tables.shape)}"
        )
    if use_triton(q):
        return paged_attention_prefill_triton(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_query_len
        )
    return paged_attention_prefill_torch(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_query_len
    )
