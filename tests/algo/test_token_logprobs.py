"""token_logprobs against transformers' own forward on unpadded rows; the adapter-disabled reference."""

import copy

import pytest
import torch

from rl.algo.batch import collate_rollouts
from rl.algo.logprobs import TargetLogprobs, shared_prefix_length, token_logprobs
from rl.algo.trainer import batch_logprobs, first_loss_position, reference_logprobs


def hf_row_logprobs(model, ids, temperature=1.0):
    """log p(ids[t] | ids[:t]) for t >= 1 from a plain forward of one unpadded row."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0, :-1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[1:, None]).squeeze(-1)


def test_right_padded_rows_match_unpadded_forward(make_llama, make_batch):
    model, batch = make_llama(), make_batch()
    with torch.no_grad():
        out = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7, with_entropy=True)
    for row, length in enumerate(batch.attention_mask.sum(1).tolist()):
        expected = hf_row_logprobs(model, batch.input_ids[row, :length], temperature=0.7)
        torch.testing.assert_close(out.logprobs[row, 1:length], expected, atol=1e-5, rtol=1e-5)
        assert out.logprobs[row, 0].item() == 0.0
    # entropy of the next-token distribution at position t-1, from the same forward
    logits = model(input_ids=batch.input_ids[:1, :7]).logits[0, :-1].detach() / 0.7
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(out.entropy[0, 1:7], -(probs * probs.log()).sum(-1), atol=1e-5, rtol=1e-5)


def test_left_padding_gets_the_same_logprobs(make_llama):
    model = make_llama()
    ids = torch.tensor([[11, 12, 13, 14, 15], [0, 0, 21, 22, 23]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    with torch.no_grad():
        out = token_logprobs(model, ids, attention).logprobs
    torch.testing.assert_close(out[1, 3:], hf_row_logprobs(model, ids[1, 2:]), atol=1e-5, rtol=1e-5)


def test_reference_is_the_base_model_with_adapter_disabled(make_llama, make_lora, make_batch):
    base = make_llama()
    base_copy = copy.deepcopy(base)
    model, batch = make_lora(base, perturb=True), make_batch()
    ref = reference_logprobs(model, batch, micro_batch_size=4)
    policy = batch_logprobs(model, batch, micro_batch_size=4)
    first = first_loss_position(batch)  # targets before the earliest loss column are skipped, left at 0
    assert first > 1 and not ref[:, :first].any()
    for row, length in enumerate(batch.attention_mask.sum(1).tolist()):
        expected = hf_row_logprobs(base_copy, batch.input_ids[row, :length])  # targets 1 .. length-1
        in_loss = batch.loss_mask[row, 1:length]
        torch.testing.assert_close(ref[row, 1:length][in_loss], expected[in_loss], atol=1e-5, rtol=1e-5)
    # the perturbed adapter really is active outside the context
    assert (policy - ref)[batch.loss_mask].abs().max().item() > 1e-3


def test_shared_prefix_length_counts_common_attended_columns():
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 1, 9], [5, 6, 7, 8, 2]])
    ones = torch.ones_like(ids)
    assert shared_prefix_length(ids, ones, limit=10) == 3
    assert shared_prefix_length(ids, ones, limit=2) == 2
    assert shared_prefix_length(ids[:1], ones[:1], limit=10) == 0  # one row shares with nobody
    padded = ones.clone()
    padded[2, 1] = 0  # a padded column is never shared
    assert shared_prefix_length(ids, padded, limit=10) == 1


def test_group_rows_share_the_prompt_forward_with_equal_logprobs_and_gradients(make_llama, make_lora):
    """The G rows of one prompt: the shared-prefix path against each row run alone, values and grads."""
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(1, 97, (9,), generator=gen).tolist()
    completions = [torch.randint(1, 97, (n,), generator=gen).tolist() for n in (4, 6, 3, 5)]
    batch = collate_rollouts(
        [prompt] * 4,
        completions,
        [[-1.0] * len(c) for c in completions],
        torch.tensor([1.0, -0.5, 0.25, -2.0]),
        [False] * 4,
        pad_token_id=0,
    )
    first = first_loss_position(batch)
    assert (
        first == len(prompt) and shared_prefix_length(batch.input_ids, batch.attention_mask, first - 1) == 8
    )

    def objective_and_grads(model, rows):
        model.zero_grad()
        total = 0.0
        for r in rows:
            out = token_logprobs(model, batch.input_ids[r], batch.attention_mask[r], 0.9, first_target=first)
            total = total + (out.logprobs * batch.loss_mask[r] * batch.advantages[r, None]).sum()
        total.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return out.logprobs if len(rows) == 1 else None, total.detach(), grads

    model = make_lora(make_llama(), perturb=True)
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    _, shared_total, shared_grads = objective_and_grads(model, [slice(0, 4)])
    hook.remove()
    # one forward of the 8 shared columns, then every row's remaining tokens packed into one row, no padding
    packed = 4 * (len(prompt) - 8) + sum(map(len, completions))
    assert seen == [torch.Size([1, 8]), torch.Size([1, packed])]
    _, alone_total, alone_grads = objective_and_grads(model, [slice(r, r + 1) for r in range(4)])
    torch.testing.assert_close(shared_total, alone_total, atol=1e-5, rtol=1e-5)
    for name, grad in alone_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-6, rtol=1e-4)
    assert any(g.abs().max() > 1e-4 for g in alone_grads.values())


def test_target_logprobs_match_autograd_log_softmax_in_value_entropy_and_gradient():
    gen = torch.Generator().manual_seed(2)
    logits = (3 * torch.randn(6, 50, generator=gen, dtype=torch.float64)).requires_grad_()
    targets = torch.randint(0, 50, (6,), generator=gen)
    upstream = torch.randn(6, generator=gen, dtype=torch.float64)
    picked, entropy = TargetLogprobs.apply(logits, targets, 0.7)
    (grad,) = torch.autograd.grad((picked * upstream).sum(), logits)
    reference_logits = logits.detach().clone().requires_grad_()
    log_probs = torch.log_softmax(reference_logits / 0.7, dim=-1)
    expected = log_probs.gather(-1, targets[:, None])[:, 0]
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), reference_logits)
    torch.testing.assert_close(picked, expected)
    torch.testing.assert_close(entropy, -(log_probs.exp() * log_probs).sum(-1).detach())
    torch.testing.assert_close(grad, expected_grad)
    assert not entropy.requires_grad


def test_a_support_restricts_the_softmax_in_value_entropy_and_gradient():
    """Rows 0 and 2 were sampled among the tokens their support lists; the loss -A log q(y) of
    q = softmax over the support has the gradient -A (onehot(y) - q) / T there, 0 outside it."""
    gen = torch.Generator().manual_seed(3)
    temperature, vocab = 0.8, 12
    logits = (2 * torch.randn(3, vocab, generator=gen, dtype=torch.float64)).requires_grad_()
    support = torch.tensor([[4, 7, 1, -1], [-1, -1, -1, -1], [9, 2, 3, 5]])
    targets = torch.tensor([7, 6, 3])
    advantages = torch.tensor([1.5, -0.5, -2.0], dtype=torch.float64)
    picked, entropy = TargetLogprobs.apply(logits, targets, temperature, support)
    (grad,) = torch.autograd.grad(-(advantages * picked).sum(), logits)
    z = logits.detach() / temperature
    for row, listed in enumerate(support.tolist()):
        ids = [t for t in listed if t >= 0] or list(range(vocab))
        q = torch.zeros(vocab, dtype=torch.float64)
        q[ids] = torch.exp(z[row, ids] - torch.logsumexp(z[row, ids], 0))
        onehot = torch.zeros(vocab, dtype=torch.float64)
        onehot[targets[row]] = 1.0
        assert picked[row].item() == pytest.approx(q[targets[row]].log().item(), abs=1e-12)
        nonzero = q[ids]
        assert entropy[row].item() == pytest.approx(-(nonzero * nonzero.log()).sum().item(), abs=1e-12)
        torch.testing.assert_close(grad[row], -advantages[row] * (onehot - q) / temperature)
