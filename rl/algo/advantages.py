"""Group-relative advantages from rewards laid out as [num_prompts, G] (G completions per prompt)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

ESTIMATORS = ("grpo", "rloo")
SCALES = ("group", "batch", "none")
STD_EPS = 1e-4


@dataclass(slots=True)
class RewardStats:
    """Reward summary; `frac_reward_zero_std` is the share of groups whose rewards are all equal."""

    reward_mean: float
    reward_std: float
    frac_reward_zero_std: float


def group_rewards(groups: Sequence[Sequence[Any]]) -> torch.Tensor:
    """The rewards [num_prompts, G] of played groups (`rl.rollout.play.Trajectory`'s `reward`)."""
    return torch.tensor([[t.reward for t in group] for group in groups], dtype=torch.float32)


def _check_rewards(rewards: torch.Tensor, min_group_size: int) -> None:
    if rewards.dim() != 2:
        raise ValueError(
            f"rewards must be [num_prompts, G], got shape {tuple(rewards.shape)}; "
            "reshape the flat rewards with rewards.view(num_prompts, G)"
        )
    if rewards.size(1) < min_group_size:
        raise ValueError(
            f"group size G={rewards.size(1)} is too small: need G >= {min_group_size} "
            "to compare a completion with the rest of its group; sample more completions per prompt"
        )


def compute_advantages(
    rewards: torch.Tensor, estimator: str, scale: str, std_eps: float = STD_EPS
) -> torch.Tensor:
    """Turn rewards [num_prompts, G] into advantages [num_prompts, G].

    estimator: `grpo` subtracts the group mean; `rloo` subtracts the mean of the other G-1 rewards,
    which equals G/(G-1) times the grpo baseline-subtracted reward.
    scale: `group` divides by the group std + std_eps; `batch` by the std of all rewards + std_eps;
    `none` does not divide (Dr. GRPO). Both stds are Bessel-corrected (unbiased, divisor n-1), as in TRL.
    A group whose rewards are all equal gets advantage exactly 0: its float mean can differ from them by
    rounding, which the division by std_eps alone would turn into advantages of up to 1e-3.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ESTIMATORS}")
    if scale not in SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; choose one of {SCALES}")
    _check_rewards(rewards, min_group_size=2)
    rewards = rewards.float()
    group_size = rewards.size(1)
    centered = torch.where(
        _zero_std_groups(rewards)[:, None], 0.0, rewards - rewards.mean(dim=1, keepdim=True)
    )
    if estimator == "rloo":
        centered = centered * (group_size / (group_size - 1))
    if scale == "group":
        return centered / (rewards.std(dim=1, keepdim=True) + std_eps)
    if scale == "batch":
        return centered / (rewards.std() + std_eps)
    return centered


def _zero_std_groups(rewards: torch.Tensor) -> torch.Tensor:
    # max == min is exact, unlike a tolerance on the std
    return rewards.amax(dim=1) == rewards.amin(dim=1)


def reward_stats(rewards: torch.Tensor) -> RewardStats:
    """Mean, Bessel-corrected std and the share of zero-variance groups of rewards [num_prompts, G]."""
    _check_rewards(rewards, min_group_size=1)
    rewards = rewards.float()
    std = rewards.std().item() if rewards.numel() > 1 else 0.0
    return RewardStats(
        reward_mean=rewards.mean().item(),
        reward_std=std,
        frac_reward_zero_std=_zero_std_groups(rewards).float().mean().item(),
    )


def filter_zero_std_groups(rewards: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: the keep mask [num_prompts] of groups whose rewards differ (equal rewards give
    zero advantage). The training loop decides how to refill the dropped groups."""
    _check_rewards(rewards, min_group_size=1)
    return ~_zero_std_groups(rewards)
