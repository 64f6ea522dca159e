"""LoRA shrink/expand: the adapter's delta `scale * (x A^T) B^T`, added in place into the projection output.

shrink: h = scale * (x A^T)    x [num_tokens, in], A [r, in] -> h [num_tokens, r]
expand: y += (h B^T) * mask    h [num_tokens, r], B [out, r], y [num_tokens, out], mask [num_tokens, 1]

shrink_expand: one shrink for the projections that read one x (q/k/v, gate/up), then an expand into each
    x [num_tokens, in], A [num * r, in] (their A stacked by rows), B_i [out_i, r], y_i [num_tokens, out_i]
    y_i += scale * (x A^T)[:, i r:(i + 1) r] B_i^T * mask
On the CPU it runs on transposed copies of the weights with the scale folded into B^T (StackedLora): MKL
multiplies those untransposed operands about 1.5x faster than transposed views, and small-batch decode pays
per op, so one matmul shrinks for the whole group, the mask multiplies the small h, and each projection gets
one in-place addmm with no [num_tokens, out] temporary.

Both accumulate in fp32; h is stored in x's dtype, and y gets one rounding of y + delta, so the delta is never
materialised as a [num_tokens, out] tensor on the Triton path. The mask is the per-token 0/1 choice of a batch
that mixes requests with and without the adapter. When a few token tiles would leave most SMs idle (decode),
shrink also splits the input features over programs and sums their fp32 partials in a second kernel, in a
fixed order, so results do not change from run to run.

One adapter per call. Serving several adapters in one batch (punica / S-LoRA style batched LoRA) would add a
per-token `adapter_indices` [num_tokens] argument after the weights, stack A as [num_adapters, r, in] and B as
[num_adapters, out, r], and let each token row read its adapter's rows (index -1 taking the mask's place as
"no adapter"). That is not built: the engine serves a single adapter.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels.backend import HAS_TRITON, check_triton_device, dot_precision, get_backend, use_triton
from kernels.cpu_gemm import WeightUpdate

if HAS_TRITON:
    import triton
    import triton.language as tl


@dataclass(slots=True, weakref_slot=True)
class StackedLora:
    """The LoRA weights of projections that read one input, with one rank r and one scale.

    a [num * r, in] stacks their A by rows and b holds each B [out, r]: the layout weights are synced in,
    read by the Triton kernels and the reference. On the CPU, a_t = A^T [in, num * r] and
    b_t[i] = scale * B_i^T [r, out] are transposed copies for MKL, and updates[i] is projection i's
    scale * B_i A_i as a WeightUpdate of its base weight (kernels/cpu_gemm.py merges it into the packed
    weight); `refresh` re-derives them after a and b are written, and bumps `version`."""

    a: torch.Tensor
    b: tuple[torch.Tensor, ...]
    scale: float
    a_t: torch.Tensor | None = field(init=False, default=None)
    b_t: tuple[torch.Tensor, ...] = field(init=False, default=())
    version: int = field(init=False, default=0)
    updates: tuple[WeightUpdate, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        rank = self.b[0].shape[1] if self.b and self.b[0].dim() == 2 else 0
        shapes_ok = self.a.dim() == 2 and self.a.shape[0] == len(self.b) * rank > 0
        if not shapes_ok or any(b.dim() != 2 or b.shape[1] != rank for b in self.b):
            raise ValueError(
                f"StackedLora needs B [out, r] of one rank r and A [num * r, in] stacking num A [r, in]; "
                f"got A {tuple(self.a.shape)} and B {[tuple(b.shape) for b in self.b]}"
            )
        if any(b.dtype != self.a.dtype or b.device != self.a.device for b in self.b):
            raise ValueError("StackedLora needs A and every B of one dtype on one device")
        if self.a.device.type == "cpu":
            self.a_t = self.a.new_empty(self.a.shape[::-1])
            self.b_t = tuple(b.new_empty(b.shape[::-1]) for b in self.b)
            self.refresh()

    @property
    def rank(self) -> int:
        return self.b[0].shape[1]

    def refresh(self) -> None:
        """Re-derive the CPU's transposed copies from a and b."""
        if self.a_t is None:
            return
        with torch.no_grad():
            self.a_t.copy_(self.a.t())
            for b_t, b in zip(self.b_t, self.b, strict=True):
                torch.mul(b.t(), self.scale, out=b_t)
        self.version += 1
        rank = self.rank
        self.updates = tuple(
            WeightUpdate(b_t.t(), self.a_t[:, i * rank : (i + 1) * rank].t(), self, self.version)
            for i, b_t in enumerate(self.b_t)
        )


