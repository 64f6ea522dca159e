"""The shapes of OpenAI's replies: a completion and a chat completion, whole or as stream chunks, with their
logprobs (completions: tokens, token_logprobs, top_logprobs, text_offset; chat: entries with bytes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerBase

from rollout_engine import TokenOutput
from serve.text import SampleText


@dataclass(slots=True)
class Choice:
    """One sample of a reply: its released text, its tokens, and how it ended."""

    index: int
    text: SampleText
    tokens: list[TokenOutput] = field(default_factory=list)
    finish_reason: str | None = None
    text_offset: int = 0  # where the next token's text starts, for completions' logprobs

    def add(self, token: TokenOutput) -> str:
        """Take the sample's next token; returns the text it releases."""
        self.tokens.append(token)
        self.finish_reason = token.finish_reason
        return self.text.add(token.token_id, finished=token.finish_reason is not None)


def usage(prompts: list[list[int]], choices: list[Choice]) -> dict[str, int]:
    """Tokens read (each prompt once, however many samples it has) and generated."""
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(c.tokens) for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class CompletionShape:
    """/v1/completions: choices carry `text`; logprobs in the legacy four-list form."""

    id_prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def choice(self, choice: Choice, text: str, logprobs: dict | None, chunk: bool) -> dict:
        return {
            "index": choice.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

    def logprobs(self, choice: Choice, tokens: list[TokenOutput]) -> dict:
        """The tokens' texts and logprobs, each position's alternatives with the sampled token among them (as
        OpenAI returns up to logprobs + 1), and where each token's text starts in the completion."""
        texts, top, offsets = [], [], []
        for token in tokens:
            text = self.tokenizer.decode([token.token_id])
            texts.append(text)
            alternatives = {self.tokenizer.decode([i]): lp for i, lp in token.top_logprobs}
            top.append({**alternatives, text: token.logprob})
            offsets.append(choice.text_offset)
            choice.text_offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": top,
            "text_offset": offsets,
        }


class ChatShape:
    """/v1/chat/completions: choices carry an assistant `message` (a `delta` in chunks); logprobs as content
    entries of token, logprob, bytes and top_logprobs."""

    id_prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def choice(self, choice: Choice, text: str, logprobs: dict | None, chunk: bool) -> dict:
        body = {"delta": {"content": text}} if chunk else {"message": {"role": "assistant", "content": text}}
        return {"index": choice.index, **body, "logprobs": logprobs, "finish_reason": choice.finish_reason}

    def role_chunk_choice(self, choice: Choice) -> dict:
        """A stream's first chunk of each choice: who speaks."""
        return {"index": choice.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}

    def logprobs(self, choice: Choice, tokens: list[TokenOutput]) -> dict:
        return {"content": [self._entry(t.token_id, t.logprob, t.top_logprobs) for t in tokens]}

    def _entry(self, token_id: int, logprob: float, alternatives: list[tuple[int, float]] | None) -> dict:
        text = self.tokenizer.decode([token_id])
        entry = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        if alternatives is not None:
            entry["top_logprobs"] = [self._entry(i, lp, None) for i, lp in alternatives]
        return entry
