"""Clipped policy-gradient loss: token or sequence (GSPO) ratios, dual-clip, KL penalty, aggregation modes.

All per-token tensors are [B, T] and aligned as described in `rl.batch`; `mask` is true on the tokens the
policy sampled. Values at masked-out positions never reach the loss or its gradient, whatever they hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")
KL_ESTIMATORS = ("k1", "k2", "k3")
# exp() of a larger log-ratio overflows; such ratios are far outside any clip range anyway
MAX_LOG_RATIO = 20.0


@dataclass(slots=True)
class LossStats:
    """Detached scalar tensors (no host sync until `as_dict`); token means unless noted."""

    loss: torch.Tensor
    policy_loss: torch.Tensor  # aggregated like the loss, without the KL term
    kl: torch.Tensor
    entropy: torch.Tensor | None
    clip_low: torch.Tensor  # ratio < 1 - eps_low with A < 0: the clip removed the gradient
    clip_high: torch.Tensor  # ratio > 1 + eps_high with A > 0
    clip_region: torch.Tensor
    clip_dual: torch.Tensor  # ratio > c with A < 0 (dual-clip)
    ratio_mean: torch.Tensor
    num_tokens: torch.Tensor

    def as_dict(self) -> dict[str, float]:
        """Metric names as logged."""
        out = {
            "loss": self.loss.item(),
            "policy_loss": self.policy_loss.item(),
            "kl": self.kl.item(),
            "clip_ratio/low_mean": self.clip_low.item(),
            "clip_ratio/high_mean": self.clip_high.item(),
            "clip_ratio/region_mean": self.clip_region.item(),
            "clip_ratio/dual_mean": self.clip_dual.item(),
            "ratio_mean": self.ratio_mean.item(),
            "num_tokens": self.num_tokens.item(),
        }
        if self.entropy is not None:
            out["entropy"] = self.entropy.item()
        return out


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman's k1, k2, k3).

    With log_r = ref_logprobs - logprobs: k1 = -log_r, k2 = log_r^2 / 2, k3 = exp(log_r) - log_r - 1 (>= 0).
    k1 and k3 are unbiased; k2 is biased but low-variance.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of {KL_ESTIMATORS}")
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    # expm1 keeps k3 exact and >= 0 for tiny log_r, where exp(x) - 1 cancels to rounding noise
    return torch.expm1(log_r) - log_r


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values [B, T] over true entries of mask [B, T]; 0 when the mask is empty."""
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_completion_length: int | None = None
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    grpo: mean over each sequence's tokens, then mean over sequences. bnpo: sum over tokens / active tokens
    in this (micro-)batch. dapo: the same token mean, meant over the global batch (the trainer weighs
    micro-batches by their token share). dr_grpo: sum over tokens / (B * max_completion_length).
    """
    summed = torch.where(mask, per_token, 0.0)
    if loss_type == "grpo":
        return (summed.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    if loss_type in ("bnpo", "dapo"):
        return summed.sum() / mask.sum().clamp(min=1)
    return summed.sum() / (mask.size(0) * max_completion_length)


def _check_shapes(logprobs: torch.Tensor, advantages: torch.Tensor, same_shape: dict) -> None:
    for name, tensor in same_shape.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but logprobs has {tuple(logprobs.shape)}; "
                "all per-token tensors must be [B, T] with the same alignment"
            )
    if logprobs.dim() != 2 or advantages.shape != (logprobs.size(0),):
        raise ValueError(
            f"expected logprobs [B, T] and advantages [B], got {tuple(logprobs.shape)} and "
            f"{tuple(advantages.shape)}; flatten group advantages with advantages.view(-1)"
        )


def check_loss_args(
    *, loss_type: str, eps_low: float, eps_high: float, dual_clip_c: float | None, beta: float,
    kl_estimator: str, max_completion_length: int | None,
) -> None:  # fmt: skip
    """Raise ValueError naming the bad hyper-parameter and the fix."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown loss_type {loss_type!r}; choose one of {LOSS_TYPES}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {kl_estimator!r}; choose one of {KL_ESTIMATORS}")
    if not (0.0 <= eps_low < 1.0 and eps_high >= 0.0):
        raise ValueError(
            f"need 0 <= eps_low < 1 and eps_high >= 0, got eps_low={eps_low}, eps_high={eps_high}"
        )
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (typically 3), got {dual_clip_c}; use None to disable it")
    if beta < 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if loss_type == "dr_grpo" and (max_completion_length is None or max_completion_length <= 0):
        raise ValueError(
            "loss_type='dr_grpo' divides by B * max_completion_length; pass max_completion_length "
            f"(the generation length limit), got {max_completion_length}"
        )


