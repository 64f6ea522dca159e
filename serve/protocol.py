"""The OpenAI request bodies this server takes, and what the engine needs from them: token-id prompts and
SamplingParams. Anything it cannot honour is a RequestError naming the field (an HTTP 400 in OpenAI's error
shape; 404 for a model not served here), never a silent default: a wrong type, a value out of range (the
engine's own SamplingParams rules), an unknown field, or an OpenAI option at anything but its neutral value
(`echo`, the penalties, `logit_bias`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from transformers import PreTrainedTokenizerBase

from rl.rollout.prompts import prompt_token_ids
from rollout_engine import SamplingParams
from rollout_engine.sampling_params import SamplingParamsError

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; a chat reply may fill the context
# OpenAI options this server accepts at their neutral value only (best_of: at most n, checked on its own)
_NEUTRAL = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": {}, "echo": False, "suffix": ""}
# What a field of several accepted shapes takes, for its error message
_SHAPES = {
    "prompt": "a string, a list of strings, a list of token ids, or a list of lists of token ids",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts ({'type': 'text', 'text': ...})",
}


class RequestError(ValueError):
    """A request this server refuses: `param` names the field, the message says what it takes. `status` is
    the HTTP status (400; 404 for a model not served here, as OpenAI answers) and `code` OpenAI's error code
    where it has one (`model_not_found`)."""

    def __init__(self, param: str | None, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.status = status
        self.code = code


class _Strict(BaseModel):
    # strict: "2" is not 2 and true is not 1; forbid: an option this server does not know is refused
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Request(_Strict):
    """What both endpoints take; null stands for the default, as OpenAI takes it."""

    model: str
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # beyond OpenAI, as vLLM takes it
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


class ChatRequest(_Request):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


def parse(model: type[_Request], body: object) -> _Request:
    """The request body as `model`, or a RequestError naming the first field that does not fit."""
    if not isinstance(body, dict):
        raise RequestError(None, "the request body must be a JSON object")
    try:
        request = model.model_validate(body)
    except ValidationError as err:
        raise _field_error(err.errors()[0]) from None
    for name, neutral in _NEUTRAL.items():
        value = getattr(request, name, None)
        if value is not None and value != neutral:
            raise RequestError(name, f"{name}={value!r} is not supported by this server; leave it out")
    best_of = getattr(request, "best_of", None)
    if best_of is not None and best_of != default(request.n, 1):
        raise RequestError("best_of", f"best_of={best_of!r} is not supported by this server; leave it out")
    return request


def default(value, fallback):
    """`value`, or `fallback` where the request left it out or sent null."""
    return fallback if value is None else value


def _field_error(error: dict) -> RequestError:
    """pydantic's first error as a RequestError whose param is the field's path (messages[0].role)."""
    path = ""
    for part in error["loc"]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part[:1].isupper() or "[" in part or part in ("str", "int", "float", "bool"):
            break  # a union member's name, not a field
        else:
            path += f".{part}" if path else part
    field = path.rsplit(".", 1)[-1].split("[", 1)[0]
    if error["type"] == "extra_forbidden":
        return RequestError(path, f"{path} is not an option this server takes; leave it out")
    if error["type"] == "missing":
        return RequestError(path, f"{path} is required")
    if field in _SHAPES:
        return RequestError(path, f"{path} must be {_SHAPES[field]}, got {error['input']!r}")
    return RequestError(path, f"{path} is invalid: {error['msg']}, got {error['input']!r}")


def completion_prompts(request: CompletionRequest, tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    """Each prompt of a completions request as token ids (text is tokenized as the tokenizer does by
    default); a list of prompts is a batch."""
    prompt = request.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not prompt:
        raise RequestError("prompt", "prompt is empty: pass a string or token ids")
    return [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]


def chat_prompt(request: ChatRequest, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The messages through the tokenizer's chat template, ending with the assistant's turn to speak, as the
    training job's prompts are made."""
    if not request.messages:
        raise RequestError("messages", "messages is empty: pass at least one message")
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    try:
        return prompt_token_ids(tokenizer, messages)
    except Exception as err:  # the template's own refusal (a role order it does not take ...)
        raise RequestError("messages", f"the chat template refused the messages: {err}") from None


def sampling_params(
    request: _Request, max_tokens: int, top_logprobs: int, names: dict[str, str]
) -> SamplingParams:
    """The engine's settings for the request; a value the engine refuses is a RequestError on the field the
    request called it by (`names` maps SamplingParams fields to those where they differ)."""
    stop = [request.stop] if isinstance(request.stop, str) else request.stop
    try:
        return SamplingParams(
            n=default(request.n, 1),
            temperature=default(request.temperature, 1.0),
            top_p=default(request.top_p, 1.0),
            top_k=default(request.top_k, -1),
            max_tokens=max_tokens,
            seed=request.seed,
            stop=stop or None,
            top_logprobs=top_logprobs,
        )
    except SamplingParamsError as err:
        raise engine_error(err, names) from None


def engine_error(err: SamplingParamsError, names: dict[str, str]) -> RequestError:
    param = names.get(err.field, err.field)
    return RequestError(param, f"{param} {err.problem}")
