"""Constrained sampling (rollout_engine.constraints) on a tiny random Llama, against transformers' logits."""

import dataclasses

import pytest
import torch

from rollout_engine import SamplingParams
from rollout_engine.constraints import MAX_CANDIDATES
from rollout_engine.sampling_params import SamplingParamsError
from tests.helpers.rollout_tiny_models import (
    hf_greedy,
    hf_logprobs,
    make_engine,
    make_tiny_model,
    random_prompts,
)

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Letters:
    """A tokenizer whose token i reads as one letter, LETTERS[i % 26]."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join(LETTERS[i % 26] for i in ids)


class NoLetters:
    """Refuses new text that holds one of `banned`."""

    def __init__(self, banned):
        self.banned = set(banned)

    def accepts(self, text, start):
        return not self.banned & set(text[start:])


class Nothing:
    def accepts(self, text, start):
        return False


@pytest.fixture(scope="module")
def llama():
    return make_tiny_model("llama", seed=4)


def hf_constrained_greedy(model, prompt, banned, max_new_tokens):
    """Greedy decoding that takes, at each step, the likeliest token whose letter is not banned."""
    completion = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0, -1]
        order = logits.argsort(descending=True).tolist()
        completion.append(next(t for t in order if LETTERS[t % 26] not in banned))
    return completion


def test_greedy_takes_the_likeliest_token_the_constraint_accepts(llama):
    prompts = random_prompts([5, 9, 3], seed=3)
    free = [hf_greedy(llama, p, 8) for p in prompts]
    banned = {LETTERS[t % 26] for t in free[0][:3] + free[1][:2]}  # the unconstrained path must change
    engine = make_engine(llama, Letters())
    params = SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[], constraint=NoLetters(banned))
    results = engine.generate(prompts, params)
    for prompt, result in zip(prompts, results, strict=True):
        (sample,) = result.samples
        assert sample.token_ids == hf_constrained_greedy(llama, prompt, banned, 8)
        assert not banned & set(Letters().decode(sample.token_ids))
        # logprobs are the policy's own, before any token was vetoed (the sampler's convention)
        torch.testing.assert_close(
            torch.tensor(sample.logprobs),
            hf_logprobs(llama, prompt, sample.token_ids, 0.0),
            atol=1e-4,
            rtol=0,
        )
    stats = engine.stats()
    assert stats["constraint_vetoes"] >= 5 and stats["constraint_unmet"] == 0
    assert stats["constraint_checks"] == stats["num_generated_tokens"] + stats["constraint_vetoes"]


def test_sampled_rows_draw_again_from_their_own_stream(llama):
    prompts = random_prompts([6, 4], seed=5)
    banned = set("aeiou")
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=11, stop_token_ids=[])
    constrained = dataclasses.replace(params, constraint=NoLetters(banned))
    engine = make_engine(llama, Letters())
    free = engine.generate(prompts, params)
    together = engine.generate(prompts, constrained)
    alone = engine.generate(prompts[:1], constrained)
    for result in together:
        for sample in result.samples:
            assert not banned & set(Letters().decode(sample.token_ids))
            torch.testing.assert_close(
                torch.tensor(sample.logprobs),
                hf_logprobs(llama, result.prompt_token_ids, sample.token_ids, 1.0),
                atol=1e-4,
                rtol=0,
            )
    assert [s.token_ids for s in alone[0].samples] == [s.token_ids for s in together[0].samples]
    assert [s.token_ids for s in free[0].samples] != [s.token_ids for s in together[0].samples]


def test_a_sample_no_candidate_can_satisfy_goes_on_unconstrained(llama):
    (prompt,) = random_prompts([7], seed=6)
    engine = make_engine(llama, Letters())
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[], constraint=Nothing())
    (result,) = engine.generate([prompt], params)
    assert result.samples[0].token_ids == hf_greedy(llama, prompt, 6)
    stats = engine.stats()
    assert (stats["constraint_unmet"], stats["constraint_checks"]) == (1, MAX_CANDIDATES)


def test_a_constraint_needs_accepts_and_the_engine_a_tokenizer(llama):
    with pytest.raises(SamplingParamsError, match="constraint"):
        SamplingParams(constraint=object())
    engine = make_engine(llama)
    with pytest.raises(SamplingParamsError, match="tokenizer"):
        engine.generate(random_prompts([3]), SamplingParams(max_tokens=2, constraint=Nothing()))
