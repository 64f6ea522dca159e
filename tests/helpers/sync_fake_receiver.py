"""Engine stand-ins for the weight-sync tests: receivers that own LoRA buffers named like the engine's."""

from __future__ import annotations

import time

import torch

from rl.sync.transport import TensorSpec

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class BufferEngine:
    """A plain holder of zero-filled LoRA buffers; requests return copies of the buffers and the version."""

    def __init__(self, specs: dict[str, TensorSpec], device: str = "cpu"):
        self.buffers = {n: torch.zeros(s.shape, dtype=s.dtype, device=device) for n, s in specs.items()}
        self.version = -1

    def lora_buffers(self) -> dict[str, torch.Tensor]:
        return self.buffers

    def set_lora_version(self, version: int) -> None:
        if version == 13:
            raise SystemExit(3)  # a worker that dies in the middle of a sync
        self.version = version

    def handle(self, request: str):
        """The version and host copies of the buffers (a CUDA tensor would cross the pipe as a handle to
        memory this process frees)."""
        return self.version, {name: t.to("cpu", copy=True) for name, t in self.buffers.items()}


def tiny_llama(seed: int = 0):
    from tests.helpers.tiny_models import tiny_config, tiny_model

    config = tiny_config(
        "llama", vocab_size=96, hidden_size=64, intermediate_size=112, max_position_embeddings=64
    )
    return tiny_model(config, seed).eval()


def token_logprobs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-probability of each next token under ``model``: [batch, seq - 1]."""
    with torch.no_grad():
        logits = model(input_ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


class PeftEngine:
    """A peft copy of the trainer's model whose LoRA parameters are the receiver's buffers."""

    def __init__(self, base_state: dict[str, torch.Tensor], rank: int, alpha: float, targets: list[str]):
        from rl.sync.adapter import add_lora, lora_tensors

        base = tiny_llama(seed=12345)
        base.load_state_dict(base_state)
        self.model = add_lora(base, rank=rank, alpha=alpha, target_modules=targets).eval()
        self.buffers = lora_tensors(self.model)
        self.version = -1

    def lora_buffers(self) -> dict[str, torch.Tensor]:
        return self.buffers

    def set_lora_version(self, version: int) -> None:
        self.version = version

    def handle(self, request: str | torch.Tensor):
        """``"weights"``: copies of the buffers; a [batch, seq] tensor of token ids: their logprobs."""
        if isinstance(request, str):
            return self.version, {name: t.clone() for name, t in self.buffers.items()}
        return self.version, token_logprobs(self.model, request)


def build_failing_engine() -> BufferEngine:
    raise ValueError("no model file at /nonexistent/model.gguf")


def build_stuck_engine() -> BufferEngine:
    time.sleep(600)
    raise AssertionError("unreachable: the trainer stops a worker that never gets ready")
