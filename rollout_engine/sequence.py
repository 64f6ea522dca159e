"""Per-sequence state shared by the block manager, the scheduler and the engine (no torch)."""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from rollout_engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """One token stream with its KV blocks.

    A request with n samples starts as one sequence that prefills the prompt; when the prompt is done
    it forks into n sequences sharing the prompt's blocks. Until then `rngs` holds the n samples'
    random streams (num_samples_at_next_token counts them); afterwards each sequence holds its own one. KV
    exists for token_ids[:num_computed_tokens]; the sequence needs token_ids[num_computed_tokens:] computed
    before it can sample its next token.
    """

    seq_id: int
    request_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    rngs: list[random.Random]
    sample_index: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    kv_policy_version: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    support: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_samples_at_next_token(self) -> int:
        """How many sequences this one becomes once it samples (n before the fork, then 1)."""
        return len(self.rngs)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def completion_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]
