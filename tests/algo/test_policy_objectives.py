"""CISPO and SAPO (algo.policy_loss) worked by hand, beside the PPO clip they replace.

CISPO, cispo_eps_high = 1 (the IS weight capped at 2), two sequences:
  row 0, A = +1, ratios [3, 1, 0.5], logp [-0.5, -1, -2]: weights [2 (capped), 1, 0.5],
         token losses -w * A * logp = [1, 1, 1]
  row 1, A = -2, ratios [0.25, 4, pad], logp [-1.5, -0.25]: weights [0.25, 2 (capped)],
         token losses [-0.75, -1.0]
grpo = mean(3 / 3, -1.75 / 2) = 0.0625; dapo = (3 - 1.75) / 5 = 0.25
d loss / d logp = -w * A times the loss type's normaliser, at every token: the capped ones keep theirs.

SAPO's gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau is written out below with plain math, apart from the
code under test: loss -f(r) * A, d loss / d logp = -A * 4 s (1 - s) * r with s = sigmoid(tau * (r - 1)).
"""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from rl.algo.losses import LossConfig, compute_policy_loss
from rl.algo.trainer import accumulate_gradients, batch_logprobs, reference_logprobs
from rl.config.checks import check_config
from rl.config.schema import AlgoConfig, register_configs
from rl.settings import ConfigError

LOSS_SETTINGS = {field.name for field in dataclasses.fields(LossConfig)}
CONF = Path(__file__).resolve().parents[2] / "conf"

LOGP = torch.tensor([[-0.5, -1.0, -2.0], [-1.5, -0.25, -3.0]])
RATIOS = torch.tensor([[3.0, 1.0, 0.5], [0.25, 4.0, 7.0]])
OLD = LOGP - RATIOS.log()
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
ADV = torch.tensor([1.0, -2.0])
CISPO = LossConfig(policy_loss="cispo", cispo_eps_high=1.0)


def leaf(values=LOGP):
    return values.clone().requires_grad_()


def loss_and_grad(config, logprobs=LOGP, old=OLD, adv=ADV, mask=MASK, **kwargs):
    logprobs = leaf(logprobs)
    loss, stats = compute_policy_loss(logprobs, old, adv, mask, config, max_completion_length=4, **kwargs)
    loss.backward()
    return loss, stats, logprobs.grad


# --- CISPO -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss_type", "expected", "grad"),
    [
        ("grpo", 0.0625, [[-2 / 6, -1 / 6, -0.5 / 6], [0.5 / 4, 4 / 4, 0.0]]),
        ("dapo", 0.25, [[-2 / 5, -1 / 5, -0.5 / 5], [0.5 / 5, 4 / 5, 0.0]]),
    ],
)
def test_cispo_loss_and_gradient_by_hand(loss_type, expected, grad):
    config = LossConfig(policy_loss="cispo", cispo_eps_high=1.0, loss_type=loss_type)
    loss, stats, logp_grad = loss_and_grad(config)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats.policy_loss.item() == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(logp_grad, torch.tensor(grad))
    # the cap acted on ratio 3 (A > 0) and ratio 4 (A < 0); no lower bound, no dual clip
    assert stats.clip_high.item() == pytest.approx(2 / 5)
    assert stats.clip_region.item() == pytest.approx(2 / 5)
    assert stats.clip_low.item() == 0.0 and stats.clip_dual.item() == 0.0
    assert stats.ratio_mean.item() == pytest.approx((3 + 1 + 0.5 + 0.25 + 4) / 5)


def test_cispo_keeps_the_gradient_the_ppo_clip_drops():
    # ratio 3 with A = +1 is far above the clip: PPO's min picks the constant clip(3) * A = 1.2, gradient 0;
    # CISPO weighs the token by min(3, 2) = 2 and keeps it. At ratio 4 with A = -2, PPO's gradient
    # -A * r = 8 grows with the ratio; CISPO's stays at -A * 2 = 4.
    dapo = {"loss_type": "dapo"}
    _, _, ppo = loss_and_grad(LossConfig(**dapo))
    _, _, cispo = loss_and_grad(LossConfig(policy_loss="cispo", cispo_eps_high=1.0, **dapo))
    assert ppo[0, 0].item() == 0.0
    assert cispo[0, 0].item() == pytest.approx(-2 / 5)
    assert ppo[1, 1].item() == pytest.approx(8 / 5)
    assert cispo[1, 1].item() == pytest.approx(4 / 5)


