"""The trainer's CPU attention (rl.algo.attention) gives transformers' eager attention's logprobs and
gradients, through padding and the shared-prefix cache, without saving a copy of the KV heads per query
head."""

import torch

from rl.algo.attention import SDPA_GQA
from rl.algo.logprobs import token_logprobs
from rl.job.model_loading import build_tiny_model, load_model


def prefix_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Four rows sharing a 20-token prompt, with completions of 12, 9, 12 and 5 tokens (right padding)."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, 20), generator=gen).repeat(4, 1)
    ids = torch.cat([prompt, torch.randint(0, vocab, (4, 12), generator=gen)], dim=1)
    mask = torch.ones_like(ids)
    mask[1, 29:], mask[3, 25:] = 0, 0
    return ids, mask


def logprobs_and_grads(model, ids, mask):
    model.zero_grad(set_to_none=True)
    out = token_logprobs(model, ids, mask, temperature=0.8, with_entropy=True, first_target=20)
    (out.logprobs * mask).sum().backward()
    return out.logprobs.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_load_model_picks_it_on_the_cpu():
    model, _ = load_model("tiny_llama", device="cpu")
    assert model.config._attn_implementation == SDPA_GQA


def test_logprobs_and_gradients_match_eager_attention():
    model = build_tiny_model("tiny_llama", vocab_size=300, seed=1)  # 4 query heads over 2 KV heads
    ids, mask = prefix_batch(300)
    model.set_attn_implementation("eager")
    expected, expected_grads = logprobs_and_grads(model, ids, mask)
    model.set_attn_implementation(SDPA_GQA)
    got, grads = logprobs_and_grads(model, ids, mask)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def saved_shapes(model, ids, mask) -> list[tuple[int, ...]]:
    shapes = []

    def pack(tensor):
        shapes.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        token_logprobs(model, ids, mask, first_target=20)
    return shapes


def test_the_backward_keeps_the_kv_heads_once():
    model = build_tiny_model("tiny_llama", vocab_size=300, seed=1)
    ids, mask = prefix_batch(300)
    config = model.config
    layers, heads, kv_heads = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    # The packed row: 19 shared positions (the 20th, the prompt's last, yields the first target's logits),
    # then the rows' remaining 13 + 10 + 13 + 6 tokens. transformers' SDPA keeps its K and V copied once per
    # query head, in every layer.
    model.set_attn_implementation("sdpa")
    assert saved_shapes(model, ids, mask).count((1, heads, 19 + 42, head_dim)) == 2 * layers
    model.set_attn_implementation(SDPA_GQA)
    kept = saved_shapes(model, ids, mask)
    assert not [shape for shape in kept if len(shape) == 4 and shape[1] == heads and shape[2] > 42]
    # each row attends to its own keys: the shared positions and its tokens, once per KV head
    for length, rows in ((13, 2), (10, 1), (6, 1)):
        assert kept.count((1, kv_heads, 19 + length, head_dim)) == 2 * layers * rows
