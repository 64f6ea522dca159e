"""The per-token policy objectives that `rl.algo.losses` chooses between by `policy_loss`.

clip: PPO's clipped surrogate (GRPO, DAPO, GSPO), with dual-clip. cispo: MiniMax-M1's clipped, stop-gradient
IS weight on log pi. sapo: Qwen's soft, temperature-controlled gate in place of the clip. Each takes the
ratio [B, T] (per token, or a sequence's shared by its tokens) and the advantages [B, 1], and returns the
per-token loss [B, T]; the aggregation (`rl.algo.aggregation`) reduces it.
"""

from __future__ import annotations

import torch

# the per-token objective: clip (PPO-style), cispo (MiniMax-M1), sapo (Qwen's soft gate)
POLICY_LOSSES = ("clip", "cispo", "sapo")


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


def cispo_surrogate(
    logprobs: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, eps_high: float
) -> torch.Tensor:
    """CISPO (MiniMax-M1, arXiv 2506.13585): -sg(min(r, 1 + eps_high)) * A * log pi per token [B, T].

    The clipped IS weight is a constant (stop-gradient), so d loss / d log pi = -min(r, 1 + eps_high) * A at
    every token: the clip bounds a token's weight but never drops its gradient, as the PPO clip does once r
    leaves [1 - eps_low, 1 + eps_high]. The weight has no lower bound, the paper's practice ("we did not
    impose a lower bound on the IS weight ... only tuned eps_high") and TRL's (trl/trainer/grpo_trainer.py,
    loss_type "cispo": clamp(coef_1, max=epsilon_high).detach()); TRL's epsilon_high is the cap itself,
    1 + eps_high here, in the paper's notation and eps_high's. The cap applies whatever the advantage's sign.
    The loss's value is a surrogate that depends on log pi: only its gradient is CISPO's.
    """
    weight = ratio.detach().clamp(max=1.0 + eps_high)
    return -weight * adv * logprobs


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's soft gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau, in place of the clipped ratio.

    Its slope 4 * s * (1 - s), s = sigmoid(tau * (r - 1)), is 1 at r = 1 and decays smoothly on both sides;
    a larger tau decays faster.
    """
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, tau_pos: float, tau_neg: float) -> torch.Tensor:
    """SAPO (Qwen, arXiv 2511.20347): -f(r) * A per token [B, T], f = `sapo_gate` with tau_pos where A > 0
    and tau_neg where A <= 0.

    As TRL (trl/trainer/grpo_trainer.py, loss_type "sapo") and verl (verl/trainer/ppo/core_algos.py,
    compute_policy_loss_sapo) write it. The gradient, -4 s (1 - s) * r * A * d log pi, is the unclipped policy
    gradient -r * A * d log pi near r = 1 and fades, without a hard edge, as r moves away from 1. The paper
    takes tau_neg > tau_pos: negative advantages push up the logits of many unsampled tokens, so their
    off-policy updates fade faster.
    """
    tau = torch.where(adv > 0, adv.new_tensor(tau_pos), adv.new_tensor(tau_neg))  # [B, 1]
    return -sapo_gate(ratio, tau) * adv
