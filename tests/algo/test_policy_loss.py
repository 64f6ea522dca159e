"""Policy loss worked by hand.

Two sequences, eps_low = eps_high = 0.2:
  row 0, A = +1, ratios [1.5, 1.0, 0.5]: token losses [-1.2 (high clip), -1.0, -0.5 (no clip: min picks 0.5)]
  row 1, A = -2, ratios [0.5, 1.5, pad]: token losses [1.6 (low clip: -A * 0.8), 3.0 (no clip)]
grpo  = mean(-2.7 / 3, 4.6 / 2) = 0.7
bnpo  = dapo = 1.9 / 5 = 0.38
dr_grpo (L = 4) = 1.9 / (2 * 4) = 0.2375
"""

import dataclasses
import math

import pytest
import torch

from rl.algo.losses import LossConfig, compute_policy_loss

LOSS_SETTINGS = {field.name for field in dataclasses.fields(LossConfig)}
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
RATIOS = torch.tensor([[1.5, 1.0, 0.5], [0.5, 1.5, 9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0])


def logprobs_leaf(ratios=RATIOS):
    return (OLD + ratios.log()).requires_grad_()


@pytest.mark.parametrize(
    ("loss_type", "expected"), [("grpo", 0.7), ("bnpo", 0.38), ("dapo", 0.38), ("dr_grpo", 0.2375)]
)
def test_loss_value_per_aggregation(loss_type, expected):
    loss, stats = compute_policy_loss(
        logprobs_leaf(), OLD, ADV, MASK, LossConfig(loss_type=loss_type), max_completion_length=4
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats.policy_loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats.clip_low.item() == pytest.approx(0.2)
    assert stats.clip_high.item() == pytest.approx(0.2)
    assert stats.clip_region.item() == pytest.approx(0.4)
    assert stats.ratio_mean.item() == pytest.approx(1.0)  # (1.5 + 1 + 0.5 + 0.5 + 1.5) / 5
    assert stats.num_tokens.item() == 5


def test_clip_higher_is_asymmetric():
    # eps_high 0.28: row 0 token 0 becomes -1.28; row 1 token 1 (A < 0) keeps -A * 1.5 = 3.0
    loss, stats = compute_policy_loss(logprobs_leaf(), OLD, ADV, MASK, LossConfig(eps_low=0.2, eps_high=0.28))
    assert loss.item() == pytest.approx((-2.78 / 3 + 4.6 / 2) / 2, abs=1e-6)
    assert stats.clip_high.item() == pytest.approx(0.2)


def test_grpo_gradient_by_hand():
    # d loss / d logprob = d(-A r) / d logprob / (|y_i| * B) = -A r / (|y_i| * 2), zero where clipped
    logprobs = logprobs_leaf()
    loss, _ = compute_policy_loss(logprobs, OLD, ADV, MASK, LossConfig())
    loss.backward()
    expected = torch.tensor([[0.0, -1.0 / 6, -0.5 / 6], [0.0, 2.0 * 1.5 / 4, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_dual_clip_caps_negative_advantage_loss():
    # A = -1, ratios [4, 2, 0.5], c = 3: token losses [min(4, 3) = 3, 2, 0.8 (low clip)]
    old = torch.zeros(1, 3)
    logprobs = torch.tensor([[4.0, 2.0, 0.5]]).log().requires_grad_()
    mask, adv = torch.ones(1, 3, dtype=torch.bool), torch.tensor([-1.0])
    loss, stats = compute_policy_loss(logprobs, old, adv, mask, LossConfig(dual_clip_c=3.0))
    assert loss.item() == pytest.approx(5.8 / 3, abs=1e-6)
    assert stats.clip_dual.item() == pytest.approx(1 / 3)
    assert stats.clip_low.item() == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]))
    plain, _ = compute_policy_loss(logprobs.detach(), old, adv, mask, LossConfig())
    assert plain.item() == pytest.approx(6.8 / 3, abs=1e-6)


def test_dual_clip_leaves_positive_advantages_alone():
    old, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    logprobs = torch.tensor([[5.0, 0.5]]).log()
    with_c, _ = compute_policy_loss(logprobs, old, torch.tensor([1.0]), mask, LossConfig(dual_clip_c=3.0))
    without, _ = compute_policy_loss(logprobs, old, torch.tensor([1.0]), mask, LossConfig())
    assert with_c.item() == without.item() == pytest.approx(-(1.2 + 0.5) / 2)


def test_gspo_sequence_ratio():
    # row 0: s = exp(mean log [1.5, 1, 0.5]) = 0.75 ** (1/3) = 0.9086, inside [0.9, 1.1]: loss -s
    # row 1: s = 0.75 ** (1/2) = 0.8660 < 0.9, A = -2: loss max(2 * 0.866, 2 * 0.9) = 1.8, clipped
    logprobs = logprobs_leaf()
    s0 = 0.75 ** (1 / 3)
    gspo = LossConfig(gspo=True, eps_low=0.1, eps_high=0.1)
    loss, stats = compute_policy_loss(logprobs, OLD, ADV, MASK, gspo)
    assert loss.item() == pytest.approx((-s0 + 1.8) / 2, abs=1e-6)
    assert stats.clip_low.item() == pytest.approx(2 / 5)  # both tokens of row 1
    assert stats.ratio_mean.item() == pytest.approx((3 * s0 + 2 * 0.75**0.5) / 5, abs=1e-6)
    loss.backward()
    # each row-0 token moves s0 by s0 / 3; grpo averages 2 sequences
    expected = torch.tensor([[-s0 / 6] * 3, [0.0, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)
    dapo, _ = compute_policy_loss(logprobs, OLD, ADV, MASK, dataclasses.replace(gspo, loss_type="dapo"))
    assert dapo.item() == pytest.approx((-3 * s0 + 2 * 1.8) / 5, abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_ratio_one_gradient_is_reinforce_with_baseline(loss_type):
    # at r = 1 the clip is inactive and d loss / d logprob_{i,t} = -A_i * normaliser
    torch.manual_seed(0)
    old = torch.randn(4, 6)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]
    ).bool()
    adv = torch.tensor([0.5, -1.0, 2.0, -0.25])
    logprobs = old.clone().requires_grad_()
    loss, _ = compute_policy_loss(
        logprobs, old, adv, mask, LossConfig(loss_type=loss_type), max_completion_length=8
    )
    loss.backward()
    lengths = mask.sum(1, keepdim=True).float()
    normaliser = {
        "grpo": 1 / (lengths * 4),
        "bnpo": torch.full_like(lengths, 1 / 12),
        "dapo": torch.full_like(lengths, 1 / 12),
        "dr_grpo": torch.full_like(lengths, 1 / (4 * 8)),
    }[loss_type]
    torch.testing.assert_close(logprobs.grad, -adv[:, None] * normaliser * mask)
    assert loss.item() == pytest.approx((-adv[:, None] * normaliser * mask).sum().item(), abs=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("gspo", [False, True])
def test_padding_beyond_the_mask_changes_nothing(loss_type, gspo):
    ref = OLD - 0.3
    weights = torch.tensor([[1.0, 2.0, 0.5], [3.0, 1.0, 7.0]])
    config = LossConfig(loss_type=loss_type, beta=0.1, gspo=gspo, dual_clip_c=3.0)
    logprobs = logprobs_leaf()
    loss, stats = compute_policy_loss(
        logprobs, OLD, ADV, MASK, config, max_completion_length=6, ref_logprobs=ref, is_weights=weights
    )
    loss.backward()

    def pad(t, fill):
        return torch.cat([t, torch.tensor(fill).expand(2, 2)], dim=1)

    padded = pad(logprobs.detach(), float("nan")).requires_grad_()
    padded_loss, padded_stats = compute_policy_loss(
        padded, pad(OLD, -float("inf")), ADV, pad(MASK, False), config,
        max_completion_length=6, ref_logprobs=pad(ref, 50.0), is_weights=pad(weights, float("inf")),
    )  # fmt: skip
    padded_loss.backward()
    assert padded_loss.item() == loss.item()
    assert padded_stats.kl.item() == stats.kl.item()
    torch.testing.assert_close(padded.grad[:, :3], logprobs.grad)
    assert padded.grad[:, 3:].abs().sum().item() == 0.0


def test_importance_weights_scale_the_policy_term_only():
    # ratio 1, A = 1, one token with weight 3 and one with 0.5: grpo loss = -(3 + 0.5) / 2 / 1 sequence;
    # k3 KL with ref = logprob - log 2: exp(-log 2) + log 2 - 1 per token, unweighted
    logprobs = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[0, 1, 1]]).bool()
    ref = logprobs - math.log(2)
    k3 = 0.5 + math.log(2) - 1
    loss, stats = compute_policy_loss(
        logprobs, logprobs, torch.tensor([1.0]), mask, LossConfig(beta=0.1),
        is_weights=torch.tensor([[9.0, 3.0, 0.5]]), ref_logprobs=ref,
    )  # fmt: skip
    assert stats.policy_loss.item() == pytest.approx(-1.75)
    assert stats.kl.item() == pytest.approx(k3)
    assert loss.item() == pytest.approx(-1.75 + 0.1 * k3)


def test_entropy_stat_is_the_masked_mean():
    logprobs = logprobs_leaf().detach()
    entropy = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    _, stats = compute_policy_loss(logprobs, OLD, ADV, MASK, LossConfig(), entropy=entropy)
    assert stats.entropy.item() == pytest.approx(3.0)
    assert stats.as_dict()["entropy"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "ppo"}, "unknown loss_type"),
        ({"loss_type": "dr_grpo"}, "pass max_completion_length"),
        ({"beta": 0.1}, "beta > 0 needs ref_logprobs"),
        ({"dual_clip_c": 1.0}, "dual_clip_c must be > 1"),
        ({"eps_low": 1.0}, "0 <= eps_low < 1"),
        ({"kl_estimator": "k4"}, "unknown kl_estimator"),
        ({"ref_logprobs": torch.zeros(2, 4)}, "ref_logprobs has shape"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    settings = {key: value for key, value in kwargs.items() if key in LOSS_SETTINGS}
    tensors = {key: value for key, value in kwargs.items() if key not in LOSS_SETTINGS}
    with pytest.raises(ValueError, match=message):
        compute_policy_loss(logprobs_leaf(), OLD, ADV, MASK, LossConfig(**settings), **tensors)


def test_advantages_must_be_flat():
    with pytest.raises(ValueError, match=r"advantages \[B\]"):
        compute_policy_loss(logprobs_leaf(), OLD, ADV[:, None], MASK, LossConfig())
