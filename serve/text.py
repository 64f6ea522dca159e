"""A sample's text as its tokens arrive: decoded incrementally, and released only once it is final.

Text is held back while it ends in an incomplete multi-byte character, or could still be the start of a stop
string; once the sample finishes, the text is cut before the first stop string in it (OpenAI's `stop`: the
stop string is not returned). The decoding follows vLLM's incremental detokenizer: each new token is decoded
with a few tokens before it, so a tokenizer that drops a leading space at the start of a decode still
produces the same text as decoding the whole completion at once.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_INCOMPLETE = "\ufffd"  # what a decode shows for the first bytes of a character split across tokens


class SampleText:
    """The released text of one sample; add() each token and send what it returns."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.num_held = max((len(s) for s in stop), default=1) - 1  # a stop string's start, minus one
        self.token_ids: list[int] = []
        self.decoded = ""
        self.text = ""  # released so far
        self._prefix_offset = 0  # token_ids[_prefix_offset:_read_offset] were decoded into self.decoded
        self._read_offset = 0

    def add(self, token_id: int, finished: bool) -> str:
        """Take the sample's next token (its last when `finished`); returns the text it releases."""
        self.token_ids.append(token_id)
        self._decode_new(flush=finished)
        if finished:
            end = self._stop_cut()
        else:
            end = max(len(self.text), len(self.decoded) - self.num_held)
        new = self.decoded[len(self.text) : end]
        self.text += new
        return new

    def _decode_new(self, flush: bool) -> None:
        prefix = self._decode(self._prefix_offset, self._read_offset)
        full = self._decode(self._prefix_offset, len(self.token_ids))
        if len(full) > len(prefix) and (flush or not full.endswith(_INCOMPLETE)):
            self.decoded += full[len(prefix) :]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)

    def _decode(self, start: int, end: int) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)

    def _stop_cut(self) -> int:
        """Where the final text ends: before the first stop string that starts in unreleased text (the engine
        stops at the token completing one, so none started earlier), or at the end."""
        starts = [self.decoded.find(s, len(self.text)) for s in self.stop]
        return min([i for i in starts if i >= 0], default=len(self.decoded))
