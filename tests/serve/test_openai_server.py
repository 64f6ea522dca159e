"""The server through the official `openai` client: greedy replies are transformers' greedy continuations,
n samples differ and repeat with their seed, logprobs are transformers' log-softmax of the sampled tokens,
stop strings cut the text, a stream adds up to the whole reply, concurrent requests share engine steps, a bad
request is a 400 naming its field while the server goes on serving, and an unknown model is OpenAI's 404
`model_not_found`."""

import threading
import time

import httpx
import openai
import pytest
import torch

from rollout_engine import SamplingParams, StepOutput
from tests.helpers.live_server import (
    MAX_MODEL_LEN,
    MODEL,
    PROMPTS,
    LiveServer,
    chat_ids,
    collect_stream,
    expected_text,
    hf_greedy,
    hf_log_softmax,
    tiny_engine,
)

MESSAGES = [{"role": "system", "content": "Answer in SQL."}, {"role": "user", "content": "How many pets?"}]


def test_models_lists_the_one_served_model(client):
    (card,) = client.models.list().data
    assert card.id == MODEL and card.owned_by == "pagedrl"


def test_greedy_completions_are_transformers_greedy_continuations(client, tiny):
    model, tokenizer = tiny
    reply = client.completions.create(model=MODEL, prompt=PROMPTS[:2], max_tokens=12, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1]
    ids = [tokenizer.encode(p) for p in PROMPTS[:2]]
    references = [hf_greedy(model, prompt, 12, tokenizer.eos_token_id) for prompt in ids]
    for choice, reference in zip(reply.choices, references, strict=True):
        assert choice.text == expected_text(tokenizer, reference)
        assert choice.finish_reason == ("stop" if reference[-1] == tokenizer.eos_token_id else "length")
    assert reply.usage.prompt_tokens == sum(map(len, ids))
    assert reply.usage.completion_tokens == sum(map(len, references))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_prompt_of_token_ids_is_taken_as_it_is(client, tiny):
    model, tokenizer = tiny
    prompt = [520, 9531, 198, 4093, 17]
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    reference = hf_greedy(model, prompt, 8, tokenizer.eos_token_id)
    assert reply.choices[0].text == expected_text(tokenizer, reference)
    assert reply.usage.prompt_tokens == len(prompt)


def test_greedy_chat_is_the_templated_prompts_greedy_continuation(client, tiny):
    model, tokenizer = tiny
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0)
    prompt = chat_ids(tokenizer, MESSAGES)
    reference = hf_greedy(model, prompt, 10, tokenizer.eos_token_id)
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text(tokenizer, reference)
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), len(reference))


def test_a_chat_reply_without_max_tokens_may_fill_the_context(client, tiny):
    model, tokenizer = tiny
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0)
    prompt = chat_ids(tokenizer, MESSAGES)
    reference = hf_greedy(model, prompt, MAX_MODEL_LEN - len(prompt), tokenizer.eos_token_id)
    assert reply.choices[0].message.content == expected_text(tokenizer, reference)
    assert reply.usage.completion_tokens == len(reference) == MAX_MODEL_LEN - len(prompt)
    assert reply.choices[0].finish_reason == "length"


def test_n_samples_differ_and_repeat_with_their_seed(client):
    def texts(seed):
        reply = client.completions.create(
            model=MODEL, prompt=PROMPTS[2], n=4, temperature=1.0, max_tokens=8, seed=seed
        )
        assert [c.index for c in reply.choices] == [0, 1, 2, 3]
        return [c.text for c in reply.choices]

    first = texts(7)
    assert len(set(first)) == 4
    assert texts(7) == first
    assert texts(8) != first
    chat = [
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, max_tokens=6, seed=3)
        for _ in range(2)
    ]
    contents = [[c.message.content for c in reply.choices] for reply in chat]
    assert contents[0] == contents[1] and len(set(contents[0])) == 3