def test_cispo_every_token_keeps_a_gradient():
    torch.manual_seed(0)
    logprobs = -torch.rand(4, 8) * 3
    old = logprobs + torch.randn(4, 8) * 2  # ratios from about e^-6 to e^6
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -2.0]), torch.ones(4, 8, dtype=torch.bool)
    _, stats, grad = loss_and_grad(CISPO, logprobs, old, adv, mask)
    assert 0.0 < stats.clip_high.item() < 1.0
    assert bool((grad != 0).all())
    _, ppo_stats, ppo_grad = loss_and_grad(LossConfig(), logprobs, old, adv, mask)
    assert ppo_stats.clip_region.item() > 0.0 and bool((ppo_grad == 0).any())


def test_cispo_default_cap_is_trls_five():
    # TRL's epsilon_high = 5.0 for loss_type="cispo" (ScaleRL's eps_max) is the cap 1 + cispo_eps_high
    logprobs, old = torch.tensor([[0.0, 0.0]]), torch.tensor([[-math.log(4.0), -math.log(9.0)]])
    _, stats, grad = loss_and_grad(LossConfig(policy_loss="cispo"), logprobs, old, torch.tensor([1.0]),
                                   torch.ones(1, 2, dtype=torch.bool))  # fmt: skip
    torch.testing.assert_close(grad, torch.tensor([[-4.0 / 2, -5.0 / 2]]))
    assert stats.clip_high.item() == pytest.approx(0.5)


def test_cispo_on_sequence_ratios():
    # gspo: row 0 s = (3 * 1 * 0.5) ** (1/3) = 1.1447, row 1 s = (0.25 * 4) ** (1/2) = 1, under the cap 2;
    # every token of a row is weighed by its row's s: dapo gradient -s * A / 5
    s0 = 1.5 ** (1 / 3)
    _, _, grad = loss_and_grad(
        LossConfig(policy_loss="cispo", cispo_eps_high=1.0, gspo=True, loss_type="dapo")
    )
    torch.testing.assert_close(grad, torch.tensor([[-s0 / 5] * 3, [2 / 5, 2 / 5, 0.0]]))


def test_cispo_composes_with_importance_weights_and_kl():
    # the IS weights multiply the policy term only; beta * k1 KL (logp - ref) adds its own gradient beta
    weights = torch.tensor([[2.0, 1.0, 0.5], [1.0, 3.0, 9.0]])
    ref = LOGP - 0.5  # k1 = 0.5 per token
    config = LossConfig(
        policy_loss="cispo", cispo_eps_high=1.0, loss_type="dapo", beta=0.1, kl_estimator="k1"
    )
    loss, stats, grad = loss_and_grad(config, is_weights=weights, ref_logprobs=ref)
    policy = (2 * 1 + 1 * 1 + 0.5 * 1 + 1 * -0.75 + 3 * -1.0) / 5
    assert stats.policy_loss.item() == pytest.approx(policy, abs=1e-6)
    assert stats.kl.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(policy + 0.1 * 0.5, abs=1e-6)
    expected = (torch.tensor([[-2.0, -1.0, -0.5], [0.5, 4.0, 0.0]]) * weights + 0.1) / 5 * MASK
    torch.testing.assert_close(grad, expected)


# --- SAPO --------------------------------------------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def sapo_by_hand(r: float, a: float, tau_pos: float, tau_neg: float) -> tuple[float, float]:
    """(token loss, d token loss / d logp) of SAPO for ratio r and advantage a."""
    tau = tau_pos if a > 0 else tau_neg
    s = sigmoid(tau * (r - 1.0))
    return -a * s * 4.0 / tau, -a * 4.0 * s * (1.0 - s) * r


@pytest.mark.parametrize(("tau_pos", "tau_neg"), [(1.0, 1.05), (2.0, 5.0)])
def test_sapo_loss_and_gradient_match_the_formula(tau_pos, tau_neg):
    # r < 1, r > 1 and r = 1, for A > 0 (row 0) and A < 0 (row 1); grpo: each token's share is 1 / (3 * 2)
    ratios = [0.5, 2.0, 1.0]
    advantages = [1.5, -0.5]
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([ratios, ratios]).log()
    config = LossConfig(policy_loss="sapo", sapo_tau_pos=tau_pos, sapo_tau_neg=tau_neg)
    loss, stats, grad = loss_and_grad(
        config, logprobs, old, torch.tensor(advantages), torch.ones(2, 3).bool()
    )
    by_hand = [[sapo_by_hand(r, a, tau_pos, tau_neg) for r in ratios] for a in advantages]
    expected_loss = sum(value for row in by_hand for value, _ in row) / 6
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[g / 6 for _, g in row] for row in by_hand]))
    assert stats.clip_region.item() == 0.0  # nothing is clipped


