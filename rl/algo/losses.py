"""The policy-gradient loss and its settings: the PPO clip (dual-clip), CISPO or SAPO on token or sequence
(GSPO) ratios, plus a KL penalty.

All per-token tensors are [B, T] and aligned as described in `rl.algo.batch`; `mask` is true on the tokens the
policy sampled. Values at masked-out positions never reach the loss or its gradient, whatever they hold.
The loss type's aggregation (`rl.algo.aggregation`) turns the per-token loss into one number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from rl.algo.aggregation import LossType, aggregation
from rl.algo.importance import IS_MODES, MAX_LOG_RATIO
from rl.algo.objectives import POLICY_LOSSES, cispo_surrogate, clipped_surrogate, sapo_surrogate
from rl.settings import Settings, at_least, choice, choices, number, optional, positive, refuse

KL_ESTIMATORS = ("k1", "k2", "k3")
KLEstimator = choices("KLEstimator", KL_ESTIMATORS)
# what the KL penalty is taken against: the base model (the adapter disabled), or the adapter as the GRPO
# stage began (the warm start's end, or the checkpoint= the run started from)
KLReference = choices("KLReference", ("base", "start"))
PolicyLoss = choices("PolicyLoss", POLICY_LOSSES)
ISMode = choices("ISMode", ("none", *IS_MODES))


def combination_problems(values: Any, prefix: str = "") -> list[str]:
    """What LossConfig.RULES, one key at a time, cannot see: settings that do not go together, named as
    `rule_problems` names them. `values`: a LossConfig, or the algo.* config node (read by attribute)."""
    policy_loss = PolicyLoss(values.policy_loss).value
    if policy_loss != "clip" and values.dual_clip_c is not None:
        return [
            f"{prefix}dual_clip_c={values.dual_clip_c!r}: dual-clip caps the loss of the PPO clip, which "
            f"policy_loss={policy_loss!r} does not use (cispo caps the IS weight at 1 + cispo_eps_high, and "
            "sapo's gate is bounded by 4 / tau); leave it unset (algo.dual_clip_c=null)"
        ]
    return []


@dataclass
class LossConfig(Settings):
    """How a step turns a rollout batch into an update: the algo.* keys that `rl.algo.trainer.train_step`
    reads.

    It is the schema of those keys (`rl.config.schema.AlgoConfig` extends it) and the value train_step takes.
    Built in Python, it checks itself with its rules (those `rl.config.checks` applies to the algo.*
    keys); the choices may be given as strings (``LossConfig(loss_type="dapo")``).
    """

    RULES = (  # what a type cannot say about these settings (rl.config.checks: as algo.*)
        ("eps_low", lambda v: number(v) and 0 <= v < 1, "use a number with 0 <= eps_low < 1"),
        ("eps_high", at_least(0), "use a finite number >= 0"),
        (
            "dual_clip_c",
            optional(lambda v: number(v) and 1 < v < math.inf),
            "dual_clip_c must be > 1 (typically 3); use None (null) to disable it",
        ),
        ("beta", at_least(0), "use a finite number >= 0"),
        ("num_iterations", at_least(1), "use an integer >= 1"),
        ("is_cap", positive, "use a finite number > 0"),
        (
            "cispo_eps_high",
            at_least(0),
            "use a finite number >= 0 (CISPO caps the IS weight at 1 + cispo_eps_high; TRL's "
            "epsilon_high=5.0 for loss_type='cispo' is cispo_eps_high=4.0)",
        ),
        ("sapo_tau_pos", positive, "use a finite number > 0 (the SAPO paper uses 1.0)"),
        ("sapo_tau_neg", positive, "use a finite number > 0 (the SAPO paper uses 1.05)"),
    )

    loss_type: LossType = LossType.grpo  # the aggregation (rl.algo.aggregation)
    policy_loss: PolicyLoss = PolicyLoss.clip  # the per-token objective: clip, cispo or sapo
    eps_low: float = 0.2  # clip: clip the ratio to [1 - eps_low, 1 + eps_high]
    eps_high: float = 0.2
    dual_clip_c: float | None = None  # clip: cap the loss of negative-advantage tokens at -c * A
    cispo_eps_high: float = 4.0  # cispo: cap the stop-gradient IS weight at 1 + cispo_eps_high
    sapo_tau_pos: float = 1.0  # sapo: the gate's temperature where A > 0
    sapo_tau_neg: float = 1.05  # sapo: where A <= 0
    gspo: bool = False  # one length-normalised ratio per sequence
    beta: float = 0.0  # weight of the KL penalty against kl_reference
    kl_estimator: KLEstimator = KLEstimator.k3
    kl_reference: KLReference = KLReference.base
    num_iterations: int = 1  # optimizer steps over each batch (mu)
    # importance-sampling correction of the sampler's logprobs (rl.algo.importance)
    is_mode: ISMode = ISMode.none
    is_cap: float = 3.0
    mask_truncated_completions: bool = False  # no loss on completions cut off at the length limit

    def __post_init__(self) -> None:
        self.loss_type = choice(LossType, self.loss_type, "loss_type")
        self.policy_loss = choice(PolicyLoss, self.policy_loss, "policy_loss")
        self.kl_estimator = choice(KLEstimator, self.kl_estimator, "kl_estimator")
        self.kl_reference = choice(KLReference, self.kl_reference, "kl_reference")
        self.is_mode = choice(ISMode, self.is_mode, "is_mode")
        refuse(self.problems(self))

    @classmethod
    def problems(cls, values: Any, prefix: str = "") -> list[str]:
        """RULES, then the settings that do not go together (`combination_problems`)."""
        return super().problems(values, prefix) + combination_problems(values, prefix)


@dataclass(slots=True)
class LossStats:
    """Detached scalar tensors (no host sync until `as_dict`); token means unless noted."""

    loss: torch.Tensor
    policy_loss: torch.Tensor  # aggregated like the loss, without the KL term
    kl: torch.Tensor
    entropy: torch.Tensor | None
    clip_low: torch.Tensor  # ratio < 1 - eps_low with A < 0: the clip removed the gradient
    clip_high: torch.Tensor  # ratio > 1 + eps_high with A > 0; cispo: its IS weight capped, any A
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


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman's k1, k2, k3).

    With log_r = ref_logprobs - logprobs: k1 = -log_r, k2 = log_r^2 / 2, k3 = exp(log_r) - log_r - 1 (>= 0).
    k1 and k3 are unbiased; k2 is biased but low-variance.
    """
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        # expm1 keeps k3 exact and >= 0 for tiny log_r, where exp(x) - 1 cancels to rounding noise
        return torch.expm1(log_r) - log_r
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of {KL_ESTIMATORS}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values [B, T] over true entries of mask [B, T]; 0 when the mask is empty."""
    return torch.where(mask, values, 0.0).sum() / mask.sum().clamp(min=1)


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


def _ratio(logprobs, old_logprobs, mask, gspo: bool) -> torch.Tensor:
    log_ratio = logprobs - old_logprobs
    if gspo:
        # GSPO: one ratio per sequence, the geometric mean of its token ratios, shared by all its tokens
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)
        log_ratio = seq_log_ratio.expand_as(logprobs)
    return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


class PolicyTerm(NamedTuple):
    """A per-token objective's loss [B, T] and where its clip acted [B, T] (bool), for LossStats."""

    per_token: torch.Tensor
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    clip_dual: torch.Tensor


