"""Triton paged attention for prefill and extend: packed query chunks attend to their sequence's cached
prefix and causally within the chunk.

Program (seq, kv_head, q_block) stacks BLOCK_Q query tokens times the query heads of one KV head (GQA group)
into one tile of rows, so each K/V tile read through the block table serves the whole group."""

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, dot_precision

if HAS_TRITON:
    import triton
    import triton.language as tl


def prefill_tiles(dtype: torch.dtype, group: int) -> tuple[int, int, int]:
    """(BLOCK_Q, BLOCK_G, BLOCK_N): a program's query rows are BLOCK_Q tokens x BLOCK_G heads. Exact fp32 dots
    run without tensor cores and need smaller tiles to stay within the registers."""
    block_m, block_n = (32, 32) if dtype == torch.float32 else (64, 64)
    block_g = triton.next_power_of_2(group)
    return max(1, block_m // block_g), block_g, block_n


if HAS_TRITON:

    @triton.jit
    def _prefill_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        cu_seqlens_q_ptr,
        context_lens_ptr,
        out_ptr,
        scale,
        group,
        head_dim,
        stride_q_token,
        stride_q_head,
        stride_out_token,
        stride_out_head,
        stride_cache_block,
        stride_cache_token,
        stride_cache_head,
        stride_table_seq,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        q_block = tl.program_id(2)
        q_start = tl.load(cu_seqlens_q_ptr + seq)
        q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
        if q_block * BLOCK_Q >= q_len:
            return
        context_len = tl.load(context_lens_ptr + seq)
        prefix_len = context_len - q_len

        rows = tl.arange(0, BLOCK_Q * BLOCK_G)
        q_idx = q_block * BLOCK_Q + rows // BLOCK_G  # query index within the chunk
        g = rows % BLOCK_G
        heads = kv_head * group + g
        row_mask = (q_idx < q_len) & (g < group)
        d = tl.arange(0, BLOCK_D)
        d_mask = d < head_dim
        io_mask = row_mask[:, None] & d_mask[None, :]
        q = tl.load(
            q_ptr + (q_start + q_idx)[:, None] * stride_q_token + heads[:, None] * stride_q_head + d[None, :],
            mask=io_mask,
            other=0.0,
        ).to(k_cache_ptr.dtype.element_ty)  # [BLOCK_Q * BLOCK_G, BLOCK_D]
        q_pos = prefix_len + q_idx  # absolute position of each row's query

        m = tl.full([BLOCK_Q * BLOCK_G], float("-inf"), tl.float32)
        row_sum = tl.zeros([BLOCK_Q * BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_Q * BLOCK_G, BLOCK_D], tl.float32)
        table = block_tables_ptr + seq * stride_table_seq
        # Keys past the last query of this block are never attended to.
        kv_end = prefix_len + tl.minimum((q_block + 1) * BLOCK_Q, q_len)
        for tile_start in range(0, kv_end, BLOCK_N):
            tok = tile_start + tl.arange(0, BLOCK_N)
            t_mask = tok < kv_end
            block = tl.load(table + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
            kv_rows = (
                block * stride_cache_block
                + (tok % BLOCK_SIZE) * stride_cache_token
                + kv_head * stride_cache_head
            )
            kv_offsets = kv_rows[:, None] + d[None, :]
            kv_mask = t_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
            scores = (
                tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            )  # [BLOCK_Q * BLOCK_G, BLOCK_N]
            allowed = (tok[None, :] <= q_pos[:, None]) & t_mask[None, :]
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            p = tl.exp(scores - m_new[:, None])
            alpha = tl.exp(m - m_new)
            row_sum = row_sum * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m = m_new

        out = acc / row_sum[:, None]
        out_offsets = (
            (q_start + q_idx)[:, None] * stride_out_token + heads[:, None] * stride_out_head + d[None, :]
        )
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_attention_prefill_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
) -> torch.Tensor:
    """Triton launcher of paged_attention_prefill; `max_query_len` sizes the grid without a device sync."""
    check_triton_device(q)
    q = q if q.stride(2) == 1 else q.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    group = num_heads // num_kv_heads
    block_q, block_g, block_n = prefill_tiles(k_cache.dtype, group)
    out = torch.empty_like(q)
    num_seqs = context_lens.shape[0]
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        scale,
        group,
        head_dim,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_G=block_g,
        BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        DOT_PRECISION=dot_precision(k_cache.dtype),
        num_warps=4,
        num_stages=2,
    )
    return out
