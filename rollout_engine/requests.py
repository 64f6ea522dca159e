"""Checking what callers hand the engine: token-id prompts, and the SamplingParams that go with them.

Prompts are lists of token ids, as vLLM's `prompt_token_ids`. Text is tokenized first, and a tensor or
array of ids is refused rather than guessed at (is a 2-D tensor one prompt or a batch?): `.tolist()` turns
it into what the engine takes.
"""

from __future__ import annotations

from rollout_engine.sampling_params import SamplingParams, is_plain_int


class PromptError(ValueError):
    """A prompt the engine cannot take (not a list of in-vocabulary token ids, empty, or too long)."""


_TOKENS_HINT = "tokenize text first, and turn a tensor or array of ids into a list with .tolist()"


def check_prompt(prompt_token_ids: list[int], max_model_len: int, vocab_size: int) -> None:
    """PromptError (a ValueError) naming the problem when a prompt is not a non-empty list of in-vocabulary
    token ids that leaves room to generate within max_model_len."""
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise PromptError(
            f"each prompt must be a list of token ids (ints), got a {type(prompt_token_ids).__name__}; "
            + _TOKENS_HINT
        )
    bad = [t for t in prompt_token_ids if not is_plain_int(t)]
    if bad:
        raise PromptError(
            f"each prompt must be a list of token ids (ints), got one holding {bad[0]!r}; " + _TOKENS_HINT
        )
    if len(prompt_token_ids) == 0:
        raise PromptError("empty prompt: every prompt needs at least one token")
    if len(prompt_token_ids) >= max_model_len:
        raise PromptError(
            f"prompt of {len(prompt_token_ids)} tokens leaves no room to generate within max_model_len="
            f"{max_model_len}; shorten the prompt or raise max_model_len"
        )
    if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size:
        raise PromptError(f"prompt token ids must lie in [0, {vocab_size}), the model's vocabulary")


def params_per_prompt(
    prompt_token_ids: list[list[int]], params: SamplingParams | list[SamplingParams] | None
) -> list[SamplingParams]:
    """One SamplingParams per prompt: `params` repeated (defaults when None), or the list given, which must
    match the prompts one for one."""
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise ValueError(
            f"generate takes a list of prompts, each a list of token ids; got a "
            f"{type(prompt_token_ids).__name__}: " + _TOKENS_HINT
        )
    if prompt_token_ids and is_plain_int(prompt_token_ids[0]):
        raise ValueError("generate takes a list of prompts (token id lists); wrap one prompt as [ids]")
    params = params if params is not None else SamplingParams()
    params_list = params if isinstance(params, list) else [params] * len(prompt_token_ids)
    if not all(isinstance(p, SamplingParams) for p in params_list):
        raise ValueError("params must be a SamplingParams, a list of them (one per prompt), or None")
    if len(params_list) != len(prompt_token_ids):
        raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompt_token_ids)} prompts")
    return params_list
