"""The incremental API a server drives: add_request, then step() hands out every sampled token as it is
produced (with its logprob, its top alternatives and, on a sample's last token, its finish reason); the tokens
add up to generate()'s completions, and a request added mid-run joins the running batch at the next step."""

from collections import defaultdict

import pytest
import torch

from rollout_engine import SamplingParams
from rollout_engine.requests import PromptError
from rollout_engine.sampling_params import SamplingParamsError
from tests.helpers.rollout_tiny_models import hf_greedy, make_engine, make_tiny_model, random_prompts


@pytest.fixture(scope="module")
def llama():
    return make_tiny_model("llama", seed=2)


def run_to_end(engine):
    """Step until idle; the tokens each (request id, sample index) received, in order, and the groups."""
    streams, finished = defaultdict(list), {}
    while engine.has_unfinished():
        out = engine.step()
        for token in out.tokens:
            streams[token.request_id, token.sample_index].append(token)
        finished.update((group.request_id, group) for group in out.finished)
    return streams, finished


def hf_log_softmax(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) over the vocabulary at each completion position [len(completion), vocab]."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1)


def test_the_tokens_steps_hand_out_are_the_completions_generate_returns(llama):
    prompts = random_prompts([7, 13], seed=4)
    params = [
        SamplingParams(n=3, temperature=1.0, max_tokens=9, seed=5, stop_token_ids=[]),
        SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[]),
    ]
    engine = make_engine(llama)
    ids = [engine.add_request(prompt, p) for prompt, p in zip(prompts, params, strict=True)]
    streams, finished = run_to_end(engine)
    expected = make_engine(llama).generate(prompts, params)
    assert sorted(finished) == ids
    for request_id, group in zip(ids, expected, strict=True):
        assert finished[request_id].samples == group.samples
        for sample in group.samples:
            stream = streams[request_id, sample.sample_index]
            assert [t.token_id for t in stream] == sample.token_ids
            assert [t.logprob for t in stream] == sample.logprobs
            assert [t.finish_reason for t in stream] == [None] * (len(stream) - 1) + ["length"]
    assert len({tuple(s.token_ids) for s in expected[0].samples}) == 3  # the samples differ
    assert expected[1].samples[0].token_ids == hf_greedy(llama, prompts[1], 6)


def test_a_request_added_mid_run_joins_the_running_batch_at_the_next_step(llama):
    first, second = random_prompts([9, 5], seed=6)
    greedy = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[])
    engine = make_engine(llama)
    first_id = engine.add_request(first, greedy)
    for _ in range(3):  # the prompt, then two decodes: three tokens so far
        assert [t.request_id for t in engine.step().tokens] == [first_id]
    second_id = engine.add_request(second, greedy)
    joined = engine.step().tokens  # the second prompt prefills beside the first request's decode
    assert sorted(t.request_id for t in joined) == sorted([first_id, second_id])
    streams, _ = run_to_end(engine)
    first_tokens = [t.token_id for t in joined if t.request_id == first_id] + [
        t.token_id for t in streams[first_id, 0]
    ]
    second_tokens = [t.token_id for t in joined if t.request_id == second_id] + [
        t.token_id for t in streams[second_id, 0]
    ]
    assert first_tokens == hf_greedy(llama, first, 12)[3:]
    assert second_tokens == hf_greedy(llama, second, 12)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_top_logprobs_are_the_most_likely_tokens_under_the_sampling_distribution(llama, temperature):
    prompt, other = random_prompts([8, 6], seed=7)
    engine = make_engine(llama)
    params = SamplingParams(temperature=temperature, max_tokens=6, seed=1, stop_token_ids=[], top_logprobs=4)
    with_top = engine.add_request(prompt, params)
    without = engine.add_request(other, SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[]))
    streams, finished = run_to_end(engine)
    assert all(t.top_logprobs == [] for t in streams[without, 0])
    assert finished[without].samples[0].top_logprobs == []
    sample = finished[with_top].samples[0]
    assert sample.top_logprobs == [t.top_logprobs for t in streams[with_top, 0]]
    reference = hf_log_softmax(llama, prompt, sample.token_ids, temperature)
    for position, (token, top) in enumerate(zip(sample.token_ids, sample.top_logprobs, strict=True)):
        values, ids = reference[position].topk(4)
        assert [token_id for token_id, _ in top] == ids.tolist()
        torch.testing.assert_close(torch.tensor([lp for _, lp in top]), values, atol=1e-4, rtol=0)
        if temperature == 0:  # greedy: the sampled token is the most likely, with the same logprob
            assert top[0][0] == token
            assert top[0][1] == pytest.approx(sample.logprobs[position], abs=1e-4)


def test_what_add_request_refuses_names_the_field_or_the_prompt(llama):
    engine = make_engine(llama, max_model_len=32)
    with pytest.raises(SamplingParamsError, match="at most max_num_seqs=16") as err:
        engine.add_request([1, 2, 3], SamplingParams(n=17))
    assert err.value.field == "n"
    with pytest.raises(PromptError, match="prompt of 32 tokens leaves no room"):
        engine.add_request(list(range(32)), SamplingParams())
    assert not engine.has_unfinished()
