"""The optimisation step on a tiny Llama with a LoRA adapter."""

import pytest
import torch

from rl.algo.losses import LossConfig
from rl.algo.optim import build_lr_scheduler, build_optimizer
from rl.algo.trainer import accumulate_gradients, batch_logprobs, reference_logprobs, train_step

# loss-mask tokens per row: completions [4, 6, 3, 5, 2, 4], row 3 has 2 observation tokens
NUM_TOKENS = 4 + 6 + 3 + 3 + 2 + 4
STEP = dict(max_grad_norm=1.0, temperature=1.0)  # trainer.max_grad_norm and rollout.temperature


def lora_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_first_step_stats_by_hand(make_llama, make_lora, make_batch):
    # fresh adapter (lora_B = 0): policy == reference, so kl = 0; mu = 1: ratio 1, no clipping,
    # grpo loss = -mean(A) = -(0.5 - 1 + 1.5 + 0.25 - 0.75 + 1) / 6
    model, batch = make_lora(make_llama(), perturb=False), make_batch()
    optimizer = build_optimizer(model, lr=1e-3)
    stats = train_step(model, optimizer, None, batch, LossConfig(beta=0.04), micro_batch_size=4, **STEP)
    logged = stats.as_dict()
    assert logged["loss"] == pytest.approx(-1.5 / 6, abs=1e-6)
    assert logged["kl"] == 0.0
    assert logged["ratio_mean"] == pytest.approx(1.0)
    assert logged["clip_ratio/region_mean"] == 0.0
    assert logged["lr"] == 1e-3
    assert stats.num_tokens == NUM_TOKENS
    assert (stats.num_optimizer_steps, stats.num_skipped_steps) == (1, 0)
    assert stats.grad_norm > 0.0
    assert logged["entropy"] > 0.0
    assert logged["completions/mean_length"] == pytest.approx(24 / 6)
    assert (logged["completions/min_length"], logged["completions/max_length"]) == (2, 6)
    assert logged["completions/mean_terminated_length"] == pytest.approx((4 + 3 + 5 + 4) / 4)
    assert logged["completions/min_terminated_length"] == 3
    assert logged["completions/max_terminated_length"] == 5
    assert logged["completions/clipped_ratio"] == pytest.approx(2 / 6)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batched_gradient_matches_single_batch(make_llama, make_lora, make_batch, loss_type):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    torch.manual_seed(3)
    # stale old logprobs so the ratios spread over both clip edges; a reference and IS weights as well
    old = batch_logprobs(model, batch, 6) + 0.3 * torch.randn(batch.input_ids.shape)
    ref = reference_logprobs(model, batch, 6)
    is_weights = torch.rand(batch.input_ids.shape) * 2
    loss = LossConfig(loss_type=loss_type, beta=0.1, dual_clip_c=3.0)
    results = []
    for micro_batch_size in (6, 4, 1):
        stats = accumulate_gradients(
            model, batch, loss, micro_batch_size=micro_batch_size, max_completion_length=8,
            old_logprobs=old, ref_logprobs=ref, is_weights=is_weights,
        )  # fmt: skip
        results.append((stats, lora_grads(model)))
        model.zero_grad(set_to_none=True)
    (full, full_grads), *micro = results
    assert full.clip_region.item() > 0.0
    for stats, grads in micro:
        assert stats.loss.item() == pytest.approx(full.loss.item(), abs=1e-6)
        assert stats.kl.item() == pytest.approx(full.kl.item(), abs=1e-6)
        assert stats.clip_region.item() == pytest.approx(full.clip_region.item(), abs=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, full_grads[name], atol=1e-5, rtol=0)


def test_bnpo_over_the_whole_batch_equals_dapo(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    losses = []
    for loss_type in ("bnpo", "dapo"):
        stats = accumulate_gradients(model, batch, LossConfig(loss_type=loss_type), micro_batch_size=6)
        losses.append(stats.loss.item())
    assert losses[0] == pytest.approx(losses[1], abs=1e-7)


def independent_loss(model, batch):
    """-(1/B) sum_i A_i * mean_t logprob_{i,t} from a plain forward of each unpadded row."""
    total = 0.0
    with torch.no_grad():
        for row, length in enumerate(batch.attention_mask.sum(1).tolist()):
            ids = batch.input_ids[row, :length]
            logp = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1], -1).gather(-1, ids[1:, None])
            chosen = logp.squeeze(-1)[batch.loss_mask[row, 1:length]]
            total -= batch.advantages[row].item() * chosen.mean().item()
    return total / batch.num_sequences


def test_repeated_steps_raise_the_chosen_tokens_logprobs(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=False), make_batch(advantages=[1.0] * 6)
    optimizer = build_optimizer(model, lr=1e-2)
    before = batch_logprobs(model, batch, 6)
    losses = [independent_loss(model, batch)]
    for _ in range(6):
        stats = train_step(
            model, optimizer, None, batch, LossConfig(num_iterations=2), micro_batch_size=4, **STEP
        )
        # pass 1 has ratio 1 (loss -1); pass 2 has ratios > 1, clipped at 1.2 for A > 0
        assert -1.2 <= stats.loss.loss.item() < -1.0
        losses.append(independent_loss(model, batch))
    after = batch_logprobs(model, batch, 6)
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False))
    rise = torch.where(batch.loss_mask, after - before, 0.0).sum(1) / batch.loss_mask.sum(1)
    assert rise.min().item() > 0.0  # every sequence's chosen tokens, on average


