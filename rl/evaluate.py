"""Greedy held-out evaluation: one episode per task, accuracy overall and by task label."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rl.rollout import Trajectory, play_groups

SUCCESS_COMPONENT = "execution"  # SQL envs report the execution match under this reward name


@dataclass(slots=True)
class EvalResult:
    """Accuracy is the share of episodes that succeeded; `by_label[label][value]` = (accuracy, count)."""

    accuracy: float
    reward: float
    num_tasks: int
    by_label: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        return {"eval/accuracy": self.accuracy, "eval/reward": self.reward}

    def table(self) -> str:
        """A plain-text table of accuracy by each label (query family, difficulty)."""
        lines = [f"{'':24} {'accuracy':>9} {'tasks':>6}"]
        lines.append(f"{'all':24} {self.accuracy:9.3f} {self.num_tasks:6d}")
        for label, values in self.by_label.items():
            for value, (acc, count) in sorted(values.items()):
                lines.append(f"{label + '=' + value:24} {acc:9.3f} {count:6d}")
        return "\n".join(lines)


def succeeded(trajectory: Trajectory) -> bool:
    """Success is a full `execution` component when the env reports one, else a positive reward."""
    if SUCCESS_COMPONENT in trajectory.rewards:
        return trajectory.rewards[SUCCESS_COMPONENT] >= 1.0
    return trajectory.reward > 0


def evaluate(
    engine: Any,
    tokenizer: Any,
    env: Any,
    tasks: Sequence[dict[str, Any]],
    greedy_params: Any,
    step_fn: Callable[[Sequence[Any], Sequence[str]], list[Any]],
    start_fn: Callable[[Any, Sequence[Any]], list[Any]],
    max_completion_tokens: int,
    labels: Sequence[str] = ("family", "difficulty"),
) -> EvalResult:
    """Play each task once with `greedy_params` (temperature 0, n=1) and score it."""
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
