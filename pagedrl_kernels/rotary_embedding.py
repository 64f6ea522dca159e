"""Rotary position embedding in the NeoX / HF "rotate_half" style of Llama and Qwen."""

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, use_triton
from pagedrl_kernels.cpu_library import I32, I64, PTR, CpuKernels

if HAS_TRITON:
    import triton
    import triton.language as tl

_rotary_c = CpuKernels(
    "layer_ops", "rotary_embedding", PTR, PTR, I64, I64, I32, PTR, I64, I64, I32, PTR, I64, I32, I32, I32
)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [num_tokens, num_heads, head_dim]; cos, sin [num_tokens, 1, head_dim // 2]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def rotary_embedding_torch(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: HF apply_rotary_pos_emb computed in fp32; returns new (q, k)."""
    cos, sin = cos_sin_cache[positions].float().unsqueeze(1).chunk(2, dim=-1)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


if HAS_TRITON:

    @triton.jit
    def _rotate_heads(
        x_ptr,
        stride_token,
        stride_head,
        token,
        cos,
        sin,
        num_heads,
        half,
        BLOCK_H: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
    ):
        heads = tl.arange(0, BLOCK_H)[:, None]
        cols = tl.arange(0, BLOCK_HALF)[None, :]
        mask = (heads < num_heads) & (cols < half)
        ptr1 = x_ptr + token * stride_token + heads * stride_head + cols
        x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptr1 + half, mask=mask, other=0.0).to(tl.float32)
        tl.store(ptr1, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(ptr1 + half, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotary_kernel(
        positions_ptr,
        q_ptr,
        k_ptr,
        cache_ptr,
        num_heads,
        num_kv_heads,
        half,
        stride_q_token,
        stride_q_head,
        stride_k_token,
        stride_k_head,
        stride_cache,
        BLOCK_H: tl.constexpr,
        BLOCK_KV_H: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
    ):
        token = tl.program_id(0)
        position = tl.load(positions_ptr + token)
        cols = tl.arange(0, BLOCK_HALF)
        cos = tl.load(cache_ptr + position * stride_cache + cols, mask=cols < half, other=0.0).to(tl.float32)
        sin = tl.load(cache_ptr + position * stride_cache + half + cols, mask=cols < half, other=0.0).to(
            tl.float32
        )
        cos = cos[None, :]
        sin = sin[None, :]
        _rotate_heads(
            q_ptr, stride_q_token, stride_q_head, token, cos, sin, num_heads, half, BLOCK_H, BLOCK_HALF
        )
        _rotate_heads(
            k_ptr, stride_k_token, stride_k_head, token, cos, sin, num_kv_heads, half, BLOCK_KV_H, BLOCK_HALF
        )


def rotary_embedding_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher of rotary_embedding: rotates q and k in place (last dim contiguous), returns them."""
    check_triton_device(q)
    if q.stride(2) != 1 or k.stride(2) != 1:
        raise ValueError(
            "rotary_embedding_triton rotates in place and needs q and k with a contiguous last dim"
        )
    num_tokens, num_heads, head_dim = q.shape
    cache = cos_sin_cache.contiguous()
    _rotary_kernel[(num_tokens,)](
        positions,
        q,
        k,
        cache,
        num_heads,
        k.shape[1],
        head_dim // 2,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cache.stride(0),
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV_H=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
    )
    return q, k


def rotary_embedding_cpu(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """C launcher of rotary_embedding for fp32 or bf16 CPU q and k and an fp32 cos_sin_cache
    (pagedrl_kernels/cpu/layer_ops.c): rotates q and k in place when their last dim is contiguous (else copies
    first), returns them."""
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    cache = cos_sin_cache.contiguous()
    positions = positions.to(torch.int64).contiguous()
    num_tokens, num_heads, head_dim = q.shape
    status = _rotary_c[q.dtype](
        positions.data_ptr(),
        q.data_ptr(),
        q.stride(0),
        q.stride(1),
        num_heads,
        k.data_ptr(),
        k.stride(0),
        k.stride(1),
        k.shape[1],
        cache.data_ptr(),
        cache.stride(0),
        cache.shape[0],
        num_tokens,
        head_dim,
    )
    if status != 0:
        raise ValueError(f"positions must lie in [0, {cache.shape[0]}), the rows of cos_sin_cache")
    return q, k


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q `[num_tokens, num_heads, head_dim]` and k `[num_tokens, num_kv_heads, head_dim]` by the
    cos/sin rows of `positions` in `cos_sin_cache` `[max_positions, head_dim]` = cat(cos, sin)."""
    head_dim = q.shape[-1]
    if q.dim() != 3 or k.dim() != 3 or k.shape[-1] != head_dim or head_dim % 2:
        raise ValueError(
            f"rotary_embedding needs q [num_tokens, num_heads, head_dim] and "
            f"k [num_tokens, num_kv_heads, head_dim] with the same even head_dim; "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, head_dim={head_dim}] = cat(cos, sin); "
            f"got {tuple(cos_sin_cache.shape)}"
        )
    if positions.shape != (q.shape[0],):
        raise ValueError(f"positions must be [num_tokens={q.shape[0]}]; got {tuple(positions.shape)}")
    if use_triton(q):
        return rotary_embedding_triton(positions, q, k, cos_sin_cache)
    fp32_cache = cos_sin_cache.dtype == torch.float32 and cos_sin_cache.device.type == "cpu"
    if fp32_cache and _rotary_c.available(q, k):
        return rotary_embedding_cpu(positions, q, k, cos_sin_cache)
    return rotary_embedding_torch(positions, q, k, cos_sin_cache)
