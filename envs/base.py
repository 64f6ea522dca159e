"""The env contract (``BaseEnv``): an env starts Episodes from task rows; an Episode answers each action.

An episode's ``messages`` are the first chat turns. The model's reply goes to ``step(action_text)``; the
returned ``StepResult.observation`` (text, or None) is environment-written: the training loop appends its
tokens to the sample masked out of the loss. ``envs.stepping.step_episodes`` steps many episodes at once,
each under a time limit, and turns an exception, a hang or a reward that is not a finite number inside a
plugin's ``step`` into reward 0 with ``StepResult.error`` set, never a crash.

Every env, built-in or plugin, subclasses ``BaseEnv``: it sets ``max_turns``, defines ``start``, and
overrides the optional features it has; ``BaseEnv``'s defaults stand for the rest, so an env is used as it
was built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(slots=True)
class StepResult:
    """What an environment returns for one action.

    ``reward`` is the weighted total; ``rewards`` holds each named component unweighted, for logging. Both
    must be finite numbers: anything else fails the episode (see ``envs.stepping``). ``error`` says why a
    plugin's step failed (it raised, ran past its time limit, or returned a bad result) and ``timed_out``
    whether it ran past that limit: ``envs.stepping`` sets both on the zero-reward result that stands for a
    failed step, and a step that ran has neither.
    """

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    timed_out: bool = False


@runtime_checkable
class Episode(Protocol):
    """One play-through of one task. An episode may also carry a ``constraint``: an object whose
    ``accepts(text, start)`` the engine asks about each token of the first reply, sampling again without
    the tokens it refuses (``rollout_engine.constraints``; the SQL envs use
    ``envs.sql.schema_constraint``)."""

    messages: list[Message]
    max_turns: int

    def step(self, action_text: str) -> StepResult: ...


class PlayedEpisode(Protocol):
    """An episode as played (``rl.rollout.play.Trajectory``): its reward summed over its steps, each reward
    component summed likewise (empty when the episode failed), and its last step's ``info``."""

    reward: float
    rewards: dict[str, float]
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ScoreWords:
    """How reports name an env's held-out score: ``success`` is the share of tasks solved ("execution
    accuracy"), ``tasks`` what the held-out tasks are ("tasks on unseen schemas")."""

    success: str = "success rate"
    tasks: str = "tasks"


class BaseEnv(ABC):
    """What every env is, built-in or plugin: built once from flat keyword arguments, it sets ``max_turns``
    (the most turns an episode takes) and defines ``start``, which turns a task row into an episode. Every
    optional feature has its default here; a subclass overrides the features it has.

    ``stop``: strings that end a turn's generation (e.g. a closing tag), so the environment answers as soon
    as an action is complete. ``response_prefix``: text that opens the model's first reply (e.g.
    "```sql\\nSELECT"), placed after the prompt so the model continues it; it is part of the prompt, never
    trained on, and is put back in front of the first action. ``score_words``: what the run's summary, W&B
    and ``summary.json`` call the held-out score.
    """

    max_turns: int
    stop: tuple[str, ...] = ()
    response_prefix: str = ""
    score_words: ScoreWords = ScoreWords()

    @abstractmethod
    def start(self, task: Mapping[str, Any]) -> Episode:
        """An episode of the task row ``task``."""

    def demonstration(self, task: Mapping[str, Any]) -> str | None:
        """The ideal first reply to ``task``, starting with the response prefix, or None (none: the default).
        A supervised warm start (``sft.steps``) trains on these before GRPO."""
        return None

    def check_task(self, task: Mapping[str, Any]) -> None:
        """Raise ValueError, saying why, for a task row the env cannot play (the default plays any row).
        Every row is checked once when the tasks load (``envs.tasks.task_splits``)."""
        return None

    def is_success(self, episode: PlayedEpisode) -> bool:
        """Whether a played episode solved its task: what held-out accuracy, pass@k and the curriculum
        count. The default: a positive reward."""
        return episode.reward > 0

    def failure(self, episode: PlayedEpisode) -> str | None:
        """Why an unsolved episode failed, as a short label that evaluations count ("unknown column",
        "wrong result" ...), or None: no reason given (the default)."""
        return None


def plugin_name(obj: object) -> str:
    """The dotted name of the class of an env or episode, used in error messages."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def start_episodes(env: BaseEnv, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
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
