"""Greedy held-out evaluation: one episode per task, accuracy overall and by task label."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl.job.play import Trajectory, play_groups

SUCCESS_COMPONENT = "execution"  # SQL envs report the execution match under this reward name


@dataclass(slots=True)
class EvalResult:
    """Accuracy is the share of episodes that succeeded; `by_label[label][value]` = (accuracy, count)."""

    accuracy: float
    reward: float
    num_tasks: int
    by_label: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)

    @property
    def ci95(self) -> tuple[float, float]:
        """The 95% Wilson score interval of the accuracy over ``num_tasks`` tasks."""
        return wilson_interval(self.accuracy, self.num_tasks)

    def metrics(self) -> dict[str, float]:
        low, high = self.ci95
        return {
            "eval/accuracy": self.accuracy,
            "eval/accuracy_ci_low": low,
            "eval/accuracy_ci_high": high,
            "eval/reward": self.reward,
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


def succeeded(trajectory: Trajectory) -> bool:
    """Success is a full `execution` component when the env reports one, else a positive reward; a
    non-finite value (which `envs.step_episodes` never lets through) is never a success."""
    value = trajectory.rewards.get(SUCCESS_COMPONENT, trajectory.reward)
    if not math.isfinite(value):
        return False
    return value >= 1.0 if SUCCESS_COMPONENT in trajectory.rewards else value > 0


def evaluate(
    engine: Any,
    tokenizer: Any,
    env: Any,
    tasks: Sequence[dict[str, Any]],
    greedy_params: Any,
    step_fn: Callable[[Sequence[Any], Sequence[str]], list[Any]],
    start_fn: Callable[[Any, Sequence[Any]], list[Any]],
    max_completion_tokens: int,
    labels: Sequence[str] = ("family", "difficulty", "db_id"),
) -> EvalResult:
    """Play each task once with `greedy_params` (temperature 0, n=1) and score it. The engine's prefix cache
    is dropped afterwards: training never samples the held-out prompts, and an in-process engine gives the
    memory of their KV blocks back to the trainer's next step."""
    episodes = start_fn(env, tasks)
    trajectories = play_groups(
        engine,
        tokenizer,
        [[e] for e in episodes],
        greedy_params,
        step_fn,
        max_completion_tokens,
        response_prefix=getattr(env, "response_prefix", ""),
    )
    drop_prefix_cache = getattr(engine, "reset_prefix_cache", None)  # a remote engine keeps its own
    if drop_prefix_cache is not None:
        drop_prefix_cache()
    flat = [group[0] for group in trajectories]
    wins = [succeeded(t) for t in flat]
    by_label: dict[str, dict[str, tuple[float, int]]] = {}
    for label in labels:
        buckets: dict[str, list[bool]] = defaultdict(list)
        for task, win in zip(tasks, wins, strict=True):
            if label in task:
                buckets[str(task[label])].append(win)
        if buckets:
            by_label[label] = {k: (sum(v) / len(v), len(v)) for k, v in buckets.items()}
    return EvalResult(
        accuracy=sum(wins) / len(wins),
        reward=sum(t.reward for t in flat) / len(flat),
        num_tasks=len(flat),
        by_label=by_label,
    )
