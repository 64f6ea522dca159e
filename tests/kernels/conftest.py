"""Kernel tests run the Triton kernels on CPU tensors under the Triton interpreter when there is no GPU (the
suite's root conftest sets TRITON_INTERPRET=1 and holds the `interpreter` and `triton_installed` fixtures).
Without triton (it installs on Linux x86_64 only) the Triton tests skip and the reference and C-kernel tests
run."""

import random

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A generator with a fresh seed each run; the seed is printed so a failure can be replayed."""
    seed = random.SystemRandom().randrange(2**31)
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def poison_allocations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every floating tensor from torch.empty / torch.empty_like starts as NaN, so unwritten outputs show."""
    for name in ("empty", "empty_like"):
        allocate = getattr(torch, name)

        def poisoned(*args, _allocate=allocate, **kwargs):
            tensor = _allocate(*args, **kwargs)
            return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

        monkeypatch.setattr(torch, name, poisoned)


@pytest.fixture(params=["torch", "triton", "auto"])
def kernel_backend(request) -> str:
    """Each kernel backend in turn: the PyTorch reference, Triton (on CPU under the interpreter), and "auto",
    which on CPU tensors runs the C kernels; those must have been built, or "auto" would test the reference
    a second time."""
    if request.param == "triton":
        request.getfixturevalue("interpreter")
    if request.param == "auto" and not torch.cuda.is_available():
        from pagedrl_kernels.cpu_library import load_library

        assert load_library("layer_ops") is not None, "the C kernels did not build (see the warning)"
    return request.param
