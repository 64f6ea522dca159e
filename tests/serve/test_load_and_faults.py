"""The server under load and bad input. Twenty-four clients at once (completions and chat, whole and
streamed, greedy and seeded) get transformers' greedy continuations, or the samples their seed gives on an
engine of their own, while mixed in among them: bad bodies (not JSON, nested too deeply, wrong types, values
out of range, prompts longer than the context) each get a 400 naming the field, an unknown model a 404
`model_not_found`; clients that hang up mid-stream, or mid-upload, have nothing left running. Then a storm of
64 short requests is answered in full. Afterwards the server still answers, logged no error, and the engine
took one request per good prompt, each of which ended exactly once (finished, or aborted for a hang-up),
and holds no request and no KV block."""

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from rollout_engine import SamplingParams
from tests.helpers.live_server import (
    MAX_MODEL_LEN,
    MODEL,
    PROMPTS,
    LiveServer,
    chat_ids,
    collect_stream,
    expected_text,
    hf_greedy,
    tiny_engine,
)

HANG_S = 60  # a request unanswered after this long has hung: a timeout that detects hangs, not a timing
NUM_GOOD = 24
NUM_STORM = 64
NUM_HANG_UPS = 4
GREEDY_TOKENS = 12  # the longest greedy reply; shorter ones are a prefix of its reference
HANG_UP_TOKENS = 100  # far more than a hang-up client waits for