@pytest.mark.parametrize("advantage", [2.0, -2.0])
def test_sapo_near_ratio_one_is_the_unclipped_policy_gradient(advantage):
    # the gate's slope 4 s (1 - s) is 1 at r = 1: d loss / d logp = -A * r, as the PPO objective inside its
    # clip range; at r = 1 the token's loss is -A * 2 / tau
    old, mask, adv = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), torch.tensor([advantage])
    logprobs = torch.tensor([[1.0, 1.001, 0.999]]).log()
    sapo_loss, _, sapo = loss_and_grad(LossConfig(policy_loss="sapo"), logprobs, old, adv, mask)
    _, _, ppo = loss_and_grad(LossConfig(), logprobs, old, adv, mask)
    torch.testing.assert_close(sapo, ppo, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sapo, -advantage * logprobs.exp() / 3, atol=1e-6, rtol=1e-5)
    tau = 1.0 if advantage > 0 else 1.05
    at_one = -advantage * 2 / tau
    assert sapo_loss.item() == pytest.approx(at_one, rel=1e-3)  # the three ratios are within 1e-3 of 1


def test_sapo_gate_fades_smoothly_and_faster_for_negative_advantages():
    # where the PPO clip cuts the gradient to 0 at r = 1.2 (A > 0), SAPO's fades: 4 s (1 - s) * r
    ratios = torch.tensor([1.1, 1.3, 2.0, 4.0, 8.0])
    old, mask = torch.zeros(2, 5), torch.ones(2, 5, dtype=torch.bool)
    logprobs = ratios.log().expand(2, 5)
    config = LossConfig(policy_loss="sapo", sapo_tau_pos=1.0, sapo_tau_neg=3.0)
    _, _, grad = loss_and_grad(config, logprobs, old, torch.tensor([1.0, -1.0]), mask)
    weight = grad.abs() * 10 / ratios  # 4 s (1 - s): grpo shares 1 / (5 * 2)
    assert bool((weight[:, 1:] < weight[:, :-1]).all())  # decays as r moves away from 1
    assert bool((weight[1] < weight[0]).all())  # tau_neg 3 > tau_pos 1: negative updates fade faster
    assert weight[0, -1].item() == pytest.approx(4 * sigmoid(7.0) * (1 - sigmoid(7.0)), rel=1e-3)  # 0.0036
    _, _, ppo = loss_and_grad(LossConfig(), logprobs, old, torch.tensor([1.0, -1.0]), mask)
    assert bool((ppo[0, 1:] == 0).all())  # the hard clip's all-or-nothing edge


def test_sapo_on_sequence_ratios():
    # gspo: row 0 s = 1.5 ** (1/3) for each of its 3 tokens, d s / d logp_t = s / 3; grpo: the row's loss
    # is -f(s) * A, so d loss / d logp_t = -A * 4 q (1 - q) * s / 3 / 2 with q = sigmoid(tau * (s - 1))
    s0 = 1.5 ** (1 / 3)
    _, _, grad = loss_and_grad(LossConfig(policy_loss="sapo", gspo=True))
    q0, q1 = sigmoid(s0 - 1), sigmoid(1.05 * (1.0 - 1))
    row0 = -1.0 * 4 * q0 * (1 - q0) * s0 / 3 / 2
    row1 = 2.0 * 4 * q1 * (1 - q1) * 1.0 / 2 / 2
    torch.testing.assert_close(grad, torch.tensor([[row0] * 3, [row1, row1, 0.0]]))


# --- both: padding, micro-batches, settings ----------------------------------------------------------------


