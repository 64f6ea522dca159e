"""Triton split-KV (flash-decoding) paged attention for one query token per sequence.

Phase 1: program (seq, kv_head, split) attends the query heads of one KV head (GQA group, padded to a
tensor-core tile) to one contiguous range of the sequence's cached tokens, writing a normalised partial
output and its log-sum-exp. Phase 2: program (seq, head) merges the partials of the splits the sequence
actually used."""

import functools

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, dot_precision

if HAS_TRITON:
    import triton
    import triton.language as tl

BLOCK_N = 64  # cached tokens per tile (several pages when block_size < 64)
MAX_SPLITS = 128


if HAS_TRITON:

    @triton.jit
    def _decode_split_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        context_lens_ptr,
        partial_out_ptr,
        partial_lse_ptr,
        scale,
        group,
        head_dim,
        split_len,
        stride_q_seq,
        stride_q_head,
        stride_cache_block,
        stride_cache_token,
        stride_cache_head,
        stride_table_seq,
        stride_po_seq,
        stride_po_head,
        stride_po_split,
        stride_pl_seq,
        stride_pl_head,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        context_len = tl.load(context_lens_ptr + seq)
        start = split * split_len
        if start >= context_len:
            return
        end = tl.minimum(start + split_len, context_len)

        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, BLOCK_D)
        heads = kv_head * group + g
        g_mask = g < group
        d_mask = d < head_dim
        q = tl.load(
            q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + d[None, :],
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        ).to(k_cache_ptr.dtype.element_ty)  # [BLOCK_G, BLOCK_D]

        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        table = block_tables_ptr + seq * stride_table_seq
        for tile_start in range(start, end, BLOCK_N):
            tok = tile_start + tl.arange(0, BLOCK_N)
            t_mask = tok < end
            block = tl.load(table + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
            rows = (
                block * stride_cache_block
                + (tok % BLOCK_SIZE) * stride_cache_token
                + kv_head * stride_cache_head
            )
            kv_offsets = rows[:, None] + d[None, :]
            kv_mask = t_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale  # [BLOCK_G, BLOCK_N]
            scores = tl.where(t_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            row_sum = row_sum * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m = m_new

        out_offsets = (
            seq * stride_po_seq + heads[:, None] * stride_po_head + split * stride_po_split + d[None, :]
        )
        tl.store(
            partial_out_ptr + out_offsets, acc / row_sum[:, None], mask=g_mask[:, None] & d_mask[None, :]
        )
        lse_offsets = seq * stride_pl_seq + heads * stride_pl_head + split
        tl.store(partial_lse_ptr + lse_offsets, m + tl.log(row_sum), mask=g_mask)

    @triton.jit
    def _decode_merge_kernel(
        partial_out_ptr,
        partial_lse_ptr,
        context_lens_ptr,
        out_ptr,
        head_dim,
        split_len,
        stride_po_seq,
        stride_po_head,
        stride_po_split,
        stride_pl_seq,
        stride_pl_head,
        stride_out_seq,
        stride_out_head,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        context_len = tl.load(context_lens_ptr + seq)
        num_used = (context_len + split_len - 1) // split_len
        s = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        s_mask = s < num_used
        d_mask = d < head_dim
        lse = tl.load(
            partial_lse_ptr + seq * stride_pl_seq + head * stride_pl_head + s, mask=s_mask, other=0.0
        )
        lse_max = tl.max(tl.where(s_mask, lse, float("-inf")), axis=0)
        weights = tl.where(s_mask, tl.exp(lse - lse_max), 0.0)  # [BLOCK_S]
        partial = tl.load(
            partial_out_ptr
            + seq * stride_po_seq
            + head * stride_po_head
            + s[:, None] * stride_po_split
            + d[None, :],
            mask=s_mask[:, None] & d_mask[None, :],
            other=0.0,
        )  # [BLOCK_S, BLOCK_D]
        total = tl.sum(weights, axis=0)
        # A sequence with no context used no split: its output is zeros.
        out = tl.sum(weights[:, None] * partial, axis=0) / tl.where(total > 0, total, 1.0)
        tl.store(
            out_ptr + seq * stride_out_seq + head * stride_out_head + d,
            out.to(out_ptr.dtype.element_ty),
            mask=d_mask,
        )


@functools.lru_cache(maxsize=8)
def _num_processors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def _choose_num_splits(num_programs: int, max_len: int, device: torch.device) -> int:
    """Enough splits to give every SM about two programs, each split keeping at least two tiles of work.
    Depends only on shapes, so a captured CUDA graph stays valid for any context lengths."""
    wanted = triton.cdiv(2 * _num_processors(device), num_programs)
    return max(1, min(wanted, triton.cdiv(max_len, 2 * BLOCK_N), MAX_SPLITS))


def paged_attention_decode_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Triton launcher of paged_attention_decode; `num_splits` overrides the split-KV heuristic."""
    check_triton_device(q)
    q = q if q.stride(2) == 1 else q.contiguous()
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = num_heads // num_kv_heads
    max_len = block_tables.shape[1] * block_size
    if num_splits is None:
        num_splits = _choose_num_splits(num_seqs * num_kv_heads, max_len, q.device)
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), BLOCK_N) * BLOCK_N
    num_splits = triton.cdiv(max_len, split_len)
    partial_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        partial_out,
        partial_lse,
        scale,
        group,
        head_dim,
        split_len,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        partial_out.stride(0),
        partial_out.stride(1),
        partial_out.stride(2),
        partial_lse.stride(0),
        partial_lse.stride(1),
        BLOCK_SIZE=block_size,
        BLOCK_N=BLOCK_N,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d,
        DOT_PRECISION=dot_precision(k_cache.dtype),
        num_warps=4,
        num_stages=3,  # cp.async prefetch of the next K/V tiles keeps enough bytes in flight
    )
    _decode_merge_kernel[(num_seqs, num_heads)](
        partial_out,
        partial_lse,
        context_lens,
        out,
        head_dim,
        split_len,
        partial_out.stride(0),
        partial_out.stride(1),
        partial_out.stride(2),
        partial_lse.stride(0),
        partial_lse.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_S=triton.next_power_of_2(num_splits),
        BLOCK_D=block_d,
    )
    return out
