"""Paged decode attention on CPU in C (pagedrl_kernels/cpu/paged_decode.c): each sequence's query attends to
its cached tokens read in place through its block table, with no copy of the K/V out of the cache, in fp32
over an fp32 or a bf16 cache. It is tested against the PyTorch reference, paged_attention_decode_torch."""

from __future__ import annotations

import torch

from pagedrl_kernels.cpu_library import F32, I32, I64, PTR, CpuKernels

# The limits pagedrl_kernels/cpu/paged_decode.c was compiled with: head_dim a multiple of 16 up to
# MAX_HEAD_DIM, and up to MAX_GROUP query heads per KV head.
MAX_HEAD_DIM, MAX_GROUP = 256, 64

_paged_decode = CpuKernels(
    "paged_decode", "paged_decode", PTR, I64, I64, PTR, PTR, PTR, I64, PTR, PTR, *[I32] * 6, F32
)


def cpu_decode_supported(k_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether the C kernel runs for num_heads query heads over this cache [num_blocks, block_size,
    num_kv_heads, head_dim]: an fp32 or bf16 CPU cache within its compiled limits (see
    CpuKernel.available)."""
    head_dim, num_kv_heads = k_cache.shape[3], k_cache.shape[2]
    return (
        head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
        and num_heads // num_kv_heads <= MAX_GROUP
        and _paged_decode.available(k_cache)
    )


def paged_attention_decode_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """C launcher of paged_attention_decode for CPU tensors (see cpu_decode_supported): fp32 arithmetic over
    the cache's values, the output in q's dtype."""
    q_dtype = q.dtype
    q = q.float() if q.stride(2) == 1 else q.float().contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=torch.float32)
    status = _paged_decode[k_cache.dtype](
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        out.data_ptr(),
        num_seqs,
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        k_cache.shape[0],
        scale,
    )
    if status == -2:
        raise ValueError(f"a block table entry lies outside the cache's {k_cache.shape[0]} blocks")
    if status != 0:
        raise ValueError(
            f"the C decode attention kernel takes head_dim a multiple of 16 up to {MAX_HEAD_DIM} and up to "
            f"{MAX_GROUP} query heads per KV head; got {head_dim} and {num_heads // num_kv_heads}"
        )
    return out.to(q_dtype)
