"""RMSNorm as in HF LlamaRMSNorm, optionally fused with the residual add that precedes it."""

import torch

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, use_triton
from pagedrl_kernels.cpu_library import F32, I32, I64, PTR, CpuKernels

if HAS_TRITON:
    import triton
    import triton.language as tl

_rms_norm_c = CpuKernels("layer_ops", "rms_norm", PTR, I64, PTR, I64, PTR, PTR, PTR, I32, I32, F32)


def rms_norm_torch(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference, step for step HF LlamaRMSNorm; with `residual` returns
    (rms_norm(x + residual), x + residual)."""
    hidden = x if residual is None else x + residual
    h32 = hidden.float()
    normed = h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * normed.to(x.dtype)
    return out if residual is None else (out, hidden)


if HAS_TRITON:

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        residual_ptr,
        weight_ptr,
        out_ptr,
        hidden_ptr,
        size,
        eps,
        stride_x,
        stride_residual,
        stride_out,
        stride_hidden,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < size
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
            # Round the sum to the input dtype first, as the unfused model does.
            x = (x.to(tl.float32) + residual.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(hidden_ptr + row * stride_hidden + cols, x, mask=mask)
        x32 = x.to(tl.float32)
        variance = tl.sum(x32 * x32, axis=0) / size
        normed = (x32 * tl.rsqrt(variance + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (normed * weight).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher of rms_norm: one program per token row."""
    check_triton_device(x)
    num_tokens, size = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    hidden = out if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    res = x if residual is None else residual
    block = triton.next_power_of_2(size)
    _rms_norm_kernel[(num_tokens,)](
        x,
        res,
        weight.contiguous(),
        out,
        hidden,
        size,
        eps,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        hidden.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=max(1, min(8, block // 256)),
    )
    return out if residual is None else (out, hidden)


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """C launcher of rms_norm for fp32 or bf16 CPU tensors (pagedrl_kernels/cpu/layer_ops.c), one pass per
    row."""
    x = x if x.stride(1) == 1 else x.contiguous()
    residual = residual if residual is None or residual.stride(1) == 1 else residual.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    hidden = None if residual is None else torch.empty(x.shape, dtype=x.dtype)
    _rms_norm_c[x.dtype](
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.contiguous().data_ptr(),
        out.data_ptr(),
        None if hidden is None else hidden.data_ptr(),
        x.shape[0],
        x.shape[1],
        eps,
    )
    return out if hidden is None else (out, hidden)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x `[num_tokens, hidden]`; with `residual`, fused: returns
    (rms_norm(x + residual), x + residual)."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"rms_norm needs x [num_tokens, hidden] and weight [hidden]; "
            f"got {tuple(x.shape)} and {tuple(weight.shape)}"
        )
    if residual is not None and residual.shape != x.shape:
        raise ValueError(
            f"rms_norm residual {tuple(residual.shape)} must have the shape of x {tuple(x.shape)}"
        )
    if use_triton(x):
        return rms_norm_triton(x, weight, eps, residual)
    if _rms_norm_c.available(x, weight, residual):
        return rms_norm_cpu(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)
