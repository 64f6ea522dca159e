"""The environment protocol: an Env starts Episodes from task rows, and an Episode answers each action.

An episode's ``messages`` are the first chat turns. The model's reply goes to ``step(action_text)``; the
returned ``StepResult.observation`` (text, or None) is environment-written: the training loop appends its
tokens to the sample masked out of the loss. ``envs.stepping.step_episodes`` steps many episodes at once,
each under a time limit, and turns an exception, a hang or a reward that is not a finite number inside a
plugin's ``step`` into reward 0 plus an error in ``info``, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(slots=True)
class StepResult:
    """What an environment returns for one action.

    ``reward`` is the weighted total; ``rewards`` holds each named component unweighted, for logging. Both
    must be finite numbers: anything else fails the episode (see ``envs.stepping``).
    """

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    """One play-through of one task."""

    messages: list[Message]
    max_turns: int

    def step(self, action_text: str) -> StepResult: ...


@runtime_checkable
class Env(Protocol):
    """Built once from flat keyword arguments; ``start`` turns a task row into an episode.

    An env may also declare ``stop``: strings that end a turn's generation (e.g. a closing tag), so the
    environment answers as soon as an action is complete, and ``response_prefix``: text that opens the
    model's first reply (e.g. "```sql\nSELECT"), placed after the prompt so the model continues it. The
    prefix is part of the prompt, never trained on, and is put back in front of the first action. An env
    that can show an ideal first reply declares ``demonstration(task) -> str | None`` (starting with the
    response prefix); a supervised warm start (``sft.steps``) trains on those before GRPO. An env that
    can tell a task row it cannot play declares ``check_task(task)``, raising ValueError that says why;
    every row is checked once when the tasks load (``envs.tasks.task_splits``). An env names its held-out
    score in its own words with ``score_words`` (a ``ScoreWords``), which the run's summary, W&B and
    ``summary.json`` use.
    """

    max_turns: int

    def start(self, task: Mapping[str, Any]) -> Episode: ...


@dataclass(frozen=True, slots=True)
class ScoreWords:
    """How reports name an env's held-out score: ``success`` is the share of tasks solved ("execution
    accuracy"), ``tasks`` what the held-out tasks are ("tasks on unseen schemas")."""

    success: str = "success rate"
    tasks: str = "tasks"


def score_words(env: object) -> ScoreWords:
    """The env's declared ``score_words``, or the plain ones."""
    words = getattr(env, "score_words", None)
    return words if isinstance(words, ScoreWords) else ScoreWords()


def plugin_name(obj: object) -> str:
    """The dotted name of the class behind an env or episode, used in error messages."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def start_episodes(env: Env, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
    """Start one episode per task row; a failure names the plugin and the row."""
    episodes = []
    for index, task in enumerate(tasks):
        try:
            episodes.append(env.start(task))
        except Exception as exc:
            raise EnvError(
                f"env plugin {plugin_name(env)} failed to start an episode from task row {index}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return episodes


class EnvError(RuntimeError):
    """An environment could not be found, imported, built or started."""
