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


# advantage 0 on rows 1, 3 and 5: a GRPO group whose rewards are all equal, and the like
SOME_ZERO = [0.5, 0.0, 1.5, 0.0, -0.75, 0.0]


def hand_loss(model, batch, loss_type: str = "grpo", max_completion_length: int | None = None):
    """The first pass's loss (ratio 1, no KL) by hand, differentiable: -A_i logp_{i,t} summed over the
    loss tokens of each unpadded row, divided as the loss type says, from a plain forward of every row.
    For grpo: -(1/B) sum_i A_i * mean_t logprob_{i,t}."""
    terms, num_tokens = [], int(batch.loss_mask.sum())
    for row, length in enumerate(batch.attention_mask.sum(1).tolist()):
        ids = batch.input_ids[row, :length]
        logp = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1], -1).gather(-1, ids[1:, None])
        chosen = logp[:, 0][batch.loss_mask[row, 1:length]]
        term = -batch.advantages[row] * chosen.sum()
        if loss_type == "grpo":
            terms.append(term / (len(chosen) * batch.num_sequences))
        elif loss_type == "dapo":
            terms.append(term / num_tokens)
        else:
            terms.append(term / (batch.num_sequences * max_completion_length))
    return sum(terms)


def first_pass_loss(model, batch) -> float:
    with torch.no_grad():
        return hand_loss(model, batch).item()


def test_repeated_steps_raise_the_chosen_tokens_logprobs(make_llama, make_lora, make_batch):
    model, batch = make_lora(make_llama(), perturb=False), make_batch(advantages=[1.0] * 6)
    optimizer = build_optimizer(model, lr=1e-2)
    before = batch_logprobs(model, batch, 6)
    losses = [first_pass_loss(model, batch)]
    for _ in range(6):
        stats = train_step(
            model, optimizer, None, batch, LossConfig(num_iterations=2), micro_batch_size=4, **STEP
        )
        # pass 1 has ratio 1 (loss -1); pass 2 has ratios > 1, clipped at 1.2 for A > 0
        assert -1.2 <= stats.loss.loss.item() < -1.0
        losses.append(first_pass_loss(model, batch))
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
    with pytest.raises(ValueError, match="micro_batch_size=0: use an integer >= 1"):
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


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_rows_without_gradient_are_left_out_and_the_update_is_the_same(
    make_llama, make_lora, make_batch, loss_type
):
    model, batch = make_lora(make_llama(), perturb=True), make_batch(advantages=SOME_ZERO)
    hand_loss(model, batch, loss_type, max_completion_length=8).backward()
    expected = {name: -grad for name, grad in lora_grads(model).items()}  # SGD at lr 1 steps by -grad
    model.zero_grad(set_to_none=True)
    before = snapshot(model)
    sgd = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    stats = train_step(
        model, sgd, None, batch, LossConfig(loss_type=loss_type), micro_batch_size=2,
        max_grad_norm=None, temperature=1.0, max_completion_length=8,
    )  # fmt: skip
    assert stats.num_rows_skipped == 3 and stats.as_dict()["num_rows_skipped"] == 3.0
    assert stats.num_tokens == NUM_TOKENS  # the batch's, skipped rows included
    # at ratio 1 a row's surrogate is -A_i on each of its n_i loss tokens
    advantages, counts = batch.advantages, batch.loss_mask.sum(1).float()
    first_pass = {
        "grpo": -advantages.mean(),
        "dapo": -(advantages * counts).sum() / counts.sum(),
        "dr_grpo": -(advantages * counts).sum() / (batch.num_sequences * 8),
    }[loss_type]
    assert stats.loss.loss.item() == pytest.approx(first_pass.item(), abs=1e-6)
    for name, delta in expected.items():
        torch.testing.assert_close(model.get_parameter(name) - before[name], delta, atol=1e-6, rtol=1e-4)


def test_a_batch_without_gradient_still_steps_adam_on_zero_gradients(make_llama, make_lora, make_batch):
    # Adam moves the weights on a zero gradient (its momentum), and it skips parameters whose grad is None
    models = [make_lora(make_llama(), perturb=True) for _ in range(2)]
    optimizers = [build_optimizer(model, lr=1e-2) for model in models]
    for model, optimizer in zip(models, optimizers, strict=True):
        train_step(model, optimizer, None, make_batch(), LossConfig(), micro_batch_size=3, **STEP)
    (skipping, reference), (optimizer, reference_optimizer) = models, optimizers
    before = snapshot(skipping)
    stats = train_step(
        skipping, optimizer, None, make_batch(advantages=[0.0] * 6), LossConfig(), micro_batch_size=3, **STEP
    )
    assert stats.num_rows_skipped == 5  # the shortest row runs, for a backward of zeros
    for param in reference.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    reference_optimizer.step()
    moved = 0
    for name, value in snapshot(skipping).items():
        torch.testing.assert_close(value, reference.get_parameter(name), atol=0, rtol=0)
        moved += not torch.equal(value, before[name])
    assert moved == sum(p.requires_grad for p in skipping.parameters())


@pytest.mark.parametrize(
    ("loss", "skipped"),
    [
        (LossConfig(loss_type="bnpo"), 0),  # a micro-batch's token mean counts every row in it
        (LossConfig(beta=0.1), 0),  # the KL term of a zero-advantage row is not zero
        (LossConfig(beta=0.1, mask_truncated_completions=True), 2),  # rows 1 and 4 have no loss tokens
        (LossConfig(mask_truncated_completions=True), 4),  # those, and rows 3 and 5 (advantage 0)
    ],
)
def test_rows_whose_term_can_be_nonzero_always_run(make_llama, make_lora, make_batch, loss, skipped):
    model, batch = make_lora(make_llama(), perturb=True), make_batch(advantages=SOME_ZERO)
    stats = train_step(model, build_optimizer(model, lr=1e-3), None, batch, loss, micro_batch_size=4, **STEP)
    assert stats.num_rows_skipped == skipped


def test_the_update_norm_is_the_weights_change(make_llama, make_lora, make_batch):
    # plain SGD without clipping moves the weights by lr x the gradient: the change is lr x grad_norm long
    model, batch = make_lora(make_llama(), perturb=True), make_batch()
    trained = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trained]
    optimizer = torch.optim.SGD(trained, lr=0.05)
    stats = train_step(
        model, optimizer, None, batch, LossConfig(), micro_batch_size=4, max_grad_norm=None, temperature=1.0
    )
    change = sum((p.detach() - b).pow(2).sum().item() for p, b in zip(trained, before, strict=True)) ** 0.5
    assert change > 0
    assert stats.as_dict()["update_norm"] == pytest.approx(change, rel=1e-5)
    assert stats.update_norm == pytest.approx(0.05 * stats.grad_norm, rel=1e-4)
