"""One thread owns the engine: it builds it, adds the requests handed to it, steps the engine while any runs,
and passes each request's new tokens to that request's sink after every step (continuous batching: a request
that arrives while others decode joins their batch at the next step).

The thread that steps the engine also builds it because torch's CPU ops run on OpenMP, whose thread team
belongs to the thread that first runs a parallel op. An engine loaded on the main thread and stepped on
another leaves the main thread's team idle beside the stepping thread's own: more OpenMP threads than cores,
so GNU OpenMP stops spin-waiting and every op's barrier sleeps and wakes its threads. On 2 cores that made
16 streams' decode steps 1.3-2x slower (bench/serve.py, bench/RESULTS.md)."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rollout_engine import LLMEngine, SamplingParams, TokenOutput

logger = logging.getLogger(__name__)

# A sink is called on the loop thread with each step's new tokens of its request (one list per step that
# produced any), or once with the exception that ended the request; never again after that, or after every
# sample's last token (the one with a finish_reason).
Sink = Callable[[list[TokenOutput] | BaseException], None]


@dataclass(slots=True, eq=False)
class Ticket:
    """A submitted request, for abort(); the loop sets request_id once the engine has taken it."""

    prompt_token_ids: list[int]
    params: SamplingParams
    sink: Sink
    request_id: int | None = None


_STOP = object()


class EngineLoop:
    """Builds the engine with `build()` on its own thread, then steps it there. submit() and abort() may be
    called from any thread once start() has returned."""

    def __init__(self, build: Callable[[], LLMEngine]) -> None:
        self.engine: LLMEngine | None = None
        self._build = build
        self._built: queue.SimpleQueue = queue.SimpleQueue()  # the engine, or what build() raised
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, Ticket] = {}  # engine request id -> the ticket whose sink hears it
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> LLMEngine:
        """Start the thread; returns the engine once it is built, or raises what building it raised."""
        self._thread.start()
        built = self._built.get()
        if isinstance(built, BaseException):
            self._thread.join()
            raise built
        return built

    def stop(self) -> None:
        """Abort every request (their sinks hear a RuntimeError) and end the thread."""
        self._inbox.put(_STOP)
        self._thread.join()

    def submit(self, prompt_token_ids: list[int], params: SamplingParams, sink: Sink) -> Ticket:
        """Queue a request for the next step; check it first with engine.check_request, since a refusal
        here only reaches the sink."""
        ticket = Ticket(list(prompt_token_ids), params, sink)
        self._inbox.put(ticket)
        return ticket

    def abort(self, ticket: Ticket) -> None:
        """Drop a request (its client went away); its sink hears nothing more."""
        self._inbox.put(("abort", ticket))

    def _run(self) -> None:
        try:
            self.engine = self._build()
        except BaseException as err:  # raised again by start(), on the caller's thread, with its traceback
            self._built.put(err)
            return
        self._built.put(self.engine)
        while True:
            for message in self._messages(block=not self.engine.has_unfinished()):
                if message is _STOP:
                    self._fail_all(RuntimeError("the server is shutting down"))
                    return
                self._handle(message)
            if self.engine.has_unfinished():
                self._step()

    def _messages(self, block: bool) -> list:
        """What arrived since the last step; with `block`, wait for at least one message."""
        messages = [self._inbox.get()] if block else []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                return messages

    def _handle(self, message) -> None:
        if isinstance(message, Ticket):
            try:
                message.request_id = self.engine.add_request(message.prompt_token_ids, message.params)
            except ValueError as err:
                message.sink(err)
                return
            self._live[message.request_id] = message
            return
        _, ticket = message
        if self._live.pop(ticket.request_id, None) is not None:
            self.engine.abort_request(ticket.request_id)

    def _step(self) -> None:
        try:
            out = self.engine.step()
        except Exception as err:  # the engine aborted the step's requests; fail them all and keep serving
            logger.exception("an engine step failed; its requests are aborted")
            self._fail_all(RuntimeError(f"the engine failed: {err}"))
            return
        by_request: dict[int, list[TokenOutput]] = {}
        for token in out.tokens:
            by_request.setdefault(token.request_id, []).append(token)
        for request_id, tokens in by_request.items():
            self._live[request_id].sink(tokens)
        for group in out.finished:
            del self._live[group.request_id]

    def _fail_all(self, err: BaseException) -> None:
        for request_id, ticket in self._live.items():
            self.engine.abort_request(request_id)
            ticket.sink(err)
        self._live.clear()
