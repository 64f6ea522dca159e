"""token_logprobs against transformers' own forward on unpadded rows; the adapter-disabled reference."""

import copy

import torch

from rl.logprobs import token_logprobs
from rl.trainer import batch_logprobs, first_loss_position, reference_logprobs


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
