"""Backend choice shared by every kernel dispatcher: "auto" (Triton on CUDA tensors; on CPU the C kernels of
pagedrl_kernels/cpu for fp32 tensors when they could be built, else the PyTorch reference), "torch" (always
the PyTorch reference) or "triton" (always the Triton kernel).

Forcing "triton" on CPU tensors runs the Triton kernels under Triton's interpreter (TRITON_INTERPRET=1 in the
environment before triton is imported; the test suite's conftest sets it): the engine then takes the path it
takes on CUDA, F.linear, the Triton kernels and the torch sampler, with the CPU-only paths (the MKL-packed
projections, the C kernels, the merged LoRA pack) off. That is for tests, which rehearse the GPU path on the
CPU (tests/rollout_engine/test_engine_triton_interpret.py): interpreted kernels are far slower.

triton is optional: pyproject installs it only on Linux x86_64, so on a Mac or an ARM machine the kernel
modules define no Triton kernels (each guards them with `if HAS_TRITON:`) and "auto" runs the C kernels or
the PyTorch reference, on CUDA tensors too."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

try:
    import triton
except ImportError:
    triton = None

HAS_TRITON = triton is not None
BACKENDS = ("auto", "torch", "triton")

# Decided when the Triton kernels are decorated: triton reads TRITON_INTERPRET at @triton.jit time.
INTERPRETED = HAS_TRITON and bool(triton.knobs.runtime.interpret)

_NO_TRITON = (
    "triton is not installed (pyproject installs it on Linux x86_64 only): use the torch backend "
    "(pagedrl_kernels.set_backend('torch') or 'auto'), or pip install triton where it is available"
)

_backend = "auto"


def set_backend(name: str) -> None:
    """Force the kernels onto one backend: "auto", "torch" or "triton"."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "triton" and not HAS_TRITON:
        raise RuntimeError(_NO_TRITON)
    _backend = name


def get_backend() -> str:
    """The backend currently in force."""
    return _backend


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run a block with the kernels forced onto `name`, restoring the previous backend afterwards."""
    previous = _backend
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether a dispatcher should launch the Triton kernel for inputs living where `tensor` lives."""
    if _backend == "auto":
        return HAS_TRITON and tensor.is_cuda
    return _backend == "triton"


def check_triton_device(tensor: torch.Tensor) -> None:
    """Triton is installed, and runs CUDA tensors, or CPU tensors only under the interpreter."""
    if not HAS_TRITON:
        raise RuntimeError(_NO_TRITON)
    if tensor.is_cuda or (INTERPRETED and tensor.device.type == "cpu"):
        return
    raise RuntimeError(
        f"the Triton kernels cannot run on {tensor.device} tensors here: use CUDA tensors, or set "
        "TRITON_INTERPRET=1 before triton and kernels are imported, or use the torch backend "
        "(pagedrl_kernels.set_backend('torch'))"
    )


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact for fp32 (tensor cores would round to tf32), the default otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
