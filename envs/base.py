"""The environment protocol: an Env starts Episodes from task rows, and an Episode answers each action.

An episode's ``messages`` are the first chat turns. The model's reply goes to ``step(action_text)``; the
returned ``StepResult.observation`` (text, or None) is environment-written: the training loop appends its
tokens to the sample masked out of the loss. ``envs.stepping.step_episodes`` steps many episodes at once,
each under a time limit, and turns an exception, a hang or a reward that is not a finite number inside a
plugin's ``step`` into reward 0 plus an error in ``info``, never a crash.

An env is either a ``BaseEnv`` subclass, which overrides the optional features it has, or any object that
meets the ``Env`` protocol and declares them as attributes of the same names; ``with_defaults`` gives the
latter ``BaseEnv``'s defaults for what it leaves out, so the rest of the code reads one interface.
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
    must be finite numbers: anything else fails the episode (see ``envs.stepping``).
    """

    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Episode(Protocol):
    """One play-through of one task. An episode may also carry a ``constraint``: an object whose
    ``accepts(text, start)`` the engine asks about each token of the first reply, sampling again without
    the tokens it refuses (``rollout_engine.constraints``; the SQL envs use ``envs.sql.names``)."""

    messages: list[Message]
    max_turns: int

    def step(self, action_text: str) -> StepResult: ...


class PlayedEpisode(Protocol):
    """An episode as played (``rl.rollout.play.Trajectory``): its reward summed over its steps, each reward
    component summed likewise (empty when the episode failed), and its last step's ``info``."""

    reward: float
    rewards: dict[str, float]
    info: dict[str, Any]


@runtime_checkable
class Env(Protocol):
    """What a plugin must be: built once from flat keyword arguments; ``start`` turns a task row into an
    episode. Its optional features are ``BaseEnv``'s; a plugin that does not subclass it may declare any of
    them under the same names."""

    max_turns: int

    def start(self, task: Mapping[str, Any]) -> Episode: ...


@dataclass(frozen=True, slots=True)
class ScoreWords:
    """How reports name an env's held-out score: ``success`` is the share of tasks solved ("execution
    accuracy"), ``tasks`` what the held-out tasks are ("tasks on unseen schemas")."""

    success: str = "success rate"
    tasks: str = "tasks"


class BaseEnv(ABC):
    """An env with every optional feature at its default; a subclass sets ``max_turns``, defines ``start``,
    and overrides the features it has.

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


class PluginEnv(BaseEnv):
    """A plugin that meets the ``Env`` protocol alone, seen as a ``BaseEnv``: the optional features it
    declares are read here, once, and ``BaseEnv``'s defaults stand for the rest."""

    def __init__(self, plugin: Env) -> None:
        self.plugin = plugin
        self.stop = tuple(getattr(plugin, "stop", BaseEnv.stop))
        self.response_prefix = getattr(plugin, "response_prefix", BaseEnv.response_prefix)
        words = getattr(plugin, "score_words", None)
        self.score_words = words if isinstance(words, ScoreWords) else BaseEnv.score_words
        self._demonstration = getattr(plugin, "demonstration", None)
        self._check_task = getattr(plugin, "check_task", None)
        self._is_success = getattr(plugin, "is_success", None)
        self._failure = getattr(plugin, "failure", None)

    @property
    def max_turns(self) -> int:
        return self.plugin.max_turns

    def start(self, task: Mapping[str, Any]) -> Episode:
        return self.plugin.start(task)

    def demonstration(self, task: Mapping[str, Any]) -> str | None:
        if self._demonstration is None:
            return super().demonstration(task)
        return self._demonstration(task)

    def check_task(self, task: Mapping[str, Any]) -> None:
        if self._check_task is not None:
            self._check_task(task)

    def is_success(self, episode: PlayedEpisode) -> bool:
        if self._is_success is None:
            return super().is_success(episode)
        return bool(self._is_success(episode))

    def failure(self, episode: PlayedEpisode) -> str | None:
        if self._failure is None:
            return super().failure(episode)
        kind = self._failure(episode)
        return None if kind is None else str(kind)


def with_defaults(env: Env) -> BaseEnv:
    """``env`` as a ``BaseEnv``: itself when it is one, else its ``PluginEnv``."""
    return env if isinstance(env, BaseEnv) else PluginEnv(env)


def plugin_name(obj: object) -> str:
    """The dotted name of the class behind an env or episode, used in error messages."""
    cls = type(obj.plugin if isinstance(obj, PluginEnv) else obj)
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
