"""The requests in flight: each one's prompt, finish rules and the samples finished so far, gathered into its
GroupResult once the last of them finishes."""

from __future__ import annotations

from dataclasses import dataclass

from rollout_engine.outputs import Completion, GroupResult
from rollout_engine.sequence import Sequence
from rollout_engine.stopping import StopChecker


@dataclass(slots=True)
class _Request:
    prompt_token_ids: list[int]
    samples: list[Completion | None]
    stop: StopChecker
    num_finished: int = 0


class RequestTable:
    """The engine's requests by id, from being queued until their last sample finishes or they are dropped."""

    def __init__(self) -> None:
        self._requests: dict[int, _Request] = {}
        self._next_request_id = 0

    def add(self, prompt_token_ids: list[int], num_samples: int, stop: StopChecker) -> int:
        """Hold a new request of `num_samples` samples; returns its id."""
        request_id = self._next_request_id
        self._next_request_id += 1
        self._requests[request_id] = _Request(
            prompt_token_ids=list(prompt_token_ids), samples=[None] * num_samples, stop=stop
        )
        return request_id

    def drop(self, request_id: int) -> None:
        """Forget a request; an unknown or finished id is ignored."""
        self._requests.pop(request_id, None)

    def stop_reason(self, seq: Sequence) -> str | None:
        """Why the request's finish rules end the sample `seq` at its last token, or None."""
        return self._requests[seq.request_id].stop.finish_reason(seq.completion_token_ids)

    def finish(self, seq: Sequence, reason: str) -> GroupResult | None:
        """Record a finished sample; returns its group once every sample of it has finished."""
        request = self._requests[seq.request_id]
        request.samples[seq.sample_index] = Completion(
            request.prompt_token_ids,
            seq.completion_token_ids,
            seq.logprobs,
            reason,
            seq.sample_index,
            seq.top_logprobs,
            seq.support,
        )
        request.num_finished += 1
        if request.num_finished < len(request.samples):
            return None
        del self._requests[seq.request_id]
        return GroupResult(seq.request_id, request.prompt_token_ids, list(request.samples))
