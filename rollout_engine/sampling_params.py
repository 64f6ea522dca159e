"""Per-request sampling settings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Below this a temperature is greedy in all but name, and logits / T overflow fp32 long before T reaches
# fp32's smallest values (T = 1e-40 turns the softmax into NaN). vLLM treats T < 1e-5 as greedy.
MIN_TEMPERATURE = 1e-5
# The most alternatives a sampled token's logprob may come with (OpenAI's own cap on top_logprobs).
MAX_TOP_LOGPROBS = 20


class SamplingParamsError(ValueError):
    """A sampling setting the engine cannot take: `field` names it, `problem` says what it accepts."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"SamplingParams.{field} {problem}")
        self.field = field
        self.problem = problem


@dataclass(slots=True)
class SamplingParams:
    """How to sample the `n` completions of one prompt.

    temperature=0 means greedy. top_k=-1 and top_p=1.0 disable those filters. Sample i of a request
    with seed s draws from its own generator seeded with s + i, so results do not depend on batching.
    stop_token_ids=None stops at the tokenizer's EOS; stop holds strings that end a completion.
    lora="policy" samples with the engine's LoRA adapter (ignored when it has none); None samples the base
    model, e.g. for a reference or an evaluation of the untrained model. top_logprobs=k returns, with each
    sampled token, the k most likely tokens at its position and their logprobs (0: the sampled token's alone).
    constraint: an object whose accepts(text, start) vetoes tokens (rollout_engine.constraints), e.g. the SQL
    envs' schema names (envs.sql.schema_constraint); it needs the engine's tokenizer.
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
    top_logprobs: int = 0
    constraint: Any = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise SamplingParamsError (a ValueError) naming the bad field and the values it accepts (bools are
        not ints here)."""
        _require(is_plain_int(self.n) and self.n >= 1, "n", "an int >= 1 (samples per prompt)", self.n)
        _require(
            _is_real(self.temperature)
            and (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf),
            "temperature",
            f"0 (greedy) or a finite number >= {MIN_TEMPERATURE}",
            self.temperature,
        )
        _require(
            _is_real(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1] (1 disables it)", self.top_p
        )
        _require(
            is_plain_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1),
            "top_k",
            "-1 (disabled) or an int >= 1",
            self.top_k,
        )
        _require(
            is_plain_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            "an int >= 1",
            self.max_tokens,
        )
        _require(
            self.seed is None or is_plain_int(self.seed),
            "seed",
            "an int, or None for a random one",
            self.seed,
        )
        _require(
            self.stop_token_ids is None or _is_list_of(self.stop_token_ids, is_plain_int),
            "stop_token_ids",
            "a list of token ids (ints), [] for none, or None for the tokenizer's EOS",
            self.stop_token_ids,
        )
        _require(
            self.stop is None or _is_list_of(self.stop, lambda s: isinstance(s, str) and s != ""),
            "stop",
            "a list of non-empty strings, e.g. stop=['</sql>'], or None",
            self.stop,
        )
        _require(self.lora in ("policy", None), "lora", "'policy' or None (the base model)", self.lora)
        _require(
            is_plain_int(self.top_logprobs) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
            "top_logprobs",
            f"an int in [0, {MAX_TOP_LOGPROBS}] (alternatives returned per sampled token)",
            self.top_logprobs,
        )
        _require(
            self.constraint is None or callable(getattr(self.constraint, "accepts", None)),
            "constraint",
            "None or an object with accepts(text, start) -> bool (rollout_engine.constraints.Constraint)",
            self.constraint,
        )


def is_plain_int(value) -> bool:
    """An int that is not a bool (True would pass for 1 otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_list_of(value, is_item) -> bool:
    return isinstance(value, (list, tuple)) and all(is_item(item) for item in value)


def _require(ok: bool, field: str, accepted: str, value) -> None:
    if not ok:
        raise SamplingParamsError(field, f"must be {accepted}, got {value!r}")
