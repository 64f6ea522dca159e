"""When a completion ends: a stop token, a stop string, or max_tokens."""

from __future__ import annotations

from rollout_engine.sampling_params import SamplingParams

# A stop string of k characters spans at most k tokens, plus a few byte-fallback tokens that decode
# to no character on their own; decoding this many extra trailing tokens is enough to see it.
_STOP_STRING_TOKEN_MARGIN = 8


class StopChecker:
    """Finish rules of one request. The stop token (or the token completing a stop string) is kept."""

    def __init__(self, params: SamplingParams, tokenizer) -> None:
        eos = getattr(tokenizer, "eos_token_id", None)
        if params.stop_token_ids is not None:
            self.stop_token_ids = frozenset(params.stop_token_ids)
        else:
            self.stop_token_ids = frozenset([eos] if eos is not None else [])
        self.stop = list(params.stop or [])
        if self.stop and tokenizer is None:
            raise ValueError("stop strings need a tokenizer: pass one to LLMEngine or use stop_token_ids")
        self.tokenizer = tokenizer
        self.max_tokens = params.max_tokens
        self.num_tail_tokens = max((len(s) for s in self.stop), default=0) + _STOP_STRING_TOKEN_MARGIN

    def finish_reason(self, completion_token_ids: list[int]) -> str | None:
        """ "stop", "length" or None (keep going) after the latest token."""
        if completion_token_ids[-1] in self.stop_token_ids:
            return "stop"
        if self.stop:
            tail = self.tokenizer.decode(completion_token_ids[-self.num_tail_tokens :])
            if any(s in tail for s in self.stop):
                return "stop"
        if len(completion_token_ids) >= self.max_tokens:
            return "length"
        return None
