"""Kernel tests run the Triton kernels on CPU tensors under the Triton interpreter when there is no GPU.

triton reads TRITON_INTERPRET when a function is decorated with @triton.jit, which happens when triton itself
(its tl.sum, tl.max ...) and each kernels module are imported. The variable is set here, and in the suite's
root conftest, before either is imported. If the process imported triton earlier without it (for instance a
script calling pytest.main after importing transformers' Llama, which imports triton), the kernels cannot be
interpreted: the Triton-on-CPU tests then skip and name the fix instead of failing inside triton. Without
triton (it installs on Linux x86_64 only) the Triton tests skip and the reference and C-kernel tests run."""

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import kernels.backend  # noqa: E402

if kernels.backend.HAS_TRITON:
    import triton.language.standard
    from triton.runtime.interpreter import InterpretedFunction

INTERPRETER_READY = kernels.backend.INTERPRETED and isinstance(
    triton.language.standard.sum, InterpretedFunction
)


@pytest.fixture
def triton_installed() -> None:
    """Tests that force the Triton backend skip where triton is not installed."""
    if not kernels.backend.HAS_TRITON:
        pytest.skip("triton is not installed (pyproject installs it on Linux x86_64 only)")


@pytest.fixture
def interpreter(triton_installed) -> None:
    """Tests running Triton on CPU tensors need the interpreter, which is left off when CUDA is present."""
    if torch.cuda.is_available() and not INTERPRETER_READY:
        pytest.skip(
            "TRITON_INTERPRET is off because CUDA is present; the -m gpu tests cover the kernels there"
        )
    if not INTERPRETER_READY:
        pytest.skip(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot be interpreted: "
            "run with TRITON_INTERPRET=1 in the environment or start pytest before importing triton"
        )


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
        from kernels.cpu_library import load_library

        assert load_library("layer_ops") is not None, "the C kernels did not build (see the warning)"
    return request.param
