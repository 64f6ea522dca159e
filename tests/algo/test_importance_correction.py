"""Importance-sampling correction on constructed ratios pi_old / pi_sampler.

row 0: token ratios [2, 4, 0.5], product 4;  row 1: [1.5, 0.8, pad 100], product 1.2;  cap C = 3.
"""

import math

import pytest
import torch

from rl.algo.importance import importance_weights
from rl.algo.losses import LossConfig, compute_policy_loss

SAMPLING = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]])
RATIOS = torch.tensor([[2.0, 4.0, 0.5], [1.5, 0.8, 100.0]])
OLD = SAMPLING + RATIOS.log()
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_truncate", [[2.0, 3.0, 0.5], [1.5, 0.8, 0.0]]),
        ("token_mask", [[2.0, 0.0, 0.5], [1.5, 0.8, 0.0]]),
        ("sequence_truncate", [[3.0, 3.0, 3.0], [1.2, 1.2, 0.0]]),
        ("sequence_mask", [[0.0, 0.0, 0.0], [1.2, 1.2, 0.0]]),
    ],
)
def test_weights_per_mode(mode, expected):
    correction = importance_weights(OLD, SAMPLING, MASK, mode=mode, cap=3.0)
    torch.testing.assert_close(correction.weights, torch.tensor(expected))
    flat = [
        w for row, m in zip(expected, MASK.tolist(), strict=True) for w, on in zip(row, m, strict=True) if on
    ]
    logged = correction.as_dict()
    assert logged["sampling/importance_ratio/min"] == pytest.approx(min(flat))
    assert logged["sampling/importance_ratio/max"] == pytest.approx(max(flat))
    assert logged["sampling/importance_ratio/mean"] == pytest.approx(sum(flat) / 5)


def test_logp_difference_stats():
    logged = importance_weights(OLD, SAMPLING, MASK, cap=3.0).as_dict()
    diffs = [math.log(2), math.log(4), math.log(2), math.log(1.5), -math.log(0.8)]
    assert logged["sampling/logp_difference/mean"] == pytest.approx(sum(diffs) / 5)
    assert logged["sampling/logp_difference/max"] == pytest.approx(math.log(4))


def test_default_cap_is_three():
    default_cap = LossConfig().is_cap  # algo.is_cap
    assert importance_weights(OLD, SAMPLING, MASK, cap=default_cap).weights[0, 1].item() == pytest.approx(3.0)


def test_weights_enter_the_loss():
    # ratio 1, A = 1: grpo loss = -(mean over rows of the mean token weight)
    weights = importance_weights(OLD, SAMPLING, MASK, mode="token_truncate", cap=3.0).weights
    loss, _ = compute_policy_loss(OLD, OLD, torch.ones(2), MASK, LossConfig(), is_weights=weights)
    assert loss.item() == pytest.approx(-(5.5 / 3 + 2.3 / 2) / 2)


def test_bad_mode_and_cap_are_named():
    with pytest.raises(ValueError, match="unknown importance-sampling mode"):
        importance_weights(OLD, SAMPLING, MASK, mode="clip", cap=3.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        importance_weights(OLD, SAMPLING, MASK, cap=0.0)
    with pytest.raises(ValueError, match="same alignment"):
        importance_weights(OLD, SAMPLING[:, :2], MASK, cap=3.0)
