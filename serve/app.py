"""The OpenAI-compatible HTTP server over the engine: GET /v1/models, POST /v1/completions and
POST /v1/chat/completions, whole or streamed as server-sent events (`stream: true`, ending `data: [DONE]`).

Every request is checked on the event loop before it reaches the engine (a refusal is an HTTP 400 naming the
field, or OpenAI's 404 `model_not_found` for a model not served here), then handed to the engine loop's
thread, which batches it with whatever else is running; its tokens come back after every step and go out as
soon as their text is final.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from transformers import PreTrainedTokenizerBase

from rollout_engine import SamplingParams, TokenOutput
from rollout_engine.requests import PromptError
from rollout_engine.sampling_params import SamplingParamsError
from serve.engine_loop import EngineLoop
from serve.protocol import (
    COMPLETIONS_MAX_TOKENS,
    ChatRequest,
    CompletionRequest,
    RequestError,
    chat_prompt,
    completion_prompts,
    default,
    engine_error,
    parse,
    sampling_params,
)
from serve.replies import ChatShape, Choice, CompletionShape, usage
from serve.text import SampleText

Shape = CompletionShape | ChatShape
DISCONNECT_POLL_S = 0.5  # how often a whole (not streamed) reply checks that its client is still there


@dataclass(slots=True)
class Reply:
    """A checked request: its prompts and settings, and how its reply is shaped."""

    prompts: list[list[int]]
    params: SamplingParams
    shape: Shape
    logprobs: bool
    stream: bool
    include_usage: bool
    choices: list[Choice]


class Server:
    """The routes' state: the engine loop, the tokenizer, and the one model name this server answers to."""

    def __init__(self, loop: EngineLoop, tokenizer: PreTrainedTokenizerBase, model_name: str) -> None:
        if loop.engine is None:
            raise RuntimeError("start the engine loop (EngineLoop.start) before serving from it")
        self.loop = loop
        self.engine = loop.engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.created = int(time.time())

    def models(self) -> dict:
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "pagedrl"}
        return {"object": "list", "data": [{**card, "max_model_len": self.engine.max_model_len}]}

    def completion(self, body: object) -> Reply:
        request = parse(CompletionRequest, body)
        self._check_model(request.model)
        prompts = completion_prompts(request, self.tokenizer)
        names = {"top_logprobs": "logprobs"}
        max_tokens = default(request.max_tokens, COMPLETIONS_MAX_TOKENS)
        params = sampling_params(request, max_tokens, default(request.logprobs, 0), names)
        self._check_prompts(prompts, params, "prompt", names)
        shape = CompletionShape(self.tokenizer)
        return self._reply(request, prompts, params, shape, request.logprobs is not None)

    def chat(self, body: object) -> Reply:
        request = parse(ChatRequest, body)
        self._check_model(request.model)
        prompt = chat_prompt(request, self.tokenizer)
        if request.top_logprobs and not request.logprobs:
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        given = "max_tokens" if request.max_completion_tokens is None else "max_completion_tokens"
        max_tokens = default(request.max_completion_tokens, request.max_tokens)
        if max_tokens is None:  # the rest of the context
            max_tokens = max(1, self.engine.max_model_len - len(prompt))
        names = {"max_tokens": given}
        params = sampling_params(request, max_tokens, default(request.top_logprobs, 0), names)
        self._check_prompts([prompt], params, "messages", names)
        return self._reply(request, [prompt], params, ChatShape(self.tokenizer), bool(request.logprobs))

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            message = f"model {model!r} is not served here; this server serves {self.model_name!r}"
            raise RequestError("model", message, status=404, code="model_not_found")

    def _check_prompts(self, prompts, params: SamplingParams, param: str, names: dict[str, str]) -> None:
        for prompt in prompts:
            try:
                self.engine.check_request(prompt, params)
            except SamplingParamsError as err:
                raise engine_error(err, names) from None
            except PromptError as err:
                raise RequestError(param, f"{param}: {err}") from None

    def _reply(self, request, prompts, params: SamplingParams, shape: Shape, logprobs: bool) -> Reply:
        choices = [
            Choice(i, SampleText(self.tokenizer, params.stop or [])) for i in range(len(prompts) * params.n)
        ]
        options = request.stream_options
        return Reply(
            prompts,
            params,
            shape,
            logprobs,
            bool(request.stream),
            options is not None and options.include_usage,
            choices,
        )

    async def updates(self, reply: Reply) -> AsyncIterator[list[tuple[Choice, TokenOutput, str]]]:
        """Each step's new tokens of the reply's samples, with the text each releases; the engine drops the
        reply's requests when it ends early (an error, or a client that went away)."""
        aio, events = asyncio.get_running_loop(), asyncio.Queue()
        tickets = [
            self.loop.submit(prompt, reply.params, partial(_post, aio, events, i))
            for i, prompt in enumerate(reply.prompts)
        ]
        num_open = len(reply.choices)
        try:
            while num_open:
                prompt_index, item = await events.get()
                if isinstance(item, BaseException):
                    raise item
                step = []
                for token in item:
                    choice = reply.choices[prompt_index * reply.params.n + token.sample_index]
                    step.append((choice, token, choice.add(token)))
                    num_open -= token.finish_reason is not None
                yield step
        finally:
            if num_open:
                for ticket in tickets:
                    self.loop.abort(ticket)

    async def whole(self, reply: Reply, ident: str) -> dict:
        async for _ in self.updates(reply):
            pass
        shape = reply.shape
        choices = [
            shape.choice(c, c.text.text, shape.logprobs(c, c.tokens) if reply.logprobs else None, chunk=False)
            for c in reply.choices
        ]
        return {
            **_header(ident, shape.object, self.model_name),
            "choices": choices,
            "usage": usage(reply.prompts, reply.choices),
        }

    async def stream(self, reply: Reply, ident: str) -> AsyncIterator[str]:
        shape = reply.shape
        header = _header(ident, shape.chunk_object, self.model_name)
        try:
            if isinstance(shape, ChatShape):
                yield _event({**header, "choices": [shape.role_chunk_choice(c) for c in reply.choices]})
            async for step in self.updates(reply):
                for choice, token, text in step:
                    if not (text or reply.logprobs or choice.finish_reason):
                        continue  # held back: nothing to say yet
                    logprobs = shape.logprobs(choice, [token]) if reply.logprobs else None
                    yield _event({**header, "choices": [shape.choice(choice, text, logprobs, chunk=True)]})
            if reply.include_usage:
                yield _event({**header, "choices": [], "usage": usage(reply.prompts, reply.choices)})
        except RuntimeError as err:  # the engine failed mid-stream: the client raises this error
            yield _event(_error(500, None, str(err)))
        yield "data: [DONE]\n\n"


