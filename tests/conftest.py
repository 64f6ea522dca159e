"""Suite-wide settings: offline hub, offline W&B, the `gpu` tier, and the shared default model."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    # Triton decides at decoration time whether to interpret: set it before any kernel module is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


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