LONG_TEXT = "word " * MAX_MODEL_LEN
BAD = [  # (endpoint, body: raw bytes or fields over a good request's, status, the param the error names)
    ("completions", b"{not json", 400, None),
    ("completions", b"[" * 100_000, 400, None),
    ("chat/completions", b'"a string"', 400, None),
    ("completions", {"max_tokens": "ten"}, 400, "max_tokens"),
    ("completions", {"temperature": [1]}, 400, "temperature"),
    ("completions", {"prompt": 5}, 400, "prompt"),
    ("completions", {"max_tokens": -1}, 400, "max_tokens"),
    ("completions", {"n": 0}, 400, "n"),
    ("completions", {"prompt": LONG_TEXT}, 400, "prompt"),
    ("completions", {"prompt": list(range(1, MAX_MODEL_LEN + 10))}, 400, "prompt"),
    ("completions", {"model": "gpt-4"}, 404, "model"),
    ("chat/completions", {"messages": "hi"}, 400, "messages"),
    ("chat/completions", {"messages": {"role": "user", "content": "hi"}}, 400, "messages"),
    ("chat/completions", {"temperature": "hot"}, 400, "temperature"),
    ("chat/completions", {"max_tokens": -5}, 400, "max_tokens"),
    ("chat/completions", {"n": 0}, 400, "n"),
    ("chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}]}, 400, "messages"),
    ("chat/completions", {"model": "gpt-4o"}, 404, "model"),
]


@dataclass(frozen=True, slots=True)
class Good:
    """A good request: greedy (seed None) with one reply, or n=2 samples at temperature 1 from `seed`."""

    chat: bool
    stream: bool
    text: str
    max_tokens: int
    seed: int | None = None

    def body(self) -> dict:
        sampling = (
            {"temperature": 0} if self.seed is None else {"temperature": 1.0, "n": 2, "seed": self.seed}
        )
        prompt = {"messages": messages(self.text)} if self.chat else {"prompt": self.text}
        stream = {"stream": True, "stream_options": {"include_usage": True}} if self.stream else {}
        return {"model": MODEL, "max_tokens": self.max_tokens, **sampling, **prompt, **stream}

    def prompt_ids(self, tokenizer) -> list[int]:
        return chat_ids(tokenizer, messages(self.text)) if self.chat else tokenizer.encode(self.text)

    def params(self) -> SamplingParams:
        return SamplingParams(n=2, temperature=1.0, max_tokens=self.max_tokens, seed=self.seed)


def messages(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@dataclass(slots=True)
class Expected:
    """A good request's reply: the text and finish reason of each choice, and its usage."""

    texts: list[str]
    reasons: list[str]
    prompt_tokens: int
    completion_tokens: int


@dataclass(slots=True)
class Ledger:
    """What the engine took (each request's prompt, by id) and how each request ended."""

    prompts: dict[int, list[int]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)


def watched_engine(model, tokenizer):
    """The tiny engine, with a Ledger of every request it takes and how each ends."""
    engine, ledger = tiny_engine(model, tokenizer), Ledger()
    engine_add, engine_step, engine_abort = engine.add_request, engine.step, engine.abort_request

    def add_request(prompt, params):
        request_id = engine_add(prompt, params)
        ledger.prompts[request_id] = list(prompt)
        return request_id

    def step():
        out = engine_step()
        ledger.finished.extend(group.request_id for group in out.finished)
        return out

    def abort_request(request_id):
        ledger.aborted.append(request_id)
        engine_abort(request_id)

    engine.add_request, engine.step, engine.abort_request = add_request, step, abort_request
    return engine, ledger


def good_requests() -> list[Good]:
    return [
        Good(
            chat=i % 2 == 1,
            stream=i // 2 % 2 == 1,
            text=PROMPTS[i % len(PROMPTS)],
            max_tokens=4 + i % (GREEDY_TOKENS - 3),
            seed=i if i % 3 == 2 else None,
        )
        for i in range(NUM_GOOD)
    ]


def storm_requests() -> list[Good]:
    return [
        Good(chat=i % 2 == 1, stream=False, text=PROMPTS[i % len(PROMPTS)], max_tokens=2)
        for i in range(NUM_STORM)
    ]


def expected_replies(model, tokenizer, goods: list[Good]) -> list[Expected]:
    """Greedy replies from transformers' greedy continuation; seeded ones from the same requests on an engine
    of their own, where nothing else runs beside them."""
    eos = tokenizer.eos_token_id
    greedy = {}
    for good in goods:
        ids = tuple(good.prompt_ids(tokenizer))
        if good.seed is None and ids not in greedy:
            greedy[ids] = hf_greedy(model, list(ids), GREEDY_TOKENS, eos)
    seeded = [good for good in goods if good.seed is not None]
    groups = iter(
        tiny_engine(model, tokenizer).generate(
            [good.prompt_ids(tokenizer) for good in seeded], [good.params() for good in seeded]
        )
    )
    replies = []
    for good in goods:
        prompt = good.prompt_ids(tokenizer)
        if good.seed is None:
            reply = greedy[tuple(prompt)][: good.max_tokens]
            samples = [(reply, "stop" if reply[-1] == eos else "length")]
        else:
            samples = [(s.token_ids, s.finish_reason) for s in next(groups).samples]
        replies.append(
            Expected(
                texts=[expected_text(tokenizer, ids) for ids, _ in samples],
                reasons=[reason for _, reason in samples],
                prompt_tokens=len(prompt),
                completion_tokens=sum(len(ids) for ids, _ in samples),
            )
        )
    return replies


async def ask(client: openai.AsyncOpenAI, good: Good) -> Expected:
    """The server's reply to a good request, whole or gathered from its stream."""
    create = client.chat.completions.create if good.chat else client.completions.create
    reply = await create(**good.body())
    if good.stream:
        texts, reasons, _, usage = collect_stream([chunk async for chunk in reply], chat=good.chat)
        choices = sorted(texts)
        return Expected(
            [texts[i] for i in choices],
            [reasons[i] for i in choices],
            usage.prompt_tokens,
            usage.completion_tokens,
        )
    assert [c.index for c in reply.choices] == list(range(len(reply.choices)))
    return Expected(
        [c.message.content if good.chat else c.text for c in reply.choices],
        [c.finish_reason for c in reply.choices],
        reply.usage.prompt_tokens,
        reply.usage.completion_tokens,
    )


async def refused(http: httpx.AsyncClient, endpoint: str, body, status: int, param: str | None) -> None:
    if isinstance(body, dict):
        good = Good(chat=endpoint.startswith("chat"), stream=False, text=PROMPTS[0], max_tokens=4)
        body = json.dumps({**good.body(), **body}).encode()
    response = await http.post(endpoint, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, (endpoint, body[:80], response.text)
    error = response.json()["error"]
    assert error["param"] == param, (endpoint, body[:80], error)
    assert (param or "JSON") in error["message"]
    assert error["code"] == ("model_not_found" if status == 404 else None)


async def hang_up(http: httpx.AsyncClient, index: int) -> None:
    """A streaming client that reads two events, then closes its connection."""
    good = Good(
        chat=index % 2 == 1, stream=True, text=f"Hang up {index}: {PROMPTS[2]}", max_tokens=HANG_UP_TOKENS
    )
    endpoint = "chat/completions" if good.chat else "completions"
    async with http.stream("POST", endpoint, json=good.body()) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        for _ in range(2):
            while not (await anext(lines)).startswith("data: "):
                pass


async def hang_up_mid_upload(base_url: str) -> None:
    """A client that promises a body longer than it sends, then closes its connection."""
    url = httpx.URL(base_url)
    _, writer = await asyncio.open_connection(url.host, url.port)
    head = f"POST {url.path}/completions HTTP/1.1\r\nHost: {url.host}\r\nContent-Type: application/json\r\n"
    writer.write(f'{head}Content-Length: 1000\r\n\r\n{{"model": "{MODEL}", '.encode())
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def within(work, what: str):
    try:
        return await asyncio.wait_for(work, HANG_S)
    except TimeoutError:
        pytest.fail(f"{what} hung: no reply within {HANG_S} s")


async def load(server: LiveServer, goods: list[Good], storm: list[Good], after: Good) -> list[Expected]:
    """Every client of the first wave at once (good, bad and hanging up), then the storm, then one request
    alone; the good replies in order."""
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=HANG_S)
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(base_url=server.base_url + "/", timeout=HANG_S, limits=limits) as http:
        first_wave = [
            *(within(ask(client, good), f"good request {good}") for good in goods),
            *(within(refused(http, *bad), f"bad request {bad[:2]}") for bad in BAD),
            *(within(hang_up(http, i), f"hang-up {i}") for i in range(NUM_HANG_UPS)),
            within(hang_up_mid_upload(server.base_url), "hang-up mid-upload"),
        ]
        replies = (await asyncio.gather(*first_wave))[: len(goods)]
        replies += await asyncio.gather(*(within(ask(client, g), f"storm request {g}") for g in storm))
    replies.append(await within(ask(client, after), "the request after the load"))
    await client.close()
    return replies


def settle(engine) -> None:
    """Wait for the engine to have finished or dropped every request it took, while the server still runs
    (stopping it would abort whatever is left, and so hide a request nobody aborted)."""
    deadline = time.monotonic() + HANG_S
    while engine.has_unfinished():
        assert time.monotonic() < deadline, f"the engine still runs requests {HANG_S} s after the last reply"
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_under_load_and_bad_input_every_good_reply_is_right_and_nothing_is_left_running(tiny, caplog):
    model, tokenizer = tiny
    after = Good(chat=False, stream=False, text=PROMPTS[3], max_tokens=GREEDY_TOKENS)
    goods, storm = good_requests(), storm_requests()
    expected = expected_replies(model, tokenizer, [*goods, *storm, after])
    engine, ledger = watched_engine(model, tokenizer)
    server = LiveServer(engine, tokenizer)
    asgi_log = logging.getLogger("uvicorn.error")  # set up by the server, so watched only from now on
    asgi_log.addHandler(caplog.handler)
    try:
        replies = asyncio.run(load(server, goods, storm, after))
        settle(engine)
    finally:
        server.close()
        asgi_log.removeHandler(caplog.handler)
    for good, got, want in zip([*goods, *storm, after], replies, expected, strict=True):
        assert got == want, good
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []

    hang_up_ids = [i for i, prompt in ledger.prompts.items() if "Hang up" in tokenizer.decode(prompt)]
    assert len(hang_up_ids) == NUM_HANG_UPS
    assert sorted(ledger.aborted) == sorted(hang_up_ids)  # every hang-up was aborted, and nothing else
    assert len(ledger.prompts) == len(expected) + NUM_HANG_UPS  # one request per good prompt; no bad one
    assert sorted(ledger.finished + ledger.aborted) == sorted(ledger.prompts)  # each ended exactly once
    assert engine.stats()["num_blocks_used"] == 0
