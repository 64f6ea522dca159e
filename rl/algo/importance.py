"""Importance-sampling correction for the gap between the rollout engine's policy and the trainer's.

The engine samples with its own kernels (and possibly stale weights), so its logprobs differ slightly from
the trainer's recomputed old logprobs. Weighting each token's policy loss by w = pi_old / pi_sampler
corrects the off-policy gap; a cap C bounds the variance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
# exp() of a larger log-ratio overflows; such ratios are far outside any clip range or cap anyway
MAX_LOG_RATIO = 20.0


@dataclass(slots=True)
class ISCorrection:
    """weights [B, T] (detached, 0 off the mask) and detached scalar diagnostics over the masked tokens."""

    weights: torch.Tensor
    logp_diff_mean: torch.Tensor  # mean |old - sampling| logprob
    logp_diff_max: torch.Tensor
    ratio_min: torch.Tensor  # of the corrected weights
    ratio_mean: torch.Tensor
    ratio_max: torch.Tensor

    def as_dict(self) -> dict[str, float]:
        """Metric names as logged."""
        return {
            "sampling/logp_difference/mean": self.logp_diff_mean.item(),
            "sampling/logp_difference/max": self.logp_diff_max.item(),
            "sampling/importance_ratio/min": self.ratio_min.item(),
            "sampling/importance_ratio/mean": self.ratio_mean.item(),
            "sampling/importance_ratio/max": self.ratio_max.item(),
        }


def importance_weights(
    old_logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_truncate",
    *,
    cap: float,
) -> ISCorrection:
    """Weights w = pi_old / pi_sampler for tensors [B, T], corrected by `mode`.

    token_truncate: min(w_t, C) per token. token_mask: w_t, or 0 where w_t > C.
    sequence_truncate / sequence_mask: the same on the sequence ratio prod_t w_t, shared by its tokens.
    Masked tokens keep their place in the loss normaliser; they just contribute nothing.
    """
    if mode not in IS_MODES:
        raise ValueError(f"unknown importance-sampling mode {mode!r}; choose one of {IS_MODES}")
    if cap <= 0.0:
        raise ValueError(f"importance-sampling cap must be > 0, got {cap}")
    if not (old_logprobs.shape == sampling_logprobs.shape == mask.shape) or mask.dim() != 2:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)}, sampling_logprobs {tuple(sampling_logprobs.shape)} "
            f"and mask {tuple(mask.shape)} must all be [B, T] with the same alignment"
        )
    mask = mask.bool()
    log_ratio = torch.where(mask, old_logprobs.detach() - sampling_logprobs.detach(), 0.0)  # [B, T]
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(mask)
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    if mode.endswith("truncate"):
        weights = ratio.clamp(max=cap)
    else:
        weights = torch.where(ratio > cap, 0.0, ratio)
    weights = torch.where(mask, weights, 0.0)
    num_tokens = mask.sum().clamp(min=1)
    logp_diff = torch.where(mask, (old_logprobs - sampling_logprobs).detach().abs(), 0.0)
    return ISCorrection(
        weights=weights,
        logp_diff_mean=logp_diff.sum() / num_tokens,
        logp_diff_max=logp_diff.max(),
        ratio_min=torch.where(mask, weights, torch.inf).min(),
        ratio_mean=weights.sum() / num_tokens,
        ratio_max=torch.where(mask, weights, -torch.inf).max(),
    )
