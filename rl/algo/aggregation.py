"""What a loss type means: how per-token losses become one number, and how micro-batches add up.

Each loss type is one aggregation. ``reduce`` turns a (micro-)batch's per-token loss [B, T] into a scalar;
``weight`` is the factor that turns a micro-batch's reduced loss into its share of the whole batch's, so
that gradients (and the loss statistics, `rl.algo.step_stats.combine_loss_stats`) accumulated over
micro-batches equal one pass over the batch. Under DDP the batch counts are the means over the ranks, which
makes the averaged gradients those of the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from rl.settings import ConfigError, choices


class Aggregation(Protocol):
    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The loss of per-token losses [B, T] over the true entries of mask [B, T]."""

    def weight(
        self, mask: torch.Tensor, counts: torch.Tensor, num_micro_batches: int
    ) -> torch.Tensor | float:
        """The share of a micro-batch (its loss mask [b, T]) in the batch; counts: [num_sequences,
        num_tokens] of the batch."""

    @property
    def rows_add_up(self) -> bool:
        """Whether the batch's loss is a sum of per-row terms, whatever rows share a micro-batch: then a row
        whose term is zero can be left out of every micro-batch without changing the loss or gradient."""


def _masked(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, per_token, 0.0)


@dataclass(frozen=True, slots=True)
class SequenceMean:
    """grpo: the mean over each sequence's tokens, then the mean over sequences."""

    rows_add_up = True

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (_masked(per_token, mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()

    def weight(self, mask: torch.Tensor, counts: torch.Tensor, num_micro_batches: int) -> torch.Tensor:
        return mask.size(0) / counts[0]


@dataclass(frozen=True, slots=True)
class TokenMean:
    """The sum over tokens / the active tokens. bnpo (`over_batch` false): of each micro-batch, and the
    micro-batches count alike. dapo (`over_batch` true): of the whole batch, each micro-batch weighed by
    its share of the tokens."""

    over_batch: bool

    @property
    def rows_add_up(self) -> bool:
        return self.over_batch  # bnpo's micro-batch means count every row of their micro-batch

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _masked(per_token, mask).sum() / mask.sum().clamp(min=1)

    def weight(self, mask: torch.Tensor, counts: torch.Tensor, num_micro_batches: int):
        return mask.sum() / counts[1].clamp(min=1) if self.over_batch else 1.0 / num_micro_batches


@dataclass(frozen=True, slots=True)
class FixedLengthSum:
    """dr_grpo: the sum over tokens / (B * max_completion_length), which has no length bias."""

    max_completion_length: int | None
    rows_add_up = True

    def __post_init__(self) -> None:
        if self.max_completion_length is None or self.max_completion_length <= 0:
            raise ConfigError(
                "loss_type='dr_grpo' divides by B * max_completion_length; pass max_completion_length "
                f"(the generation length limit), got {self.max_completion_length}"
            )

    def reduce(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _masked(per_token, mask).sum() / (mask.size(0) * self.max_completion_length)

    def weight(self, mask: torch.Tensor, counts: torch.Tensor, num_micro_batches: int) -> torch.Tensor:
        return mask.size(0) / counts[0]


# loss type -> its aggregation, built from the generation length limit (only dr_grpo uses it)
AGGREGATIONS: dict[str, Callable[[int | None], Aggregation]] = {
    "grpo": lambda max_completion_length: SequenceMean(),
    "bnpo": lambda max_completion_length: TokenMean(over_batch=False),
    "dapo": lambda max_completion_length: TokenMean(over_batch=True),
    "dr_grpo": FixedLengthSum,
}
LOSS_TYPES = tuple(AGGREGATIONS)
LossType = choices("LossType", LOSS_TYPES)


def aggregation(loss_type: str, max_completion_length: int | None = None) -> Aggregation:
    """The aggregation of `loss_type` (one of LOSS_TYPES)."""
    return AGGREGATIONS[loss_type](max_completion_length)