def lora_shrink_torch(x: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference: (x A^T) * scale in x's dtype."""
    return F.linear(x, a) * scale


def lora_expand_torch(
    h: torch.Tensor, b: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Reference: y += (h B^T) * mask, in place; returns y."""
    delta = F.linear(h, b)
    if mask is not None:
        delta = delta * mask
    return y.add_(delta)


def lora_shrink_expand_torch(
    x: torch.Tensor, weights: StackedLora, ys: Sequence[torch.Tensor], mask: torch.Tensor | None
) -> None:
    """Reference: the shrink reference over the stacked A, then the expand reference per projection."""
    h = lora_shrink_torch(x, weights.a, weights.scale)  # [num_tokens, num * r]
    for y, b, h_i in zip(ys, weights.b, h.split(weights.rank, dim=1), strict=True):
        lora_expand_torch(h_i, b, y, mask)


def lora_shrink_expand_cpu(
    x: torch.Tensor, weights: StackedLora, ys: Sequence[torch.Tensor], mask: torch.Tensor | None
) -> None:
    """CPU launcher of lora_shrink_expand, MKL on the transposed copies: h = (x A^T) * mask once, then
    ys[i] += h_i (scale B_i^T) in place."""
    h = torch.mm(x, weights.a_t)  # [num_tokens, num * r]
    if mask is not None:
        h.mul_(mask)
    rank = weights.rank
    for i, (y, b_t) in enumerate(zip(ys, weights.b_t, strict=True)):
        y.addmm_(h[:, i * rank : (i + 1) * rank], b_t)


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


def lora_shrink_expand_triton(
    x: torch.Tensor, weights: StackedLora, ys: Sequence[torch.Tensor], mask: torch.Tensor | None
) -> None:
    """Triton launcher of lora_shrink_expand: the shrink kernel over the stacked A, then the expand kernel
    per projection on its rank columns of h."""
    h = lora_shrink_triton(x, weights.a, weights.scale)  # [num_tokens, num * r]
    for y, b, h_i in zip(ys, weights.b, h.split(weights.rank, dim=1), strict=True):
        lora_expand_triton(h_i, b, y, mask)


def _check_shrink(x: torch.Tensor, a: torch.Tensor) -> None:
    if x.dim() != 2 or a.dim() != 2 or a.shape[1] != x.shape[1]:
        raise ValueError(
            f"lora_shrink needs x [num_tokens, in] and A [r, in]; got {tuple(x.shape)} and {tuple(a.shape)}"
        )
    if x.dtype != a.dtype or x.device != a.device:
        raise ValueError(
            f"lora_shrink needs x and A of one dtype on one device; got {x.dtype} on {x.device} and "
            f"{a.dtype} on {a.device}: build the adapter buffers like the model's weights"
        )


def _check_expand(h: torch.Tensor, b: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> None:
    dims_ok = h.dim() == 2 and b.dim() == 2 and y.dim() == 2
    if not dims_ok or b.shape[1] != h.shape[1] or y.shape != (h.shape[0], b.shape[0]):
        raise ValueError(
            f"lora_expand needs h [num_tokens, r], B [out, r] and y [num_tokens, out]; got "
            f"{tuple(h.shape)}, {tuple(b.shape)} and {tuple(y.shape)}"
        )
    if h.dtype != b.dtype or not y.is_floating_point() or len({h.device, b.device, y.device}) != 1:
        raise ValueError(
            f"lora_expand needs h and B of one dtype and a floating y, all on one device; got h {h.dtype} "
            f"on {h.device}, B {b.dtype} on {b.device}, y {y.dtype} on {y.device}"
        )
    if y.stride(1) != 1:
        raise ValueError(
            f"lora_expand adds into y in place, so y's rows must be contiguous (stride 1); got strides "
            f"{y.stride()}: pass the projection output itself, not a transposed view"
        )
    if mask is not None and (mask.shape != (h.shape[0], 1) or mask.device != h.device):
        raise ValueError(
            f"lora_expand's mask must be [num_tokens, 1] = [{h.shape[0]}, 1] on {h.device} (1 = uses the "
            f"adapter, 0 = base model) or None; got {tuple(mask.shape)} on {mask.device}"
        )


def lora_shrink(x: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """h = scale * (x A^T) for x [num_tokens, in], A [r, in]: h [num_tokens, r] in x's dtype."""
    _check_shrink(x, a)
    if use_triton(x):
        return lora_shrink_triton(x, a, scale)
    return lora_shrink_torch(x, a, scale)


def lora_expand(
    h: torch.Tensor, b: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """y += (h B^T) * mask in place, for h [num_tokens, r], B [out, r], y [num_tokens, out] and a per-token
    0/1 mask [num_tokens, 1] (None: every token). Returns y; refused inputs leave y unwritten."""
    _check_expand(h, b, y, mask)
    if use_triton(h):
        return lora_expand_triton(h, b, y, mask)
    return lora_expand_torch(h, b, y, mask)


def _check_shrink_expand(
    x: torch.Tensor, weights: StackedLora, ys: Sequence[torch.Tensor], mask: torch.Tensor | None
) -> None:
    # Once per group and layer in every step: the weights were checked when stacked, so only the inputs are.
    a = weights.a
    num_tokens = x.shape[0] if x.dim() == 2 else -1
    shapes_ok = num_tokens >= 0 and x.shape[1] == a.shape[1] and len(ys) == len(weights.b)
    if not shapes_ok or any(
        y.shape != (num_tokens, b.shape[0]) or y.stride(1) != 1 for y, b in zip(ys, weights.b, strict=True)
    ):
        raise ValueError(
            f"lora_shrink_expand needs x [num_tokens, {a.shape[1]}] and one y [num_tokens, out] with "
            f"contiguous rows per B [out, r] {[tuple(b.shape) for b in weights.b]}; got x {tuple(x.shape)} "
            f"and y {[tuple(y.shape) for y in ys]} (strides {[y.stride() for y in ys]})"
        )
    if x.dtype != a.dtype or x.device != a.device or any(y.dtype != a.dtype for y in ys):
        raise ValueError(
            f"lora_shrink_expand needs x and every y in the adapter's dtype on its device, {a.dtype} on "
            f"{a.device}; got x {x.dtype} on {x.device} and y {[y.dtype for y in ys]}"
        )
    if mask is not None and (mask.shape != (num_tokens, 1) or mask.device != a.device):
        raise ValueError(
            f"lora_shrink_expand's mask must be [num_tokens, 1] = [{num_tokens}, 1] on {a.device} (1 = uses "
            f"the adapter, 0 = base model) or None; got {tuple(mask.shape)} on {mask.device}"
        )


def lora_shrink_expand(
    x: torch.Tensor, weights: StackedLora, ys: Sequence[torch.Tensor], mask: torch.Tensor | None = None
) -> None:
    """ys[i] += scale * (x A^T)[:, i r:(i + 1) r] B_i^T * mask in place, for projections that read one
    x [num_tokens, in], with their weights stacked (StackedLora), y_i [num_tokens, out_i] and a per-token
    0/1 mask [num_tokens, 1] (None: every token). Refused inputs leave every y unwritten."""
    _check_shrink_expand(x, weights, ys, mask)
    if use_triton(x):
        lora_shrink_expand_triton(x, weights, ys, mask)
    elif get_backend() == "auto" and weights.a_t is not None:
        lora_shrink_expand_cpu(x, weights, ys, mask)
    else:
        lora_shrink_expand_torch(x, weights, ys, mask)
