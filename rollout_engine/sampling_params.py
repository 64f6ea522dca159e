"""Per-request sampling settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SamplingParams:
    """How to sample the `n` completions of one prompt.

    temperature=0 means greedy. top_k=-1 and top_p=1.0 disable those filters. Sample i of a request
    with seed s draws from its own generator seeded with s + i, so results do not depend on batching.
    stop_token_ids=None stops at the tokenizer's EOS; stop holds strings that end a completion.
    lora="policy" samples with the engine's LoRA adapter (ignored when it has none); None samples the base
    model, e.g. for a reference or an evaluation of the untrained model.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    stop: list[str] | None = None
    lora: str | None = "policy"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field and the accepted range."""
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"SamplingParams.n must be an int >= 1 (samples per prompt), got {self.n!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if isinstance(self.stop, str):
            raise ValueError("SamplingParams.stop must be a list of strings, e.g. stop=['</sql>']")
        if self.lora not in ("policy", None):
            raise ValueError(
                f"SamplingParams.lora must be 'policy' or None (the base model), got {self.lora!r}"
            )