def policy_term(
    logprobs: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, loss: LossConfig
) -> PolicyTerm:
    """The per-token policy loss of `loss.policy_loss` for logprobs, ratio [B, T] and adv [B, 1]."""
    none = torch.zeros_like(ratio, dtype=torch.bool)
    if loss.policy_loss == "cispo":
        capped = ratio.detach() > 1.0 + loss.cispo_eps_high  # the weight is capped, the gradient kept
        return PolicyTerm(cispo_surrogate(logprobs, ratio, adv, loss.cispo_eps_high), none, capped, none)
    if loss.policy_loss == "sapo":  # nothing is clipped
        return PolicyTerm(sapo_surrogate(ratio, adv, loss.sapo_tau_pos, loss.sapo_tau_neg), none, none, none)
    per_token, is_dual = clipped_surrogate(ratio, adv, loss.eps_low, loss.eps_high, loss.dual_clip_c)
    r = ratio.detach()
    is_low = (r < 1.0 - loss.eps_low) & (adv < 0)
    is_high = (r > 1.0 + loss.eps_high) & (adv > 0)
    return PolicyTerm(per_token, is_low, is_high, is_dual)


def compute_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    loss: LossConfig,
    *,
    max_completion_length: int | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The policy loss of `loss.policy_loss` per token, plus beta * KL, aggregated by `loss.loss_type`.

    clip: -min(r*A, clip(r, 1-eps_low, 1+eps_high)*A), where `loss.dual_clip_c` caps the loss of
    negative-advantage tokens at -c*A; cispo: -sg(min(r, 1+cispo_eps_high)) * A * log pi (`cispo_surrogate`);
    sapo: -f(r) * A with SAPO's soft gate f (`sapo_surrogate`).
    logprobs (with grad), old_logprobs, mask, ref_logprobs, is_weights, entropy: [B, T]; advantages: [B].
    r = exp(logprobs - old_logprobs) per token, or per sequence with `loss.gspo`. `is_weights` (see
    `rl.algo.importance`) multiply the policy term only. max_completion_length: the generation length limit,
    which loss_type dr_grpo divides by.
    """
    same_shape = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs,
                  "is_weights": is_weights, "entropy": entropy}  # fmt: skip
    _check_shapes(logprobs, advantages, same_shape)
    if loss.beta > 0.0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs; pass the reference model's logprobs or set beta=0")
    reduce = aggregation(loss.loss_type, max_completion_length).reduce
    mask = mask.bool()
    # zero the masked-out positions first, so padding garbage (even inf) cannot leak NaN into the gradient
    logprobs = torch.where(mask, logprobs, 0.0)
    old_logprobs = torch.where(mask, old_logprobs.detach(), 0.0)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # [B, 1]
    ratio = _ratio(logprobs, old_logprobs, mask, loss.gspo)
    term = policy_term(logprobs, ratio, adv, loss)
    per_token = term.per_token
    if is_weights is not None:
        per_token = per_token * torch.where(mask, is_weights.detach(), 0.0)
    policy_loss = reduce(per_token, mask)
    kl = torch.zeros((), device=logprobs.device)
    total = policy_loss
    if ref_logprobs is not None:
        ref = torch.where(mask, ref_logprobs.detach(), 0.0)
        per_token_kl = kl_estimate(logprobs, ref, loss.kl_estimator)
        kl = masked_mean(per_token_kl.detach(), mask)
        if loss.beta > 0.0:
            total = reduce(per_token + loss.beta * per_token_kl, mask)
    stats = LossStats(
        loss=total.detach(),
        policy_loss=policy_loss.detach(),
        kl=kl,
        entropy=None if entropy is None else masked_mean(entropy.detach(), mask),
        clip_low=masked_mean(term.clip_low.float(), mask),
        clip_high=masked_mean(term.clip_high.float(), mask),
        clip_region=masked_mean((term.clip_low | term.clip_high).float(), mask),
        clip_dual=masked_mean(term.clip_dual.float(), mask),
        ratio_mean=masked_mean(ratio.detach(), mask),
        num_tokens=mask.sum(),
    )
    return total, stats
