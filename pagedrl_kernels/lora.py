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
materialised as a [num_tokens, out] tensor on the Triton path. x is in the adapter's dtype, y may be in
another: peft keeps a bf16 model's adapter in fp32 and computes the delta there (the engine casts x to it
first), and y, the bf16 base product, then takes the fp32 delta with one rounding. The mask is the per-token
0/1 choice of a batch that mixes requests with and without the adapter. When a few token tiles would leave
most SMs idle (decode), shrink also splits the input features over programs and sums their fp32 partials in
a second kernel, in a fixed order, so results do not change from run to run.

One adapter per call. Serving several adapters in one batch (punica / S-LoRA style batched LoRA) would add a
per-token `adapter_indices` [num_tokens] argument after the weights, stack A as [num_adapters, r, in] and B as
[num_adapters, out, r], and let each token row read its adapter's rows (index -1 taking the mask's place as
"no adapter"). That is not built: the engine serves a single adapter.

The Triton kernels and their single-op launchers live in pagedrl_kernels/lora_triton.py.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pagedrl_kernels.backend import get_backend, use_triton
from pagedrl_kernels.cpu_gemm import WeightUpdate
from pagedrl_kernels.lora_triton import lora_expand_triton, lora_shrink_triton


@dataclass(slots=True)
class StackedLora:
    """The LoRA weights of projections that read one input, with one rank r and one scale.

    a [num * r, in] stacks their A by rows and b holds each B [out, r]: the layout weights are synced in,
    read by the Triton kernels and the reference. On the CPU, a_t = A^T [in, num * r] and
    b_t[i] = scale * B_i^T [r, out] are transposed copies for MKL, and updates[i] is projection i's
    scale * B_i A_i as a WeightUpdate of its base weight (pagedrl_kernels/cpu_gemm.py merges it into the
    packed weight), owned by b_t[i], so the merged packs go when these weights do, with no reference cycle to
    wait for the garbage collector; `refresh` re-derives them after a and b are written, and bumps
    `version`."""

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
            WeightUpdate(b_t.t(), self.a_t[:, i * rank : (i + 1) * rank].t(), b_t, self.version)
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
    ys[i] += h_i (scale B_i^T) in place (through an [num_tokens, out] temporary where y's dtype is not the
    adapter's)."""
    h = torch.mm(x, weights.a_t)  # [num_tokens, num * r]
    if mask is not None:
        h.mul_(mask)
    rank = weights.rank
    for i, (y, b_t) in enumerate(zip(ys, weights.b_t, strict=True)):
        h_i = h[:, i * rank : (i + 1) * rank]
        if y.dtype == h.dtype:
            y.addmm_(h_i, b_t)
        else:  # addmm_ takes one dtype: the delta in the adapter's, added with one rounding to y's
            y.add_(torch.mm(h_i, b_t))


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
    if x.dtype != a.dtype or x.device != a.device or not all(y.is_floating_point() for y in ys):
        raise ValueError(
            f"lora_shrink_expand needs x in the adapter's dtype on its device, {a.dtype} on {a.device}, and "
            f"floating y; got x {x.dtype} on {x.device} and y {[y.dtype for y in ys]}"
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
