"""Constrained sampling (rollout_engine.constraints) on a tiny random Llama, against transformers' logits, and
on hand-worked distributions; the trainer's logprobs of constrained samples against the engine's."""

import collections
import dataclasses
import math
import random

import pytest
import torch

from rl.algo.batch import collate_rollouts
from rl.algo.logprobs import token_logprobs
from rollout_engine import SamplingParams
from rollout_engine.constraints import (
    CANDIDATE_MASS,
    MAX_CANDIDATES,
    CompletionText,
    ConstraintStats,
    decoder,
)
from rollout_engine.sampling_params import SamplingParamsError
from rollout_engine.sequence import Sequence
from rollout_engine.step_sampling import sample_step
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


def expected_support(logits: torch.Tensor, banned: set[str]) -> list[int]:
    """The tokens a sampled row draws among, worked out from its logits [V] at T = 1: the likeliest ones that
    reach CANDIDATE_MASS together (at most MAX_CANDIDATES), less those whose letter is banned."""
    probs, order = logits.double().softmax(-1).sort(descending=True)
    asked = min(MAX_CANDIDATES, int((probs.cumsum(0) - probs < CANDIDATE_MASS).sum()))
    return sorted(t for t in order[:asked].tolist() if LETTERS[t % 26] not in banned)


def test_sampled_rows_draw_among_the_likeliest_accepted_tokens_with_renormalised_logprobs(llama):
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
            ids = torch.tensor([result.prompt_token_ids + sample.token_ids])
            with torch.no_grad():
                logits = llama(ids).logits[0, len(result.prompt_token_ids) - 1 : -1].float()
            for j, token in enumerate(sample.token_ids):
                support = expected_support(logits[j], banned)
                assert list(sample.support[j]) == support and token in support
                log_probs = torch.log_softmax(logits[j].double(), -1)
                expected = log_probs[token] - log_probs[support].logsumexp(0)
                assert abs(sample.logprobs[j] - expected.item()) < 1e-4
    assert [s.token_ids for s in alone[0].samples] == [s.token_ids for s in together[0].samples]
    assert [s.token_ids for s in free[0].samples] != [s.token_ids for s in together[0].samples]
    assert all(support == () for s in free[0].samples for support in s.support)


