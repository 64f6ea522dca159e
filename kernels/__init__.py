"""Kernels of the rollout engine: each op has a Triton kernel, a PyTorch reference and a dispatcher."""

from kernels.backend import get_backend, set_backend, use_backend

__all__ = ["get_backend", "set_backend", "use_backend"]
