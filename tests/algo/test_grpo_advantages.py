"""Advantages on worked examples: rewards [[1, 2, 3, 6], [0, 0, 0, 0]] by hand."""

import math

import pytest
import torch

from rl.algo.advantages import compute_advantages, filter_zero_std_groups, reward_stats

REWARDS = torch.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, 0.0, 0.0, 0.0]])
# group 0: mean 3, deviations [-2, -1, 0, 3], Bessel std sqrt(14 / 3)
GROUP0_STD = math.sqrt(14 / 3)
# all 8 rewards: mean 1.5, squared deviations sum to 32, Bessel std sqrt(32 / 7)
BATCH_STD = math.sqrt(32 / 7)


def test_grpo_group_scale():
    adv = compute_advantages(REWARDS, estimator="grpo", scale="group")
    expected = torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    expected[0] /= GROUP0_STD + 1e-4
    torch.testing.assert_close(adv, expected)


def test_grpo_batch_scale():
    adv = compute_advantages(REWARDS, estimator="grpo", scale="batch")
    expected = torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]]) / (BATCH_STD + 1e-4)
    torch.testing.assert_close(adv, expected)


def test_grpo_no_scale_is_dr_grpo():
    adv = compute_advantages(REWARDS, estimator="grpo", scale="none")
    torch.testing.assert_close(adv, torch.tensor([[-2.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]]))


def test_rloo_leave_one_out():
    # reward minus the mean of the other three: 1 - 11/3, 2 - 10/3, 3 - 9/3, 6 - 6/3
    adv = compute_advantages(REWARDS, estimator="rloo", scale="none")
    torch.testing.assert_close(adv[0], torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]))
    torch.testing.assert_close(adv[1], torch.zeros(4))
    scaled = compute_advantages(REWARDS, estimator="rloo", scale="group")
    torch.testing.assert_close(scaled[0], torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]) / (GROUP0_STD + 1e-4))
    batch = compute_advantages(REWARDS, estimator="rloo", scale="batch")
    torch.testing.assert_close(batch[0], torch.tensor([-8 / 3, -4 / 3, 0.0, 4.0]) / (BATCH_STD + 1e-4))


def test_rloo_with_two_samples_is_the_reward_difference():
    adv = compute_advantages(torch.tensor([[1.0, 0.0], [0.25, 0.75]]), estimator="rloo", scale="none")
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0], [-0.5, 0.5]]))


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_groups_of_equal_rewards_get_exactly_zero_advantage(estimator, scale):
    # the float mean of eight copies of 0.1 is not 0.1; divided by std + 1e-4 that was an advantage of 1e-3
    equal = torch.tensor([0.1, 0.7, -0.3, 1 / 3])[:, None].repeat(1, 8)
    rewards = torch.cat([equal, torch.tensor([[0.0] * 7 + [1.0]])])
    assert (equal.mean(dim=1) != equal[:, 0]).any()  # the rounding the advantages must not show
    adv = compute_advantages(rewards, estimator=estimator, scale=scale)
    assert torch.equal(adv[:4], torch.zeros(4, 8))
    assert (adv[4] != 0).all()


def test_zero_std_groups_reported_and_filtered():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.5, 0.2]])
    stats = reward_stats(rewards)
    assert stats.frac_reward_zero_std == 0.5
    assert stats.reward_mean == pytest.approx(3.7 / 8)
    assert stats.reward_std == pytest.approx(torch.tensor(rewards.flatten().tolist()).std().item())
    kept = filter_zero_std_groups(rewards)
    assert kept.tolist() == [False, True, False, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"estimator": "ppo"}, "unknown advantage estimator"),
        ({"scale": "global"}, "unknown advantage scale"),
    ],
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_advantages(REWARDS, **{"estimator": "grpo", "scale": "group", **kwargs})


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"rewards must be \[num_prompts, G\]"):
        compute_advantages(torch.ones(8), "grpo", "group")
    with pytest.raises(ValueError, match="group size G=1 is too small"):
        compute_advantages(torch.ones(4, 1), "grpo", "group")
