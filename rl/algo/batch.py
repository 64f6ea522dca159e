"""The rollout batch the trainer consumes, and the one alignment convention every per-token tensor follows.

Alignment: rows are prompt tokens, then completion tokens (policy samples interleaved with environment
observations in multi-turn episodes), then right padding. For every per-token tensor [B, T], position t
describes token input_ids[:, t]: logprobs[:, t] = log pi(input_ids[:, t] | input_ids[:, :t]), read from the
logits the model produced at position t-1. Position 0 has no prediction; it holds 0 and is never in the loss.
support_ids [B, T, W] follows it too: where a constraint chose the tokens input_ids[:, t] was sampled among
(`rollout_engine.constraints`), they are listed there, padded with -1, and that position's logprob is taken
under the softmax over them alone; a row of -1 means the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

PER_TOKEN_FIELDS = ("input_ids", "attention_mask", "loss_mask", "sampling_logprobs", "support_ids")
PER_ROW_FIELDS = ("advantages", "completion_lengths", "truncated")


@dataclass(slots=True)
class RolloutBatch:
    """B finished rollouts. advantages are one per row (flatten [num_prompts, G] row-major)."""

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] bool, false on padding
    loss_mask: torch.Tensor  # [B, T] bool, true only on policy-sampled completion tokens
    sampling_logprobs: torch.Tensor  # [B, T] float, the engine's logprob of each sampled token, 0 elsewhere
    advantages: torch.Tensor  # [B] float
    completion_lengths: torch.Tensor  # [B] long, completion tokens including environment observations
    truncated: torch.Tensor  # [B] bool, the completion hit the length limit without finishing
    support_ids: torch.Tensor | None = None  # [B, T, W] long, -1 padded; None: W = 0, no position constrained

    def __post_init__(self) -> None:
        self.attention_mask = self.attention_mask.bool()
        self.loss_mask = self.loss_mask.bool()
        self.truncated = self.truncated.bool()
        shape = tuple(self.input_ids.shape)
        if len(shape) != 2:
            raise ValueError(f"input_ids must be [B, T], got {shape}")
        if self.support_ids is None:
            self.support_ids = torch.empty(*shape, 0, dtype=torch.long, device=self.input_ids.device)
        for name in PER_TOKEN_FIELDS[1:]:
            if tuple(getattr(self, name).shape)[:2] != shape:
                got = tuple(getattr(self, name).shape)
                raise ValueError(f"{name} has shape {got} but input_ids has {shape}; align them as [B, T]")
        for name in PER_ROW_FIELDS:
            if tuple(getattr(self, name).shape) != shape[:1]:
                got = tuple(getattr(self, name).shape)
                raise ValueError(f"{name} has shape {got}; it needs one entry per row, shape ({shape[0]},)")
        if (self.loss_mask & ~self.attention_mask).any() or self.loss_mask[:, 0].any():
            raise ValueError(
                "loss_mask marks padding or position 0; it must cover only sampled completion tokens, "
                "which always follow at least one prompt token"
            )

    @property
    def num_sequences(self) -> int:
        return self.input_ids.size(0)

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The rows at indices `rows` [n], in that order, at full width."""
        return self._map(lambda t: t[rows], lambda t: t[rows])

    def rows(self, start: int, stop: int, device: torch.device | str | None = None) -> RolloutBatch:
        """Rows [start, stop) on `device`, with the columns past the last non-padding token cut off."""
        active_cols = self.attention_mask[start:stop].any(dim=0).nonzero()
        width = int(active_cols.max().item()) + 1 if active_cols.numel() else 1
        return self._map(lambda t: t[start:stop, :width].to(device), lambda t: t[start:stop].to(device))

    def _map(self, per_token, per_row) -> RolloutBatch:
        """A batch of per_token(t) for each [B, T] field and per_row(t) for each [B] field."""
        return RolloutBatch(
            **{name: per_token(getattr(self, name)) for name in PER_TOKEN_FIELDS},
            **{name: per_row(getattr(self, name)) for name in PER_ROW_FIELDS},
        )


def collate_rollouts(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    completion_logprobs: Sequence[Sequence[float]],
    advantages: torch.Tensor,
    truncated: Sequence[bool],
    pad_token_id: int,
    completion_masks: Sequence[Sequence[int]] | None = None,
    completion_supports: Sequence[Sequence[Sequence[int]]] | None = None,
) -> RolloutBatch:
    """Right-pad token lists into a RolloutBatch.

    completion_logprobs[i][j] is the engine's logprob of completion_ids[i][j]; completion_masks[i][j] is 0
    for environment-observation tokens (default: all completion tokens are policy samples);
    completion_supports[i][j] the tokens completion_ids[i][j] was sampled among where a constraint chose them
    (empty: the whole vocabulary, the default).
    """
    if not (len(prompt_ids) == len(completion_ids) == len(completion_logprobs) == len(truncated)):
        raise ValueError(
            "prompt_ids, completion_ids, completion_logprobs and truncated need one entry per row"
        )
    masks = completion_masks or [[1] * len(c) for c in completion_ids]
    supports = completion_supports or [[()] * len(c) for c in completion_ids]
    width = max(len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True))
    batch_size = len(prompt_ids)
    input_ids = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    loss_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    sampling_logprobs = torch.zeros(batch_size, width)
    widest = max((len(ids) for row in supports for ids in row), default=0)
    support_ids = torch.full((batch_size, width, widest), -1, dtype=torch.long)
    for i, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        if not prompt or not len(completion_logprobs[i]) == len(masks[i]) == len(supports[i]) == len(
            completion
        ):
            raise ValueError(
                f"row {i}: need a non-empty prompt, and one logprob, one mask and one support entry per "
                "completion token"
            )
        start, stop = len(prompt), len(prompt) + len(completion)
        input_ids[i, :stop] = torch.tensor([*prompt, *completion], dtype=torch.long)
        attention_mask[i, :stop] = True
        loss_mask[i, start:stop] = torch.tensor(masks[i], dtype=torch.bool)
        sampling_logprobs[i, start:stop] = torch.tensor(completion_logprobs[i], dtype=torch.float32)
        for j, ids in enumerate(supports[i]):
            if ids:
                support_ids[i, start + j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        sampling_logprobs=sampling_logprobs,
        advantages=advantages.reshape(-1).float(),
        completion_lengths=torch.tensor([len(c) for c in completion_ids], dtype=torch.long),
        truncated=torch.tensor(list(truncated), dtype=torch.bool),
        support_ids=support_ids,
    )


def to_rollout_batch(
    groups: Sequence[Sequence[Any]], advantages: torch.Tensor, pad_token_id: int
) -> RolloutBatch:
    """The padded batch of played groups' episodes (`rl.rollout.play.Trajectory`), with their advantages
    [num_prompts, G]."""
    flat = [t for group in groups for t in group]
    return collate_rollouts(
        prompt_ids=[t.prompt_ids for t in flat],
        completion_ids=[t.completion_ids for t in flat],
        completion_logprobs=[t.logprobs for t in flat],
        advantages=advantages,
        truncated=[t.truncated for t in flat],
        pad_token_id=pad_token_id,
        completion_masks=[t.completion_mask for t in flat],
        completion_supports=[t.supports for t in flat],
    )