def test_greedy_logprobs_are_transformers_log_softmax(client, tiny):
    model, tokenizer = tiny
    prompt = tokenizer.encode(PROMPTS[0])
    reply = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0, logprobs=3)
    reference = hf_greedy(model, prompt, 8, tokenizer.eos_token_id)
    logprobs = reply.choices[0].logprobs
    assert logprobs.tokens == [tokenizer.decode([t]) for t in reference]
    distribution = hf_log_softmax(model, prompt, reference, 0.0)
    expected = distribution.gather(1, torch.tensor(reference)[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(logprobs.token_logprobs), expected, atol=1e-4, rtol=0)
    for position, top in enumerate(logprobs.top_logprobs):
        values, ids = distribution[position].topk(3)  # the greedy token is the first of them
        names = [tokenizer.decode([i]) for i in ids.tolist()]
        assert top == pytest.approx(dict(zip(names, values.tolist(), strict=True)))
    assert logprobs.text_offset[0] == 0
    assert logprobs.text_offset[1:] == [
        sum(len(t) for t in logprobs.tokens[:i]) for i in range(1, len(logprobs.tokens))
    ]


def test_sampled_logprobs_are_transformers_log_softmax_at_the_temperature(client, tiny):
    model, tokenizer = tiny
    prompt = chat_ids(tokenizer, MESSAGES)
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0.7, seed=11, logprobs=True, top_logprobs=2
    )
    # the sampled tokens' ids: the same seeded request on an engine of its own (its samples do not depend
    # on the batch they run in); the reply's token texts confirm them
    own_engine = tiny_engine(model, tokenizer)
    (group,) = own_engine.generate([prompt], SamplingParams(temperature=0.7, max_tokens=8, seed=11))
    sampled = group.samples[0].token_ids
    content = reply.choices[0].logprobs.content
    assert [entry.token for entry in content] == [tokenizer.decode([t]) for t in sampled]
    assert [bytes(entry.bytes) for entry in content] == [tokenizer.decode([t]).encode() for t in sampled]
    distribution = hf_log_softmax(model, prompt, sampled, 0.7)
    expected = distribution.gather(1, torch.tensor(sampled)[:, None]).squeeze(1)
    got = torch.tensor([entry.logprob for entry in content])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    for position, entry in enumerate(content):
        values, ids = distribution[position].topk(2)
        assert [t.token for t in entry.top_logprobs] == [tokenizer.decode([i]) for i in ids.tolist()]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(values.tolist(), abs=1e-4)


def test_a_stop_string_cuts_the_text_before_it(client):
    full = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0)
    text = full.choices[0].text
    # a stop string from the second half of the text, where it first occurs (it may span tokens)
    start = next(k for k in range(len(text) // 2, len(text) - 3) if text.find(text[k : k + 3]) == k)
    stop = text[start : start + 3]
    for stream in (False, True):
        request = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=16, temperature=0, stream=stream)
        reply = client.completions.create(**request, stop=[stop, "never seen"])
        chunks = list(reply) if stream else [reply]
        assert "".join(c.choices[0].text for c in chunks) == text[:start]
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_completion_stream_adds_up_to_the_whole_reply(client):
    request = dict(model=MODEL, prompt=PROMPTS[3], n=2, max_tokens=12, seed=5, logprobs=1)
    whole = client.completions.create(**request)
    stream = client.completions.create(**request, stream=True, stream_options={"include_usage": True})
    texts, reasons, logprobs, usage = collect_stream(stream, chat=False)
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert logprobs == {c.index: c.logprobs.token_logprobs for c in whole.choices}
    assert usage == whole.usage


def test_a_chat_stream_adds_up_to_the_whole_reply(client):
    request = dict(model=MODEL, messages=MESSAGES, n=2, max_tokens=12, seed=6, logprobs=True)
    whole = client.chat.completions.create(**request)
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert {c.delta.role for c in chunks[0].choices} == {"assistant"}  # who speaks comes first
    texts, reasons, logprobs, usage = collect_stream(chunks, chat=True)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert logprobs == {c.index: c.logprobs.content for c in whole.choices}
    assert usage is None  # not asked for


def test_concurrent_requests_share_engine_steps_and_get_their_own_greedy_answers(tiny):
    model, tokenizer = tiny
    num_clients = 8
    engine = tiny_engine(model, tokenizer)
    all_arrived, steps = threading.Event(), []
    engine_step, engine_add = engine.step, engine.add_request

    def add_request(prompt, params):  # the loop thread adds each request as it arrives
        request_id = engine_add(prompt, params)
        if request_id == num_clients - 1:
            all_arrived.set()
        return request_id

    def step():  # no step until every client's request is in, so that they share the first one
        if not all_arrived.is_set():
            time.sleep(0.01)
            return StepOutput()
        out = engine_step()
        steps.append({t.request_id for t in out.tokens})
        return out

    engine.add_request, engine.step = add_request, step
    server = LiveServer(engine, tokenizer)
    prompts = [f"Item {i}: {PROMPTS[i % len(PROMPTS)]}" for i in range(num_clients)]
    replies = [None] * num_clients

    def ask(i):
        client = server.client()
        reply = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=10, temperature=0)
        replies[i] = reply.choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(num_clients)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        server.close()
    assert steps[0] == set(range(num_clients))  # all eight prefilled and sampled in one step
    for prompt, reply in zip(prompts, replies, strict=True):
        reference = hf_greedy(model, tokenizer.encode(prompt), 10, tokenizer.eos_token_id)
        assert reply == expected_text(tokenizer, reference)


