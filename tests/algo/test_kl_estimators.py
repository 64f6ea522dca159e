"""k1, k2, k3 against hand values and exact expectations over a small categorical distribution."""

import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from rl.algo.losses import LossConfig, compute_policy_loss, kl_estimate

P = torch.tensor([0.1, 0.2, 0.3, 0.4])
Q = torch.tensor([0.25, 0.25, 0.4, 0.1])


def test_hand_values():
    # pi(x) = 0.5, pi_ref(x) = 0.25: log r = log(0.25 / 0.5) = -log 2
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)


def test_k1_and_k3_are_unbiased_for_the_analytic_kl():
    # exact expectation under x ~ P, by enumerating the support
    analytic = torch.distributions.kl_divergence(
        torch.distributions.Categorical(probs=P), torch.distributions.Categorical(probs=Q)
    )
    for estimator in ("k1", "k3"):
        expected = (P * kl_estimate(P.log(), Q.log(), estimator)).sum()
        torch.testing.assert_close(expected, analytic)
    k2 = (P * kl_estimate(P.log(), Q.log(), "k2")).sum()
    torch.testing.assert_close(k2, 0.5 * (P * (P / Q).log().square()).sum())


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_zero_when_policy_equals_reference(estimator):
    lp = torch.tensor([[-0.1, -2.0, -7.5]])
    assert kl_estimate(lp, lp.clone(), estimator).abs().max().item() == 0.0


@given(
    st.floats(min_value=-30, max_value=0, allow_nan=False),
    st.floats(min_value=-30, max_value=0, allow_nan=False),
)
@example(-5.960464477539063e-08, 0.0)  # exp(x) - x - 1 in float32 rounds below zero here
def test_k3_is_non_negative(lp, ref):
    assert kl_estimate(torch.tensor([lp]), torch.tensor([ref]), "k3").item() >= 0.0


def test_kl_term_in_the_loss_and_its_gradient():
    # A = 0 leaves only beta * k3; d k3 / d logprob = 1 - exp(ref - logprob) = 1 - 0.5
    logprobs = torch.tensor([[0.0, math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[0.0, math.log(0.25)]])
    mask = torch.tensor([[False, True]])
    loss, stats = compute_policy_loss(
        logprobs, logprobs.detach(), torch.tensor([0.0]), mask, LossConfig(beta=0.1, kl_estimator="k3"),
        ref_logprobs=ref,
    )  # fmt: skip
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1))
    assert stats.kl.item() == pytest.approx(0.5 + math.log(2) - 1)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.1 * 0.5]]))


def test_kl_reported_but_not_added_when_beta_is_zero():
    logprobs = torch.tensor([[0.0, math.log(0.5)]])
    ref = torch.tensor([[0.0, math.log(0.25)]])
    loss, stats = compute_policy_loss(
        logprobs,
        logprobs,
        torch.tensor([0.0]),
        torch.tensor([[False, True]]),
        LossConfig(kl_estimator="k1"),
        ref_logprobs=ref,
    )
    assert loss.item() == 0.0
    assert stats.kl.item() == pytest.approx(math.log(2))
