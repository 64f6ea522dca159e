"""Kernels of the rollout engine: each op has a Triton kernel (defined only where triton is installed), a
PyTorch reference and a dispatcher; the decode layer's ops also have a C kernel for fp32 and bf16 CPU tensors
(pagedrl_kernels/cpu, built by cpu_library). fp32 CPU projections multiply through MKL-packed weights, bf16
ones through a stacked bf16 copy (cpu_gemm), with F.linear as their reference."""

from pagedrl_kernels.backend import get_backend, set_backend, use_backend

__all__ = ["get_backend", "set_backend", "use_backend"]
