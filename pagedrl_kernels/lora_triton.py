"""The Triton backend of pagedrl_kernels/lora.py on CUDA: the shrink kernel (with its split over input
features and the fp32 reduction that sums the splits), the expand kernel, their tile sizes, and one launcher
per op. pagedrl_kernels/lora.py documents the ops and dispatches to these; the tests hold them to its PyTorch
reference.
"""

import functools

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, dot_precision

if HAS_TRITON:
    import triton
    import triton.language as tl


if HAS_TRITON:

    @triton.jit
    def _lora_shrink_kernel(
        x_ptr,
        a_ptr,
        h_ptr,
        num_tokens,
        in_features,
        rank,
        scale,
        split_len,
        stride_x,
        stride_a,
        stride_h_split,
        stride_h,
        SPLIT: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        split = tl.program_id(2)
        row_ok = rows < num_tokens
        rank_ok = ranks < rank
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
        a_rows = a_ptr + ranks.to(tl.int64)[:, None] * stride_a
        end = tl.minimum((split + 1) * split_len, in_features)
        acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
        for start in range(split * split_len, end, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            col_ok = cols < end
            x = tl.load(x_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            a = tl.load(a_rows + cols[None, :], mask=rank_ok[:, None] & col_ok[None, :], other=0.0)
            acc += tl.dot(x, tl.trans(a), input_precision=DOT_PRECISION)  # [BLOCK_T, BLOCK_R]
        h_ptrs = h_ptr + split * stride_h_split + rows.to(tl.int64)[:, None] * stride_h + ranks[None, :]
        if SPLIT:  # an fp32 partial sum, reduced by _lora_reduce_kernel
            tl.store(h_ptrs, acc, mask=row_ok[:, None] & rank_ok[None, :])
        else:
            tl.store(
                h_ptrs, (acc * scale).to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & rank_ok[None, :]
            )

    @triton.jit
    def _lora_reduce_kernel(
        partial_ptr,
        h_ptr,
        num_tokens,
        rank,
        num_splits,
        scale,
        stride_p_split,
        stride_p,
        stride_h,
        BLOCK_T: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ranks = tl.arange(0, BLOCK_R)
        tile_ok = (rows < num_tokens)[:, None] & (ranks < rank)[None, :]
        partials = partial_ptr + rows.to(tl.int64)[:, None] * stride_p + ranks[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_R), dtype=tl.float32)
        for split in range(num_splits):  # a fixed order: the sum is the same every run
            acc += tl.load(partials + split * stride_p_split, mask=tile_ok, other=0.0)
        h = (acc * scale).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rows.to(tl.int64)[:, None] * stride_h + ranks[None, :], h, mask=tile_ok)

    @triton.jit
    def _lora_expand_kernel(
        h_ptr,
        b_ptr,
        y_ptr,
        mask_ptr,
        num_tokens,
        out_features,
        rank,
        stride_h,
        stride_b,
        stride_y,
        stride_mask,
        HAS_MASK: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_R: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < num_tokens
        col_ok = cols < out_features
        h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_h
        b_rows = b_ptr + cols.to(tl.int64)[:, None] * stride_b
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        for start in range(0, rank, BLOCK_R):
            ranks = start + tl.arange(0, BLOCK_R)
            rank_ok = ranks < rank
            h = tl.load(h_rows + ranks[None, :], mask=row_ok[:, None] & rank_ok[None, :], other=0.0)
            b = tl.load(b_rows + ranks[None, :], mask=col_ok[:, None] & rank_ok[None, :], other=0.0)
            acc += tl.dot(h, tl.trans(b), input_precision=DOT_PRECISION)  # [BLOCK_T, BLOCK_N]
        if HAS_MASK:
            keep = tl.load(mask_ptr + rows.to(tl.int64) * stride_mask, mask=row_ok, other=0.0)
            acc = acc * keep.to(tl.float32)[:, None]
        y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols[None, :]
        tile_ok = row_ok[:, None] & col_ok[None, :]
        y = tl.load(y_ptrs, mask=tile_ok, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=tile_ok)


MIN_TILES_PER_SPLIT = 4  # BLOCK_K tiles of input features per split: fewer would not pay for the reduction


def _token_block(num_tokens: int) -> int:
    # tl.dot needs tiles of at least 16 rows; decode batches are small, prefill chunks large.
    return min(64, max(16, triton.next_power_of_2(num_tokens)))


def _rank_block(rank: int) -> int:
    return min(64, max(16, triton.next_power_of_2(rank)))


def _feature_block(dtype: torch.dtype) -> int:
    return 64 if dtype == torch.float32 else 128


def expand_num_warps(dtype: torch.dtype) -> int:
    """Eight warps hold the bf16/fp16 expand tile (64 tokens x 128 features, rank up to 64) in registers;
    with four, sm_90 spills."""
    return 4 if dtype == torch.float32 else 8


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _num_splits(device: torch.device, num_tiles: int, num_k_tiles: int) -> int:
    """Input-feature splits so that small token counts still spread over the GPU's SMs; 1 on the CPU."""
    if device.type != "cuda":
        return 1
    return max(1, min(num_k_tiles // MIN_TILES_PER_SPLIT, triton.cdiv(_num_sms(device), num_tiles)))


def lora_shrink_triton(
    x: torch.Tensor, a: torch.Tensor, scale: float, num_splits: int | None = None
) -> torch.Tensor:
    """Triton launcher of lora_shrink: program (token tile, rank tile, split) loops over its share of the
    input features. With several splits (None: enough to fill the GPU), a second kernel sums fp32 partials."""
    check_triton_device(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    a = a.contiguous()
    num_tokens, in_features = x.shape
    rank = a.shape[0]
    h = torch.empty((num_tokens, rank), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return h
    block_t, block_r, block_k = _token_block(num_tokens), _rank_block(rank), _feature_block(x.dtype)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(rank, block_r))
    num_k_tiles = triton.cdiv(in_features, block_k)
    if num_splits is None:
        num_splits = _num_splits(x.device, grid[0] * grid[1], num_k_tiles)
    split_tiles = triton.cdiv(num_k_tiles, max(1, min(num_splits, num_k_tiles)))
    num_splits = triton.cdiv(num_k_tiles, split_tiles)
    # [num_splits, num_tokens, rank]
    out = h[None] if num_splits == 1 else torch.empty((num_splits, num_tokens, rank), device=x.device)
    _lora_shrink_kernel[(*grid, num_splits)](
        x,
        a,
        out,
        num_tokens,
        in_features,
        rank,
        float(scale),
        split_tiles * block_k,
        x.stride(0),
        a.stride(0),
        out.stride(0),
        out.stride(1),
        SPLIT=num_splits > 1,
        BLOCK_T=block_t,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        DOT_PRECISION=dot_precision(x.dtype),
    )
    if num_splits > 1:
        _lora_reduce_kernel[(triton.cdiv(num_tokens, block_t),)](
            out,
            h,
            num_tokens,
            rank,
            num_splits,
            float(scale),
            out.stride(0),
            out.stride(1),
            h.stride(0),
            BLOCK_T=block_t,
            BLOCK_R=triton.next_power_of_2(rank),
        )
    return h


def lora_expand_triton(
    h: torch.Tensor, b: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Triton launcher of lora_expand: program (token tile, output tile) adds its delta into y in place."""
    check_triton_device(h)
    if h.stride(1) != 1:  # strided rows are fine: shrink_expand passes each projection's columns of one h
        h = h.contiguous()
    b = b.contiguous()
    num_tokens, out_features = y.shape
    if num_tokens == 0:
        return y
    block_t, block_n = _token_block(num_tokens), _feature_block(y.dtype)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(out_features, block_n))
    _lora_expand_kernel[grid](
        h,
        b,
        y,
        h if mask is None else mask,
        num_tokens,
        out_features,
        h.shape[1],
        h.stride(0),
        b.stride(0),
        y.stride(0),
        0 if mask is None else mask.stride(0),
        HAS_MASK=mask is not None,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        BLOCK_R=_rank_block(h.shape[1]),
        DOT_PRECISION=dot_precision(h.dtype),
        num_warps=expand_num_warps(y.dtype),
    )
    return y
