"""SiLU-and-multiply of the gated MLP: silu(gate) * up."""

import torch
import torch.nn.functional as F

from pagedrl_kernels.backend import HAS_TRITON, check_triton_device, use_triton
from pagedrl_kernels.cpu_library import I32, I64, PTR, CpuKernels

if HAS_TRITON:
    import triton
    import triton.language as tl

_silu_and_mul_c = CpuKernels("layer_ops", "silu_and_mul", PTR, I64, PTR, I64, PTR, I32, I32)


def silu_and_mul_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Reference: silu(gate) * up, computed in fp32 and cast back to the input dtype."""
    return (F.silu(gate.float()) * up.float()).to(gate.dtype)


if HAS_TRITON:

    @triton.jit
    def _silu_and_mul_kernel(
        gate_ptr, up_ptr, out_ptr, size, stride_gate, stride_up, stride_out, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < size
        gate = tl.load(gate_ptr + row * stride_gate + cols, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + row * stride_up + cols, mask=mask, other=0.0).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up
        tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Triton launcher of silu_and_mul; rows may be strided, columns must be contiguous."""
    check_triton_device(gate)
    num_tokens, size = gate.shape
    if gate.stride(1) != 1 or up.stride(1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate, memory_format=torch.contiguous_format)
    block = min(1024, triton.next_power_of_2(size))
    grid = (num_tokens, triton.cdiv(size, block))
    _silu_and_mul_kernel[grid](gate, up, out, size, gate.stride(0), up.stride(0), out.stride(0), BLOCK=block)
    return out


def silu_and_mul_cpu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """C launcher of silu_and_mul for fp32 or bf16 CPU tensors (pagedrl_kernels/cpu/layer_ops.c); rows may be
    strided."""
    if gate.stride(1) != 1 or up.stride(1) != 1:
        gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty(gate.shape, dtype=gate.dtype)
    num_tokens, size = gate.shape
    args = (gate.data_ptr(), gate.stride(0), up.data_ptr(), up.stride(0), out.data_ptr(), num_tokens, size)
    _silu_and_mul_c[gate.dtype](*args)
    return out


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up `[num_tokens, intermediate]`."""
    if gate.shape != up.shape or gate.dim() != 2:
        raise ValueError(
            f"silu_and_mul needs gate and up of the same shape [num_tokens, intermediate]; "
            f"got {tuple(gate.shape)} and {tuple(up.shape)}"
        )
    if use_triton(gate):
        return silu_and_mul_triton(gate, up)
    if _silu_and_mul_c.available(gate, up):
        return silu_and_mul_cpu(gate, up)
    return silu_and_mul_torch(gate, up)
