"""`rollout.placement=process`: the engine lives in a rollout-worker process fed by `DistributedSync`.

The worker loads its own copy of the model with the same LoRA layout; the trainer's LoRA tensors reach its
engine over torch.distributed after every step, and prompts and results travel over the sync's pipe.
`RemoteEngine` gives the trainer the same `generate` / `stats` surface as a colocated engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rl.job.model_loading import load_model
from rl.sync.adapter import add_lora
from rl.sync.transport import DistributedSync
from rollout_engine import LLMEngine


class EngineWorker:
    """The worker-side receiver: an engine over a freshly loaded model with the trainer's LoRA layout."""

    def __init__(
        self,
        model_kwargs: Mapping[str, Any],
        lora_kwargs: Mapping[str, Any],
        engine_kwargs: Mapping[str, Any],
    ) -> None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
        model, tokenizer = load_model(**model_kwargs)
        self.engine = LLMEngine(add_lora(model, **lora_kwargs), tokenizer, **engine_kwargs)

    def lora_buffers(self) -> Mapping[str, torch.Tensor]:
        return self.engine.lora_buffers()

    def set_lora_version(self, version: int) -> None:
        self.engine.set_lora_version(version)

    def handle(self, request: tuple) -> Any:
        kind, *args = request
        if kind == "generate":
            return self.engine.generate(*args)
        if kind == "stats":
            return self.engine.stats()
        raise ValueError(f"unknown rollout-worker request {kind!r}; expected 'generate' or 'stats'")


def build_worker(model_kwargs, lora_kwargs, engine_kwargs) -> EngineWorker:
    """Picklable factory run inside the worker process."""
    return EngineWorker(model_kwargs, lora_kwargs, engine_kwargs)


class RemoteEngine:
    """The trainer-side stand-in for an engine in the rollout worker."""

    def __init__(self, sync: DistributedSync) -> None:
        self.sync = sync

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        params: Any,
        on_finished: Callable[[int], None] | None = None,
    ) -> list[Any]:
        """The worker's results; ``on_finished(i)`` hears of every prompt once the whole call is back (the
        pipe returns results only at the end of a call)."""
        results = self.sync.call(("generate", prompt_token_ids, params))
        if on_finished is not None:
            for i in range(len(results)):
                on_finished(i)
        return results

    def stats(self) -> dict[str, int]:
        return self.sync.call(("stats",))
