"""Typed statistics of one optimisation step, and how micro-batch loss statistics combine."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rl.algo.losses import LossStats


@dataclass(slots=True)
class CompletionStats:
    """Completion lengths in tokens; `terminated_*` count only completions that finished (0 if none did)."""

    mean_length: float
    min_length: float
    max_length: float
    mean_terminated_length: float
    min_terminated_length: float
    max_terminated_length: float
    clipped_ratio: float  # share of completions truncated at the length limit

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor, truncated: torch.Tensor) -> CompletionStats:
        """Summarise lengths [B] and truncation flags [B]."""
        lengths = lengths.float()
        done = lengths[~truncated.bool()]
        return cls(
            mean_length=lengths.mean().item(),
            min_length=lengths.min().item(),
            max_length=lengths.max().item(),
            mean_terminated_length=done.mean().item() if done.numel() else 0.0,
            min_terminated_length=done.min().item() if done.numel() else 0.0,
            max_terminated_length=done.max().item() if done.numel() else 0.0,
            clipped_ratio=truncated.float().mean().item(),
        )


@dataclass(slots=True)
class StepStats:
    """Everything one `train_step` logs. Loss metrics are means over its num_iterations passes."""

    loss: LossStats
    grad_norm: float  # before clipping, mean over the optimizer steps
    lr: float  # of the last optimizer step
    num_tokens: int  # tokens in the loss per pass
    num_optimizer_steps: int
    num_skipped_steps: int  # steps dropped for a non-finite loss or gradient
    num_rows_skipped: int  # rows left out of the forward and backward: their gradient is 0 (rows_that_train)
    completions: CompletionStats
    sampling: dict[str, float]  # ISCorrection.as_dict() names: the sampler/trainer logprob mismatch
    anchor_nll: float | None = None  # the anchor demonstrations' NLL (train_step's anchor), mean over passes
    update_norm: float = 0.0  # the L2 norm of the step's change to the trained weights, over all its passes
    # with an anchor: the policy-gradient and anchor gradient norms apart, before clipping, mean over passes
    split_grad_norms: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, float]:
        """Flat metric names for the logger."""
        out = self.loss.as_dict()
        out.update(
            grad_norm=self.grad_norm,
            lr=self.lr,
            num_tokens=float(self.num_tokens),
            num_skipped_steps=float(self.num_skipped_steps),
            num_rows_skipped=float(self.num_rows_skipped),
            update_norm=self.update_norm,
        )
        for name in CompletionStats.__slots__:
            out[f"completions/{name}"] = getattr(self.completions, name)
        out.update(self.sampling)
        if self.anchor_nll is not None:
            out["anchor/nll"] = self.anchor_nll
        if self.split_grad_norms is not None:
            out["grad_norm/policy"], out["grad_norm/anchor"] = self.split_grad_norms
        return out


def combine_loss_stats(
    parts: list[tuple[LossStats, torch.Tensor | float]], total_tokens: torch.Tensor
) -> LossStats:
    """Whole-batch stats from micro-batch (stats, loss weight) pairs.

    Losses add up with the weights their loss type's aggregation gave them (`rl.algo.aggregation`), as their
    gradients did; token means are re-weighted by token count, whatever the loss type.
    """
    share = [stats.num_tokens / total_tokens.clamp(min=1) for stats, _ in parts]

    def token_mean(name: str) -> torch.Tensor:
        return sum(getattr(stats, name) * s for (stats, _), s in zip(parts, share, strict=True))

    has_entropy = parts[0][0].entropy is not None
    return LossStats(
        loss=sum(stats.loss * weight for stats, weight in parts),
        policy_loss=sum(stats.policy_loss * weight for stats, weight in parts),
        kl=token_mean("kl"),
        entropy=token_mean("entropy") if has_entropy else None,
        clip_low=token_mean("clip_low"),
        clip_high=token_mean("clip_high"),
        clip_region=token_mean("clip_region"),
        clip_dual=token_mean("clip_dual"),
        ratio_mean=token_mean("ratio_mean"),
        num_tokens=total_tokens,
    )


def mean_loss_stats(passes: list[LossStats]) -> LossStats:
    """Field-wise mean of the stats of repeated passes over the same batch (same num_tokens)."""

    def mean(name: str) -> torch.Tensor | None:
        values = [getattr(stats, name) for stats in passes]
        return None if values[0] is None else sum(values) / len(values)

    means = {field.name: mean(field.name) for field in dataclasses.fields(LossStats)}
    return LossStats(**{**means, "num_tokens": passes[0].num_tokens})