LONG_PROMPT = "word " * MAX_MODEL_LEN
BAD_COMPLETIONS = [
    (dict(n=0), "n"),
    (dict(n="2"), "n"),
    (dict(n=True), "n"),
    (dict(n=17), "n"),  # more samples than max_num_seqs run together
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature="hot"), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(seed=1.5), "seed"),
    (dict(logprobs=21), "logprobs"),
    (dict(stop=[""]), "stop"),
    (dict(stop=3), "stop"),
    (dict(prompt=LONG_PROMPT), "prompt"),
    (dict(prompt=[]), "prompt"),
    (dict(prompt=[1, 10**9]), "prompt"),
    (dict(echo=True), "echo"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(extra_body={"min_p": 0.1}), "min_p"),
]
BAD_CHATS = [
    (dict(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role"),
    (dict(messages=[{"role": "user"}]), "messages[0].content"),
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "user", "content": LONG_PROMPT}]), "messages"),
    (dict(max_completion_tokens=0), "max_completion_tokens"),
    (dict(logprobs=True, top_logprobs=30), "top_logprobs"),
    (dict(top_logprobs=2), "top_logprobs"),  # without logprobs: true
]


@pytest.mark.parametrize("bad, param", BAD_COMPLETIONS + [({"chat": True, **b}, p) for b, p in BAD_CHATS])
def test_a_bad_request_is_a_400_naming_the_field_and_the_server_goes_on(client, tiny, bad, param):
    bad = dict(bad)
    chat = bad.pop("chat", False)
    request = dict(model=MODEL, max_tokens=4, temperature=0)
    request.update({"messages": MESSAGES} if chat else {"prompt": "Hi"})
    create = client.chat.completions.create if chat else client.completions.create
    with pytest.raises(openai.BadRequestError) as err:
        create(**{**request, **bad})
    assert err.value.status_code == 400
    assert err.value.param == param
    assert param.split("[")[0] in err.value.message
    model, tokenizer = tiny
    reply = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=4, temperature=0)
    reference = hf_greedy(model, tokenizer.encode(PROMPTS[0]), 4, tokenizer.eos_token_id)
    assert reply.choices[0].text == expected_text(tokenizer, reference)


@pytest.mark.parametrize("chat", [False, True])
def test_an_unknown_model_is_a_404_model_not_found_as_openai_answers(client, chat):
    create = client.chat.completions.create if chat else client.completions.create
    prompt = {"messages": MESSAGES} if chat else {"prompt": "Hi"}
    with pytest.raises(openai.NotFoundError) as err:
        create(model="gpt-4", max_tokens=4, **prompt)
    assert (err.value.code, err.value.param) == ("model_not_found", "model")
    assert f"this server serves {MODEL!r}" in err.value.message


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]"])
def test_a_body_that_is_not_a_json_object_is_a_400(live, body):
    response = httpx.post(f"{live.base_url}/completions", content=body, timeout=30)
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_engine_step_fails_its_requests_with_a_500_and_the_server_goes_on(tiny, stream):
    model, tokenizer = tiny
    engine = tiny_engine(model, tokenizer)
    engine_step, calls = engine.step, []

    def step():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("a kernel failed")
        return engine_step()

    engine.step = step
    server = LiveServer(engine, tokenizer)
    client = server.client()
    try:
        failing = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, stream=stream)
        # a 500, or in a stream an error event after the first token's chunk
        expected = openai.APIError if stream else openai.InternalServerError
        with pytest.raises(expected, match="a kernel failed"):
            reply = client.completions.create(**failing)
            if stream:
                list(reply)
        reply = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0)
    finally:
        server.close()
    reference = hf_greedy(model, tokenizer.encode(PROMPTS[0]), 6, tokenizer.eos_token_id)
    assert reply.choices[0].text == expected_text(tokenizer, reference)
    assert engine.stats()["num_blocks_used"] == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_has_its_request_aborted(tiny, stream):
    model, tokenizer = tiny
    engine = tiny_engine(model, tokenizer)
    engine_step, engine_abort, aborted = engine.step, engine.abort_request, []

    def slow_step():  # 100 tokens take seconds, far longer than the client waits
        time.sleep(0.05)
        return engine_step()

    def abort_request(request_id):
        aborted.append(request_id)
        engine_abort(request_id)

    engine.step, engine.abort_request = slow_step, abort_request
    server = LiveServer(engine, tokenizer)
    body = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=100, temperature=0, stream=stream)
    try:
        if stream:
            with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=30) as response:
                next(response.iter_lines())  # the first token's chunk, then the client hangs up
        else:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{server.base_url}/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 10
        while not aborted and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.close()
    assert aborted == [0]
    assert engine.num_generated_tokens < 100
