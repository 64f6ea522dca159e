"""The KL reference: the base model (the adapter disabled) or the adapter the GRPO stage began with."""

import copy

import pytest
import torch

from rl.algo.losses import LossConfig
from rl.algo.optim import build_optimizer
from rl.algo.trainer import batch_logprobs, reference_logprobs, train_step
from rl.settings import ConfigError
from rl.sync.adapter import lora_tensors

STEP = dict(max_grad_norm=1.0, temperature=1.0, micro_batch_size=4)


def start_weights(model):
    return {name: t.clone() for name, t in lora_tensors(model).items()}


def moved(model, scale=0.05):
    """The model's LoRA weights moved by seeded noise, in place (a policy that has trained)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for tensor in lora_tensors(model).values():
            tensor.add_(scale * torch.randn(tensor.shape, generator=generator))
    return model


def test_the_start_reference_scores_the_start_adapter_and_gives_the_live_weights_back(
    make_llama, make_lora, make_batch
):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    start = start_weights(model)
    at_start = copy.deepcopy(model)  # an independent model that holds the start's weights itself
    moved(model)
    live = start_weights(model)
    ref = reference_logprobs(model, batch, 4, weights=start)
    mask = batch.loss_mask
    torch.testing.assert_close(ref[mask], batch_logprobs(at_start, batch, 4)[mask], rtol=0, atol=1e-6)
    now = batch_logprobs(model, batch, 4)
    assert (now[mask] - ref[mask]).abs().max() > 1e-3  # the moved policy scores differently
    assert all(torch.equal(t, live[name]) for name, t in lora_tensors(model).items())
    base = reference_logprobs(model, batch, 4)  # the adapter disabled: neither of the two
    assert (base[mask] - ref[mask]).abs().max() > 1e-3


def test_old_and_reference_logprobs_are_constants_of_the_loss(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    assert not batch_logprobs(model, batch, 4).requires_grad  # no autograd graph kept for the whole batch
    assert not reference_logprobs(model, batch, 4, weights=start_weights(model)).requires_grad


def test_the_kl_to_the_start_is_zero_until_the_policy_moves_and_the_base_one_is_not(
    make_llama, make_lora, make_batch
):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    optimizer = build_optimizer(model, lr=1e-2)
    start = start_weights(model)
    to_start = LossConfig(beta=0.1, kl_reference="start")
    first = train_step(model, optimizer, None, batch, to_start, reference=start, **STEP).as_dict()
    assert first["kl"] == 0.0  # the policy is the start: k3 of log r = 0
    second = train_step(model, optimizer, None, batch, to_start, reference=start, **STEP).as_dict()
    assert second["kl"] > 0.0  # one step away from it
    base = copy.deepcopy(model)
    to_base = train_step(base, build_optimizer(base, lr=1e-2), None, batch, LossConfig(beta=0.1), **STEP)
    assert to_base.as_dict()["kl"] > 0.0  # the perturbed adapter is not the base model


def test_a_start_reference_without_its_weights_or_an_unknown_one_is_refused(
    make_llama, make_lora, make_batch
):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    optimizer = build_optimizer(model, lr=1e-2)
    with pytest.raises(ValueError, match="kl_reference='start' needs the start's adapter weights"):
        train_step(model, optimizer, None, batch, LossConfig(beta=0.1, kl_reference="start"), **STEP)
    unknown = r"unknown kl_reference 'parent'; choose one of \('base', 'start'\)"
    with pytest.raises(ConfigError, match=unknown):
        LossConfig(kl_reference="parent")
    wrong = {name + ".x": t for name, t in lora_tensors(model).items()}
    with pytest.raises(ValueError, match="the weights do not fit the adapter"):
        reference_logprobs(model, batch, 4, weights=wrong)