@pytest.mark.parametrize("policy_loss", ["cispo", "sapo"])
@pytest.mark.parametrize("gspo", [False, True])
def test_padding_beyond_the_mask_changes_nothing(policy_loss, gspo):
    config = LossConfig(policy_loss=policy_loss, gspo=gspo, beta=0.1)
    weights, ref = torch.tensor([[1.0, 2.0, 0.5], [3.0, 1.0, 7.0]]), LOGP - 0.3
    loss, _, grad = loss_and_grad(config, is_weights=weights, ref_logprobs=ref)

    def pad(t, fill):
        return torch.cat([t, torch.tensor(fill).expand(2, 2)], dim=1)

    padded_loss, _, padded_grad = loss_and_grad(
        config, pad(LOGP, float("nan")), pad(OLD, -float("inf")), ADV, pad(MASK, False),
        is_weights=pad(weights, float("inf")), ref_logprobs=pad(ref, 50.0),
    )  # fmt: skip
    assert padded_loss.item() == loss.item()
    torch.testing.assert_close(padded_grad[:, :3], grad)
    assert padded_grad[:, 3:].abs().sum().item() == 0.0


@pytest.mark.parametrize(
    "config",
    [
        LossConfig(policy_loss="cispo", loss_type="dapo", cispo_eps_high=0.3, beta=0.1),
        LossConfig(policy_loss="sapo", beta=0.1),
        LossConfig(policy_loss="sapo", gspo=True, loss_type="dr_grpo"),
    ],
)
def test_micro_batched_gradient_matches_single_batch(make_llama, make_lora, make_batch, config):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    torch.manual_seed(3)
    old = batch_logprobs(model, batch, 6) + 0.3 * torch.randn(batch.input_ids.shape)  # stale: r != 1
    ref = reference_logprobs(model, batch, 6)
    is_weights = torch.rand(batch.input_ids.shape) * 2
    results = []
    for micro_batch_size in (6, 4, 1):
        stats = accumulate_gradients(
            model, batch, config, micro_batch_size=micro_batch_size, max_completion_length=8,
            old_logprobs=old, ref_logprobs=ref, is_weights=is_weights,
        )  # fmt: skip
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
        results.append((stats, grads))
        model.zero_grad(set_to_none=True)
    (full, full_grads), *micro = results
    for stats, grads in micro:
        assert stats.loss.item() == pytest.approx(full.loss.item(), abs=1e-6)
        assert stats.clip_high.item() == pytest.approx(full.clip_high.item(), abs=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, full_grads[name], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy_loss": "ppo"}, "unknown policy_loss 'ppo'"),
        ({"policy_loss": "cispo", "cispo_eps_high": -1.0}, "cispo_eps_high=-1.0: use a finite number >= 0"),
        ({"policy_loss": "sapo", "sapo_tau_pos": 0.0}, "sapo_tau_pos=0.0: use a finite number > 0"),
        ({"policy_loss": "sapo", "sapo_tau_neg": math.inf}, "sapo_tau_neg=inf: use a finite number > 0"),
        ({"policy_loss": "cispo", "dual_clip_c": 3.0}, "policy_loss='cispo' does not use"),
        ({"policy_loss": "sapo", "dual_clip_c": 3.0}, r"leave it unset \(algo.dual_clip_c=null\)"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    assert set(kwargs) <= LOSS_SETTINGS
    with pytest.raises(ConfigError, match=message):
        LossConfig(**kwargs)


# --- the algo=cispo and algo=sapo options ------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_train():
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield lambda *overrides: compose("train", overrides=["run_dir=/tmp/run", *overrides])


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("cispo", {"policy_loss": "cispo", "loss_type": "dapo", "cispo_eps_high": 4.0}),
        ("sapo", {"policy_loss": "sapo", "loss_type": "grpo", "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}),
    ],
)
def test_algo_options_compose_and_pass_the_checks(compose_train, option, expected):
    cfg = compose_train(f"algo={option}")
    check_config(cfg)
    algo = OmegaConf.to_object(cfg.algo)  # as rl.job.grpo_step.policy_update hands it to train_step
    assert isinstance(algo, AlgoConfig)
    for key, value in expected.items():
        assert getattr(algo, key) == value
    assert algo.dual_clip_c is None and algo.gspo is False


def test_algo_option_settings_are_checked(compose_train):
    with pytest.raises(ConfigCompositionException, match="algo.policy_loss=ppo"):
        compose_train("algo.policy_loss=ppo")
    with pytest.raises(ConfigError, match="algo.sapo_tau_neg=0"):
        check_config(compose_train("algo=sapo", "algo.sapo_tau_neg=0"))
    with pytest.raises(ConfigError, match="algo.dual_clip_c=3.0: dual-clip caps the loss of the PPO clip"):
        check_config(compose_train("algo=cispo", "algo.dual_clip_c=3.0"))  # before the model loads