def _ratio(logprobs, old_logprobs, mask, gspo: bool) -> torch.Tensor:
    log_ratio = logprobs - old_logprobs
    if gspo:
        # GSPO: one ratio per sequence, the geometric mean of its token ratios, shared by all its tokens
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
        log_ratio = seq_log_ratio.expand_as(logprobs)
    return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(r*A, clip(r, 1-eps_low, 1+eps_high)*A) for ratio [B, T], adv [B, 1], capped at -c*A where A < 0.

    Returns the per-token loss [B, T] and where the dual-clip cap applied [B, T].
    """
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))
    if dual_clip_c is None:
        return per_token, torch.zeros_like(per_token, dtype=torch.bool)
    is_dual = (adv < 0) & (per_token > -adv * dual_clip_c)
    return torch.where(is_dual, -adv * dual_clip_c, per_token), is_dual


def compute_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "grpo",
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip_c: float | None = None,
    gspo: bool = False,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    max_completion_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Clipped surrogate -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A) per token, plus beta * KL, aggregated.

    logprobs (with grad), old_logprobs, mask, ref_logprobs, is_weights, entropy: [B, T]; advantages: [B].
    r = exp(logprobs - old_logprobs) per token, or per sequence with `gspo`. `dual_clip_c` caps the loss of
    negative-advantage tokens at -c*A. `is_weights` (see `rl.importance`) multiply the policy term only.
    """
    check_loss_args(
        loss_type=loss_type, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c, beta=beta,
        kl_estimator=kl_estimator, max_completion_length=max_completion_length,
    )  # fmt: skip
    same_shape = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs,
                  "is_weights": is_weights, "entropy": entropy}  # fmt: skip
    _check_shapes(logprobs, advantages, same_shape)
    if beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs; pass the reference model's logprobs or set beta=0")
    mask = mask.bool()
    # zero the masked-out positions first, so padding garbage (even inf) cannot leak NaN into the gradient
    logprobs = torch.where(mask, logprobs, 0.0)
    old_logprobs = torch.where(mask, old_logprobs.detach(), 0.0)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    ratio = _ratio(logprobs, old_logprobs, mask, gspo)
    per_token, is_dual = clipped_surrogate(ratio, adv, eps_low, eps_high, dual_clip_c)
    if is_weights is not None:
        per_token = per_token * torch.where(mask, is_weights.detach(), 0.0)
    policy_loss = aggregate(per_token, mask, loss_type, max_completion_length)
    kl = torch.zeros((), device=logprobs.device)
    loss = policy_loss
    if ref_logprobs is not None:
        per_token_kl = kl_estimate(logprobs, torch.where(mask, ref_logprobs.detach(), 0.0), kl_estimator)
        kl = masked_mean(per_token_kl.detach(), mask)
        if beta > 0.0:
            loss = aggregate(per_token + beta * per_token_kl, mask, loss_type, max_completion_length)
    ratio = ratio.detach()
    is_low = (ratio < 1.0 - eps_low) & (adv < 0)
    is_high = (ratio > 1.0 + eps_high) & (adv > 0)
    stats = LossStats(
        loss=loss.detach(),
        policy_loss=policy_loss.detach(),
        kl=kl,
        entropy=None if entropy is None else masked_mean(entropy.detach(), mask),
        clip_low=masked_mean(is_low.float(), mask),
        clip_high=masked_mean(is_high.float(), mask),
        clip_region=masked_mean((is_low | is_high).float(), mask),
        clip_dual=masked_mean(is_dual.float(), mask),
        ratio_mean=masked_mean(ratio, mask),
        num_tokens=mask.sum(),
    )
    return loss, stats
