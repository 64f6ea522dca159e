"""A chat prompt as the engine's token ids: the tokenizer's chat template, then the start of the reply the
environment writes for the model. The job's rollouts and demonstrations and the server (serve/) build
prompts here, so what the model is trained on is what it is served."""

from __future__ import annotations

from typing import Any


def prompt_token_ids(tokenizer: Any, messages: list[dict[str, str]], response_prefix: str = "") -> list[int]:
    """The chat-templated prompt, ending with the assistant's generation prompt and then the start of the
    reply that the environment writes for the model (``response_prefix``, e.g. an opened code fence)."""
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids) + tokenizer.encode(response_prefix, add_special_tokens=False)
