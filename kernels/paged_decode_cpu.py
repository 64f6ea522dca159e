"""Paged decode attention on CPU in C (kernels/cpu/paged_decode.c): each sequence's query attends to its
cached tokens read in place through its block table, with no copy of the K/V out of the cache. It is tested
against the PyTorch reference, paged_attention_decode_torch."""

from __future__ import annotations

import ctypes

import torch

from kernels.backend import get_backend
from kernels.cpu_library import load_library

# The limits kernels/cpu/paged_decode.c was compiled with: head_dim a multiple of 16 up to MAX_HEAD_DIM,
# and up to MAX_GROUP query heads per KV head.
MAX_HEAD_DIM, MAX_GROUP = 256, 64


def _library() -> ctypes.CDLL | None:
    library = load_library("paged_decode")
    if library is not None and library.paged_decode_f32.argtypes is None:
        i64, i32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        library.paged_decode_f32.argtypes = [ptr, i64, i64, ptr, ptr, ptr, i64, ptr, ptr, *[i32] * 5]
        library.paged_decode_f32.argtypes += [ctypes.c_float]
    return library


def cpu_decode_supported(k_cache: torch.Tensor, num_heads: int) -> bool:
    """Whether the C kernel runs for num_heads query heads over this cache [num_blocks, block_size,
    num_kv_heads, head_dim]: fp32 on CPU within its compiled limits, the "auto" kernel backend, and a
    library that could be built here."""
    head_dim, num_kv_heads = k_cache.shape[3], k_cache.shape[2]
    return (
        get_backend() == "auto"
        and k_cache.device.type == "cpu"
        and k_cache.dtype == torch.float32
        and head_dim % 16 == 0
        and head_dim <= MAX_HEAD_DIM
        and num_heads // num_kv_heads <= MAX_GROUP
        and _library() is not None
    )


def paged_attention_decode_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """C launcher of paged_attention_decode for fp32 CPU tensors (see cpu_decode_supported)."""
    library = _library()
    if library is None:
        raise RuntimeError("the C decode attention kernel could not be built on this machine")
    q = q.float() if q.stride(2) == 1 else q.float().contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1:3]
    out = torch.empty(num_seqs, num_heads, head_dim, dtype=torch.float32)
    status = library.paged_decode_f32(
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
        scale,
    )
    if status != 0:
        raise ValueError(
            f"the C decode attention kernel takes head_dim a multiple of 16 up to {MAX_HEAD_DIM} and up to "
            f"{MAX_GROUP} query heads per KV head; got {head_dim} and {num_heads // num_kv_heads}"
        )
    return out
