"""Writing new keys and values into the paged KV cache through a slot mapping."""

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, use_triton
from pagedrl_kernels.cpu_library import I32, I64, PTR, CpuKernels

if HAS_TRITON:
    import triton
    import triton.language as tl

_reshape_and_cache_c = CpuKernels(
    "layer_ops", "reshape_and_cache", PTR, I64, I64, PTR, I64, I64, PTR, PTR, PTR, I64, I32, I32, I32
)


def reshape_and_cache_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference: k_cache.view(-1, heads, dim)[slot] = key for every token whose slot is >= 0."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    num_kv_heads, head_dim = k_cache.shape[2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, key[keep].to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, value[keep].to(v_cache.dtype))


if HAS_TRITON:

    @triton.jit
    def _reshape_and_cache_kernel(
        key_ptr,
        value_ptr,
        k_cache_ptr,
        v_cache_ptr,
        slot_mapping_ptr,
        num_kv_heads,
        head_dim,
        stride_key_token,
        stride_key_head,
        stride_value_token,
        stride_value_head,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        token = tl.program_id(0)
        slot = tl.load(slot_mapping_ptr + token)
        if slot < 0:
            return
        heads = tl.arange(0, BLOCK_H)[:, None]
        dims = tl.arange(0, BLOCK_D)[None, :]
        mask = (heads < num_kv_heads) & (dims < head_dim)
        key = tl.load(key_ptr + token * stride_key_token + heads * stride_key_head + dims, mask=mask)
        value = tl.load(value_ptr + token * stride_value_token + heads * stride_value_head + dims, mask=mask)
        # The cache is contiguous: a slot's row starts at slot * heads * dim.
        offsets = slot.to(tl.int64) * num_kv_heads * head_dim + heads * head_dim + dims
        tl.store(k_cache_ptr + offsets, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(v_cache_ptr + offsets, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton launcher of reshape_and_cache: one program per token, skipping slots < 0."""
    check_triton_device(key)
    if key.stride(2) != 1 or value.stride(2) != 1:
        key, value = key.contiguous(), value.contiguous()
    num_tokens, num_kv_heads, head_dim = key.shape
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        num_kv_heads,
        head_dim,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


def reshape_and_cache_cpu(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """C launcher of reshape_and_cache for fp32 or bf16 CPU tensors, the key and value in the cache's dtype
    (pagedrl_kernels/cpu/layer_ops.c), skipping slots < 0."""
    if key.stride(2) != 1 or value.stride(2) != 1:
        key, value = key.contiguous(), value.contiguous()
    slots = slot_mapping.to(torch.int64).contiguous()
    num_tokens, num_kv_heads, head_dim = key.shape
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    status = _reshape_and_cache_c[k_cache.dtype](
        key.data_ptr(),
        key.stride(0),
        key.stride(1),
        value.data_ptr(),
        value.stride(0),
        value.stride(1),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slots.data_ptr(),
        num_slots,
        num_tokens,
        num_kv_heads,
        head_dim,
    )
    if status != 0:
        raise ValueError(f"slot_mapping holds a slot past the cache's {num_slots} slots")


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value `[num_tokens, num_kv_heads, head_dim]` into k_cache/v_cache
    `[num_blocks, block_size, num_kv_heads, head_dim]` at `slot_mapping` `[num_tokens]`;
    slots < 0 are skipped."""
    if key.shape != value.shape or key.dim() != 3 or key.shape[1:] != k_cache.shape[2:]:
        raise ValueError(
            f"reshape_and_cache needs key and value [num_tokens, num_kv_heads, head_dim] matching the cache "
            f"[num_blocks, block_size, num_kv_heads, head_dim]; got key {tuple(key.shape)}, value "
            f"{tuple(value.shape)}, cache {tuple(k_cache.shape)}"
        )
    if k_cache.shape != v_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("reshape_and_cache needs contiguous k_cache and v_cache of the same shape")
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping must be [num_tokens={key.shape[0]}]; got {tuple(slot_mapping.shape)}")
    if use_triton(key):
        reshape_and_cache_triton(key, value, k_cache, v_cache, slot_mapping)
    elif _reshape_and_cache_c.available(key, value, k_cache, v_cache):
        reshape_and_cache_cpu(key, value, k_cache, v_cache, slot_mapping)
    else:
        reshape_and_cache_torch(key, value, k_cache, v_cache, slot_mapping)
