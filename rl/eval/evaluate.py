"""Greedy held-out evaluation: one episode per task, its outcome per task, accuracy overall and by label."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envs import BaseEnv
from rl.eval.outcomes import TaskOutcome, outcome_of
from rl.rollout.play import Trajectory, play_groups, succeeded


@dataclass(slots=True)
class EvalResult:
    """Accuracy is the share of episodes that succeeded; `by_label[label][value]` = (accuracy, count);
    `failures[kind]` counts the unsolved tasks by why they failed, as the env names it (`failure_of`)."""

    accuracy: float
    reward: float
    num_tasks: int
    by_label: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def ci95(self) -> tuple[float, float]:
        """The 95% Wilson score interval of the accuracy over ``num_tasks`` tasks."""
        return wilson_interval(self.accuracy, self.num_tasks)

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        low, high = self.ci95
        return {
            f"{prefix}/accuracy": self.accuracy,
            f"{prefix}/accuracy_ci_low": low,
            f"{prefix}/accuracy_ci_high": high,
            f"{prefix}/reward": self.reward,
            **{
                f"{prefix}/failure/{kind.replace(' ', '_')}": count / self.num_tasks
                for kind, count in self.failures.items()
            },
        }

    def table(self) -> str:
        """A plain-text table of accuracy, with its 95% interval, overall and by each label."""
        lines = [f"{'':28} {'accuracy':>9} {'95% CI':>15} {'tasks':>6}"]
        rows = [("all", self.accuracy, self.num_tasks)]
        rows += [
            (f"{label}={value}", acc, count)
            for label, values in self.by_label.items()
            for value, (acc, count) in sorted(values.items())
        ]
        for name, acc, count in rows:
            low, high = wilson_interval(acc, count)
            lines.append(f"{name:28} {acc:9.3f} {f'[{low:.3f}, {high:.3f}]':>15} {count:6d}")
        if self.failures:
            lines.append(f"{'failed, why':28} {'share':>9} {'':>15} {'tasks':>6}")
            for kind, count in sorted(self.failures.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"{kind:28} {count / self.num_tasks:9.3f} {'':>15} {count:6d}")
        return "\n".join(lines)


def wilson_interval(accuracy: float, num_tasks: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a success rate over ``num_tasks`` trials ((0, 1) when there are none)."""
    if num_tasks <= 0:
        return 0.0, 1.0
    centre = (accuracy + z * z / (2 * num_tasks)) / (1 + z * z / num_tasks)
    half = (
        z
        / (1 + z * z / num_tasks)
        * math.sqrt(accuracy * (1 - accuracy) / num_tasks + z * z / (4 * num_tasks**2))
    )
    return max(0.0, centre - half), min(1.0, centre + half)


def failure_of(env: BaseEnv, trajectory: Trajectory) -> str | None:
    """Why an unsolved episode failed: "env error" when the plugin's step failed (an exception, a hang, a
    reward that is not a number), else the env's own `failure` label (None: it gives none)."""
    return "env error" if trajectory.error is not None else env.failure(trajectory)


def play_eval(
    engine: Any,
    tokenizer: Any,
    env: BaseEnv,
    tasks: Sequence[dict[str, Any]],
    greedy_params: Any,
    step_fn: Callable[[Sequence[Any], Sequence[str]], list[Any]],
    start_fn: Callable[[Any, Sequence[Any]], list[Any]],
    max_completion_tokens: int,
    labels: Sequence[str] = ("family", "difficulty", "db_id"),
    on_done: Callable[[int], None] | None = None,
) -> list[TaskOutcome]:
    """Play each task once with `greedy_params` (temperature 0, n=1): one outcome per task, in order, its
    success as the env's `is_success` says (the keys of repeated tasks are numbered by `mark_repeats` once
    the whole set is together). The engine's prefix cache is dropped afterwards: training never samples the
    held-out prompts, and an in-process engine gives the memory of their KV blocks back to the trainer's
    next step. `on_done(n)` hears of tasks as their episodes end, n at a time."""
    if not tasks:  # more ranks than held-out tasks: this rank's shard is empty
        return []
    episodes = start_fn(env, tasks)
    trajectories = play_groups(
        engine,
        tokenizer,
        [[e] for e in episodes],
        greedy_params,
        step_fn,
        max_completion_tokens,
        response_prefix=env.response_prefix,
        on_done=on_done,
    )
    engine.reset_prefix_cache()
    outcomes = []
    for task, (t,) in zip(tasks, trajectories, strict=True):
        outcomes.append(outcome_of(task, succeeded(env, t), t.reward, t.text, labels, failure_of(env, t)))
    return outcomes


def score(outcomes: Sequence[TaskOutcome], labels: Sequence[str]) -> EvalResult:
    """Accuracy (the share of successes) and mean reward, overall and by each of `labels`."""
    by_label: dict[str, dict[str, tuple[float, int]]] = {}
    for label in labels:
        buckets: dict[str, list[bool]] = defaultdict(list)
        for outcome in outcomes:
            if label in outcome.labels:
                buckets[outcome.labels[label]].append(outcome.success)
        if buckets:
            by_label[label] = {k: (sum(v) / len(v), len(v)) for k, v in buckets.items()}
    num_tasks = len(outcomes)
    return EvalResult(
        accuracy=sum(o.success for o in outcomes) / num_tasks if num_tasks else 0.0,
        reward=sum(o.reward for o in outcomes) / num_tasks if num_tasks else 0.0,
        num_tasks=num_tasks,
        by_label=by_label,
        failures=dict(Counter(o.failure for o in outcomes if o.failure is not None)),
    )
