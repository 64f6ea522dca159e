"""Stepping episodes safely: a plugin that raises, hangs or returns a bad reward fails only its own episode.

``step_episodes`` runs each episode's ``step`` in a worker thread under a time limit and checks what comes
back. A failed step becomes ``StepResult(None, 0.0, done=True)`` with its ``error`` set (and ``timed_out``
when it ran out of time), plus one warning that names the plugin and the task; the run goes on. A reward
must be a finite number, and so must every ``rewards`` component.

A hung thread cannot be killed in Python, so the workers are daemon threads: a step past its deadline is
abandoned to its thread, a fresh worker takes that thread's place, and neither Ctrl-C nor the interpreter's
exit waits for it. Too many steps hung at once mean a broken plugin, not a slow one: that stops the run.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from numbers import Real

from envs.base import EnvError, Episode, StepResult, plugin_name

logger = logging.getLogger(__name__)

DEFAULT_STEP_TIMEOUT_S = 60.0
NUM_WORKERS = 8
MAX_HUNG_STEPS = 64  # steps still stuck in abandoned threads; past this the plugin hangs, it is not slow
_WAKE_S = 0.25  # the longest the main thread sleeps while steps run (see _wait_or_time_out)


def step_episodes(
    episodes: Sequence[Episode], actions: Sequence[str], timeout_s: float = DEFAULT_STEP_TIMEOUT_S
) -> list[StepResult]:
    """Step each episode with its action concurrently (their SQL runs in parallel); results keep the order.

    A step that takes longer than ``timeout_s`` seconds fails its episode (see the module docstring).
    """
    if len(episodes) != len(actions):
        raise ValueError(
            f"got {len(episodes)} episodes but {len(actions)} actions; pass one action per episode"
        )
    if not isinstance(timeout_s, Real) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    calls = [_StepCall(episode, action) for episode, action in zip(episodes, actions, strict=True)]
    for call in calls:
        _WORKERS.submit(call)
    _wait_or_time_out(calls, timeout_s)
    return [call.future.result() for call in calls]


def task_hint(episode: Episode) -> str:
    """A short description of an episode's task for messages: its ``question``, else its last message."""
    task = getattr(episode, "task", None)
    text = task.get("question") if isinstance(task, Mapping) else None
    if not isinstance(text, str):
        messages = getattr(episode, "messages", None) or [{}]
        text = str(messages[-1].get("content", "")) if isinstance(messages[-1], Mapping) else ""
    text = " ".join(text.split())
    if not text:
        return ""
    return "task " + repr(text if len(text) <= 80 else text[:77] + "...")


def _safe_step(episode: Episode, action_text: str) -> StepResult:
    try:
        result = episode.step(action_text)
    except Exception as exc:  # a broken plugin must not end a training run
        return _failed(episode, "raised in step()", f"{type(exc).__name__}: {exc}")
    try:
        return _checked(result)
    except (TypeError, ValueError) as exc:
        return _failed(episode, "returned a bad result from step()", str(exc))


def _checked(result: object) -> StepResult:
    """The result with its reward and components as floats; a TypeError or ValueError says what is wrong."""
    if not isinstance(result, StepResult):
        raise TypeError(f"step() returned {type(result).__name__}, expected envs.StepResult")
    if not isinstance(result.rewards, Mapping):
        raise TypeError(
            f"StepResult.rewards must be a dict of name -> float, got {type(result.rewards).__name__}"
        )
    result.reward = _finite(result.reward, "StepResult.reward")
    result.rewards = {
        name: _finite(value, f"StepResult.rewards[{name!r}]") for name, value in result.rewards.items()
    }
    return result


def _finite(value: object, what: str) -> float:
    if isinstance(value, Real) and math.isfinite(value):
        return float(value)
    kind = "is not finite" if isinstance(value, Real) else f"is a {type(value).__name__}, not a number"
    raise ValueError(f"{what}={value!r} {kind}; a reward must be a finite float")


def _failed(episode: Episode, what: str, error: str, timed_out: bool = False) -> StepResult:
    where = f" ({hint})" if (hint := task_hint(episode)) else ""
    logger.warning(
        "env plugin %s %s: %s%s; the episode ends with reward 0", plugin_name(episode), what, error, where
    )
    return StepResult(None, 0.0, True, error=error, timed_out=timed_out)


@dataclass(slots=True, eq=False)
class _StepCall:
    episode: Episode
    action: str
    future: Future = field(default_factory=Future)
    started: float | None = None  # time.monotonic() when a worker began the step
    abandoned: bool = False


class _StepWorkers:
    """Daemon threads that run step calls from one queue; a thread stuck in a timed-out step is replaced.

    Threads are long-lived because the SQL sandbox caches its connections per thread.
    """

    def __init__(self, num_workers: int) -> None:
        self._num_workers = num_workers
        self._calls: queue.SimpleQueue[_StepCall] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._num_threads = 0
        self.num_hung = 0

    def submit(self, call: _StepCall) -> None:
        self._start_missing_workers()
        self._calls.put(call)

    def abandon(self, call: _StepCall, timeout_s: float) -> None:
        """Fail a step past its deadline; its thread leaves the pool (and exits if the step ever returns)."""
        with self._lock:
            if call.future.done():
                return
            call.abandoned = True
            error = f"timed out after {timeout_s:g}s (env.step_timeout_s)"
            call.future.set_result(_failed(call.episode, "did not return from step()", error, timed_out=True))
            self._num_threads -= 1
            self.num_hung += 1
            num_hung = self.num_hung
        if num_hung > MAX_HUNG_STEPS:
            raise EnvError(
                f"env plugin {plugin_name(call.episode)}: {num_hung} calls of step() are still running past "
                f"env.step_timeout_s={timeout_s:g}s; its step() hangs: fix the plugin (or raise the timeout "
                "if its steps are that slow)"
            )
        self._start_missing_workers()

    def _start_missing_workers(self) -> None:
        with self._lock:
            missing = self._num_workers - self._num_threads
            self._num_threads += missing
        for _ in range(missing):
            threading.Thread(target=self._work, name="env-step", daemon=True).start()

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            call.started = time.monotonic()
            result = _safe_step(call.episode, call.action)
            with self._lock:
                if call.abandoned:  # a fresh worker took this thread's place while it was stuck
                    self.num_hung -= 1
                    return
                call.future.set_result(result)


_WORKERS = _StepWorkers(NUM_WORKERS)


def _wait_or_time_out(calls: Sequence[_StepCall], timeout_s: float) -> None:
    """Block until every call has a result, failing each one still running ``timeout_s`` after it began.

    The main thread wakes at least every ``_WAKE_S``: Ctrl-C's SIGINT may be delivered to a worker thread,
    and Python raises KeyboardInterrupt only in the main thread, the next time it runs.
    """
    while pending := [call for call in calls if not call.future.done()]:
        now = time.monotonic()
        for call in pending:
            if call.started is not None and now - call.started >= timeout_s:
                _WORKERS.abandon(call, timeout_s)
        deadlines = [c.started + timeout_s for c in pending if c.started is not None and not c.future.done()]
        # a call not started yet has a deadline beyond now + timeout_s
        next_deadline = min(deadlines, default=now + timeout_s)
        wait(
            [call.future for call in pending],
            timeout=min(max(next_deadline - now, 0.0), _WAKE_S),
            return_when=FIRST_COMPLETED,
        )
