"""Suite-wide settings: offline hub, offline W&B, the `gpu` tier, the Triton interpreter on CPU, and the
shared default model.

triton reads TRITON_INTERPRET when a function is decorated with @triton.jit, which happens when triton itself
(its tl.sum, tl.max ...) and each kernels module are imported, so the variable is set here, before either is.
If the process imported triton earlier without it (for instance a script calling pytest.main after importing
transformers' Llama, which imports triton), the kernels cannot be interpreted: the tests that run Triton on
CPU tensors (the `interpreter` fixture) then skip and name the fix instead of failing inside triton."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton decides at decoration time whether to interpret: set it before any kernel module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pagedrl_kernels.backend  # noqa: E402

if pagedrl_kernels.backend.HAS_TRITON:
    import triton.language.standard
    from triton.runtime.interpreter import InterpretedFunction

INTERPRETER_READY = pagedrl_kernels.backend.INTERPRETED and isinstance(
    triton.language.standard.sum, InterpretedFunction
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def triton_installed() -> None:
    """Tests that force the Triton backend skip where triton is not installed."""
    if not pagedrl_kernels.backend.HAS_TRITON:
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


@pytest.fixture(scope="session")
def causal_lm_logprobs():
    """log_softmax of each completion token under one HF (or peft) forward over prompt + completion."""

    def logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)

    return logprobs


@pytest.fixture(scope="session")
def smollm2():
    """The real default model, in fp32 on every CPU, and its tokenizer, loaded once per test session. Tests
    must not modify it."""
    from rl.job.model_loading import load_model

    return load_model("smollm2_135m", dtype="float32")