def test_nan_loss_skips_the_step_and_keeps_the_weights(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    optimizer = build_optimizer(model, lr=1e-2)
    scheduler = build_lr_scheduler(optimizer, "cosine", warmup_steps=1, num_training_steps=10)
    train_step(model, optimizer, scheduler, batch, LossConfig(), micro_batch_size=3, **STEP)
    weights, adam_state = snapshot(model), {k: v["exp_avg"].clone() for k, v in optimizer.state.items()}
    calls = []

    def poison_second_micro_batch(module, args, output):
        calls.append(1)
        return output * float("nan") if len(calls) == 2 else output

    handle = model.get_output_embeddings().register_forward_hook(poison_second_micro_batch)
    stats = train_step(model, optimizer, scheduler, batch, LossConfig(), micro_batch_size=3, **STEP)
    handle.remove()
    assert len(calls) == 2
    assert (stats.num_skipped_steps, stats.num_optimizer_steps) == (1, 0)
    for name, value in snapshot(model).items():
        assert torch.equal(value, weights[name]), name
    for param, state in optimizer.state.items():
        assert torch.equal(state["exp_avg"], adam_state[param])
    assert scheduler.last_epoch == 1  # one real step so far
    assert all(p.grad is None for p in model.parameters())
    # the next clean step goes through
    stats = train_step(model, optimizer, scheduler, batch, LossConfig(), micro_batch_size=3, **STEP)
    assert stats.num_skipped_steps == 0 and scheduler.last_epoch == 2


def test_only_lora_weights_move(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    before = snapshot(model)
    optimizer = build_optimizer(model, lr=1e-2)
    train_step(model, optimizer, None, batch, LossConfig(beta=0.1), micro_batch_size=6, **STEP)
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]) != param.requires_grad, name


def test_mask_truncated_completions(make_llama, make_lora, make_batch):
    model = make_lora(make_llama(), perturb=True)
    optimizer = build_optimizer(model, lr=1e-2)
    masked = LossConfig(mask_truncated_completions=True)
    stats = train_step(model, optimizer, None, make_batch(), masked, micro_batch_size=8, **STEP)
    assert stats.num_tokens == NUM_TOKENS - 6 - 2  # rows 1 and 4 are truncated
    everything_truncated = make_batch(truncated=[True] * 6)
    before = snapshot(model)
    fresh = build_optimizer(model, lr=1e-2)  # no Adam momentum from the step above
    stats = train_step(model, fresh, None, everything_truncated, masked, micro_batch_size=8, **STEP)
    assert stats.num_tokens == 0 and stats.grad_norm == 0.0
    assert stats.as_dict()["completions/mean_terminated_length"] == 0.0
    for name, value in snapshot(model).items():
        assert torch.equal(value, before[name]), name


def test_importance_sampling_stats_in_the_step(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    noise = 0.1 * torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(4))
    batch.sampling_logprobs = torch.where(batch.loss_mask, batch_logprobs(model, batch, 6) + noise, 0.0)
    corrected = LossConfig(is_mode="token_truncate", is_cap=1.05)
    stats = train_step(
        model, build_optimizer(model, lr=1e-3), None, batch, corrected, micro_batch_size=8, **STEP
    )
    logged = stats.as_dict()
    expected = noise[batch.loss_mask]
    assert logged["sampling/logp_difference/mean"] == pytest.approx(expected.abs().mean().item(), abs=1e-5)
    assert logged["sampling/logp_difference/max"] == pytest.approx(expected.abs().max().item(), abs=1e-5)
    assert logged["sampling/importance_ratio/max"] == pytest.approx(1.05)
    assert logged["sampling/importance_ratio/min"] == pytest.approx(
        expected.neg().exp().min().item(), abs=1e-5
    )


def test_lr_follows_the_schedule(make_llama, make_lora, make_batch):
    # warmup 2 then cosine to step 4: factors 0, 0.5, 1, 0.5 (cos at progress 1/2)
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    optimizer = build_optimizer(model, lr=0.1)
    scheduler = build_lr_scheduler(optimizer, "cosine", warmup_steps=2, num_training_steps=4)
    lrs = [
        train_step(model, optimizer, scheduler, batch, LossConfig(), micro_batch_size=6, **STEP).lr
        for _ in range(4)
    ]
    assert lrs == pytest.approx([0.0, 0.05, 0.1, 0.05])


def test_bad_arguments_leave_the_model_untouched(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    optimizer = build_optimizer(model, lr=1e-2)
    before = snapshot(model)
    with pytest.raises(ValueError, match="pass max_completion_length"):
        train_step(model, optimizer, None, batch, LossConfig(loss_type="dr_grpo"), micro_batch_size=8, **STEP)
    with pytest.raises(ValueError, match="unknown is_mode"):
        train_step(model, optimizer, None, batch, LossConfig(is_mode="token"), micro_batch_size=8, **STEP)
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        train_step(model, optimizer, None, batch, LossConfig(), micro_batch_size=0, **STEP)
    with pytest.raises(ValueError, match="is not a peft model"):
        base = make_llama()
        train_step(
            base,
            build_optimizer(base, lr=1e-2),
            None,
            batch,
            LossConfig(beta=0.1),
            micro_batch_size=8,
            **STEP,
        )
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model.get_base_model().model.embed_tokens, lr=1e-2)
    for name, value in snapshot(model).items():
        assert torch.equal(value, before[name]), name