def _post(aio: asyncio.AbstractEventLoop, events: asyncio.Queue, prompt_index: int, item) -> None:
    """The engine loop's sink for one prompt: hands its item to the event loop that awaits it."""
    aio.call_soon_threadsafe(events.put_nowait, (prompt_index, item))


def _header(ident: str, kind: str, model: str) -> dict:
    return {"id": ident, "object": kind, "created": int(time.time()), "model": model}


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _error(status: int, param: str | None, message: str, code: str | None = None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


async def _unless_disconnected(request: Request, work):
    """What the coroutine `work` returns; it is cancelled (and so its requests aborted) once the client has
    gone away, which is checked every DISCONNECT_POLL_S seconds."""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
        if await request.is_disconnected():
            task.cancel()
            break
    return await task


async def _body(request: Request) -> object:
    try:
        return await request.json()
    except ValueError:
        raise RequestError(None, "the request body is not valid JSON") from None
    except RecursionError:  # json's parser recurses once per level of nesting
        raise RequestError(None, "the request body nests too deeply to read as JSON") from None


def build_app(loop: EngineLoop, tokenizer: PreTrainedTokenizerBase, model_name: str) -> FastAPI:
    """The server's routes over the started engine `loop`, which the app stops when it shuts down."""
    server = Server(loop, tokenizer, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        loop.stop()

    app = FastAPI(title="pagedrl", lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def refused(request: Request, err: RequestError) -> JSONResponse:
        return JSONResponse(_error(err.status, err.param, str(err), err.code), status_code=err.status)

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, err: ClientDisconnect) -> Response:
        # the client hung up before its body was in; nobody reads this reply (499: nginx's "client closed")
        return Response(status_code=499)

    @app.exception_handler(RuntimeError)
    async def failed(request: Request, err: RuntimeError) -> JSONResponse:
        return JSONResponse(_error(500, None, str(err)), status_code=500)

    async def respond(request: Request, reply: Reply):
        ident = f"{reply.shape.id_prefix}-{uuid.uuid4().hex}"
        if reply.stream:  # a stream is closed when its client goes away, which aborts its requests
            return StreamingResponse(server.stream(reply, ident), media_type="text/event-stream")
        return JSONResponse(await _unless_disconnected(request, server.whole(reply, ident)))

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await respond(request, server.completion(await _body(request)))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await respond(request, server.chat(await _body(request)))

    return app


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one, which getsockname() gives)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def run_server(app: FastAPI, sock: socket.socket) -> None:
    """Serve `app` on `sock` until Ctrl-C (or SIGTERM); requests still streaming get 5 s to finish, then it
    returns."""
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    # uvicorn shuts down, then passes the Ctrl-C on: KeyboardInterrupt, or nothing where SIGINT is ignored
    with suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])
    print("server stopped")