def test_sampled_tokens_follow_the_distribution_renormalised_without_the_vetoed_ones():
    """Six tokens a..f; the constraint vetoes a and c. A row samples b, d, e, f with p / (1 - p_a - p_c)."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5])
    p = [math.exp(z) / sum(math.exp(v) for v in logits.tolist()) for z in logits.tolist()]
    kept = {1: p[1], 3: p[3], 4: p[4], 5: p[5]}
    q = {t: v / sum(kept.values()) for t, v in kept.items()}  # p_f = 0.03 and 0.97 before it: all six asked
    rows = 20_000
    params = SamplingParams(n=rows, temperature=1.0, stop_token_ids=[], constraint=NoLetters("ac"))
    seq = Sequence(0, 0, [0], 1, params, [random.Random(i) for i in range(rows)])
    stats = ConstraintStats()
    sampled = sample_step(logits.expand(rows, 6).contiguous(), [seq], Letters(), stats)
    counts = collections.Counter(token for token, _, _, _ in sampled)
    assert set(counts) == set(q)
    for token, share in q.items():
        assert abs(counts[token] / rows - share) < 4 * math.sqrt(share * (1 - share) / rows)
    for token, logprob, _, support in sampled:
        assert support == (1, 3, 4, 5) and logprob == pytest.approx(math.log(q[token]), abs=1e-6)
    assert (stats.checked, stats.vetoed, stats.unmet) == (6, 2, 0)  # asked once: the rows share a completion
    assert stats.supported == rows
    assert stats.support_nats / rows == pytest.approx(-math.log(sum(kept.values())), rel=1e-6)
    top3 = SamplingParams(n=50, temperature=1.0, top_k=3, stop_token_ids=[], constraint=NoLetters("ac"))
    seq = Sequence(1, 1, [0], 1, top3, [random.Random(i) for i in range(50)])
    sampled = sample_step(logits.expand(50, 6).contiguous(), [seq], Letters(), ConstraintStats())
    assert {(token, logprob, support) for token, logprob, _, support in sampled} == {(1, 0.0, (1,))}


def test_the_trainer_recomputes_the_logprobs_of_constrained_samples(llama):
    prompts = random_prompts([5, 8], seed=7)
    params = SamplingParams(n=3, temperature=0.9, max_tokens=10, seed=2, stop_token_ids=[])
    results = make_engine(llama, Letters()).generate(
        prompts, dataclasses.replace(params, constraint=NoLetters("etaoin"))
    )
    samples = [(r.prompt_token_ids, s) for r in results for s in r.samples]
    batch = collate_rollouts(
        [prompt for prompt, _ in samples],
        [s.token_ids for _, s in samples],
        [s.logprobs for _, s in samples],
        torch.zeros(len(samples)),
        [False] * len(samples),
        pad_token_id=0,
        completion_supports=[s.support for _, s in samples],
    )
    with torch.no_grad():
        trained = token_logprobs(
            llama, batch.input_ids, batch.attention_mask, 0.9, support_ids=batch.support_ids
        ).logprobs
    difference = (trained - batch.sampling_logprobs)[batch.loss_mask].abs()
    assert difference.max() < 1e-4
    unmasked = token_logprobs(llama, batch.input_ids, batch.attention_mask, 0.9).logprobs.detach()
    assert (unmasked - batch.sampling_logprobs)[batch.loss_mask].abs().max() > 0.1  # the mask matters


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


TEXTS = [
    "```sql\nSELECT T1.name ,  count(*) FROM singer AS T1 GROUP BY T1.name ORDER BY 2 DESC\n```",
    "Café déjà vu: naïve façade, 東京の天気 and 🎉🎊 emoji 👩‍👩‍👧 in one reply.",
    " don't  won't , it's  ( x ) ; ok !",
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_candidates_text_is_what_decoding_the_whole_completion_with_it_gives(smollm2, text):
    """Every prefix of tokenized replies (multi-byte characters split across byte-level tokens included),
    followed by tokens that complete, split or open characters and by special tokens: the text the constraint
    is shown is the tokenizer's own decoding of the completion with the candidate."""
    tokenizer = smollm2[1]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    decode, local = decoder(tokenizer)
    assert local  # SmolLM2's byte-level BPE does not clean up spaces: the tail path is the one under test
    rng = random.Random(0)
    specials = list(tokenizer.all_special_ids)
    for n in range(len(ids) + 1):
        completion = ids[:n]
        text_of = CompletionText(decode, local, completion)
        assert text_of.start == len(tokenizer.decode(completion, skip_special_tokens=True))
        candidates = ids[n : n + 3] + specials + rng.sample(range(len(tokenizer)), 20)
        for token in candidates:
            assert text_of.after(token) == tokenizer.decode([*completion, token], skip_special_tokens=True)


class CleansSpaces:
    """A tokenizer that writes token i as WORDS[i] and, like transformers' clean-up, joins " n't" to the word
    before it: a rewrite that can reach back past the completion's last tokens."""

    WORDS = [" do", " ", "n", "'", "t", ""]
    clean_up_tokenization_spaces = True

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.WORDS[i] for i in ids).replace(" n't", "n't")


def test_a_tokenizer_that_cleans_up_spaces_decodes_each_candidate_with_its_whole_completion():
    decode, local = decoder(CleansSpaces())
    assert not local
    completion = [0, 1, 2, 5, 5, 3]  # " do n'": its last four tokens hold "n'" without the space before it
    assert CompletionText(decode, local, completion).after(4) == " don't"
    # decoded after the tail alone, the same candidate would read " do n't"
    assert CompletionText(decode, True, completion).after(4) == " do n't"
