"""Sampler: top-k / top-p by hand, the empirical distribution, seeds, and the logprob convention."""

import math
import random

import pytest
import torch

from rollout_engine.sampler import SamplingBatch, sample

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def batch(rows, temperature=1.0, top_k=-1, top_p=1.0, seed=0) -> SamplingBatch:
    return SamplingBatch(
        [temperature] * rows, [top_k] * rows, [top_p] * rows, [random.Random(seed + i) for i in range(rows)]
    )


def frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=4).float() / len(tokens)


def test_plain_sampling_follows_the_softmax():
    rows = 20000
    tokens, _ = sample(PROBS.log().expand(rows, 4).clone(), batch(rows))
    torch.testing.assert_close(frequencies(tokens), PROBS, atol=0.015, rtol=0)


def test_top_k_keeps_the_k_most_likely_tokens_renormalised():
    rows = 20000
    tokens, _ = sample(PROBS.log().expand(rows, 4).clone(), batch(rows, top_k=2))
    torch.testing.assert_close(
        frequencies(tokens), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015, rtol=0
    )


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    rows = 20000
    # 0.5 + 0.3 = 0.8 >= 0.7: tokens 2 and 3 fall outside the nucleus.
    tokens, _ = sample(PROBS.log().expand(rows, 4).clone(), batch(rows, top_p=0.7))
    torch.testing.assert_close(
        frequencies(tokens), torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015, rtol=0
    )
    tokens, _ = sample(PROBS.log().expand(rows, 4).clone(), batch(rows, top_p=0.85))
    torch.testing.assert_close(
        frequencies(tokens), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=0.015, rtol=0
    )


def test_logprob_is_of_the_unfiltered_temperature_scaled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    tokens, logprobs = sample(logits, batch(1, temperature=0.5, top_k=1))
    assert tokens.tolist() == [0]  # top_k=1 leaves one candidate, but its logprob is not 0
    expected = 4.0 - math.log(sum(math.exp(v) for v in (4.0, 2.0, 0.0, -2.0)))
    assert logprobs.item() == pytest.approx(expected, abs=1e-6)


def test_greedy_takes_argmax_and_the_logprob_at_temperature_one():
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0]])
    tokens, logprobs = sample(logits, batch(1, temperature=0.0))
    assert tokens.tolist() == [1]
    assert logprobs.item() == pytest.approx(torch.log_softmax(logits[0], -1)[1].item(), abs=1e-6)


def test_each_row_depends_only_on_its_own_seed():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    first, _ = sample(logits, batch(6, seed=10))
    again, _ = sample(
        logits[2:4], SamplingBatch([1.0] * 2, [-1] * 2, [1.0] * 2, [random.Random(12), random.Random(13)])
    )
    assert again.tolist() == first[2:4].tolist()


@pytest.mark.parametrize("vocab", [3000, 3072])  # padded to, and exactly, three 1024-token CDF blocks
def test_sampling_over_a_vocabulary_spanning_several_cdf_blocks(vocab):
    rows = 20000
    logits = torch.full((rows, vocab), -30.0)
    logits[:, [5, 1500, 2999]] = torch.tensor([0.2, 0.5, 0.3]).log()
    tokens, logprobs = sample(logits, batch(rows, seed=3))
    counts = torch.bincount(tokens, minlength=vocab).float() / rows
    torch.testing.assert_close(counts[[5, 1500, 2999]], torch.tensor([0.2, 0.5, 0.3]), atol=0.015, rtol=0)
    assert counts.sum().item() == pytest.approx(1.0) and counts[[5, 1500, 2999]].sum().item() > 0.999
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1).gather(1, tokens[:, None]).squeeze(1))
