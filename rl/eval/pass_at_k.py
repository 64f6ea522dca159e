"""pass@k: how often at least one of k samples of a task succeeds, estimated from n >= k samples per task.

The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code"): with c of n
samples successful, pass@k = 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement from
the n are not all failures; a set's pass@k is its mean over the tasks. The n samples of a task are one engine
request with n samples (as a GRPO group is), so they share the prompt's KV blocks; success is the greedy
evaluation's `succeeded` (the env's `is_success`). Per-task counts go to
``RUN_DIR/evals/<set>_passk_<stage>_<step>.jsonl``.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs import BaseEnv
from rl.eval.evaluate import EvalResult
from rl.eval.outcomes import outcome_path, task_key
from rl.rollout.play import play_groups, succeeded

PASSK = "passk"  # the outcome files' infix: held_out_passk_checkpoint_40.jsonl


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which neither overflows nor
    loses the small differences that the ratio of two huge binomials would."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every draw of k samples holds a success
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def ks_up_to(samples: int) -> list[int]:
    """The k reported from `samples` samples per task: the powers of 2 below it, and itself."""
    return [k for k in (2**e for e in range(samples.bit_length())) if k < samples] + [samples]


@dataclass(slots=True)
class TaskSamples:
    """One task's samples: its outcome key and labels, how many were drawn (n) and how many succeeded (c)."""

    key: str
    n: int
    c: int
    labels: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, **self.labels, "n": self.n, "c": self.c}


def passk_path(run_dir: str | os.PathLike, set_name: str, stage: str, step: int) -> Path:
    """``RUN_DIR/evals/<set>_passk_<stage>_<step>.jsonl``, beside the evaluation's greedy outcome file."""
    return outcome_path(run_dir, f"{set_name}_{PASSK}", stage, step)


def play_samples(
    engine: Any,
    tokenizer: Any,
    env: BaseEnv,
    tasks: Sequence[dict[str, Any]],
    params: Any,
    step_fn: Callable[[Sequence[Any], Sequence[str]], list[Any]],
    start_fn: Callable[[Any, Sequence[Any]], list[Any]],
    max_completion_tokens: int,
    labels: Sequence[str] = ("family", "difficulty", "db_id"),
    on_done: Callable[[int], None] | None = None,
) -> list[TaskSamples]:
    """Play `params.n` episodes of each task, as one request per task (`play_groups`), and count the
    successes; the prefix cache is dropped afterwards, as after a greedy evaluation. `on_done(n)` hears of
    tasks as their samples are all played, n at a time."""
    if not tasks:
        return []
    groups = [start_fn(env, [task] * params.n) for task in tasks]
    played = play_groups(
        engine,
        tokenizer,
        groups,
        params,
        step_fn,
        max_completion_tokens,
        response_prefix=env.response_prefix,
        on_done=on_done,
    )
    engine.reset_prefix_cache()
    return [
        TaskSamples(
            task_key(task),
            len(group),
            sum(succeeded(env, t) for t in group),
            {label: str(task[label]) for label in labels if label in task},
        )
        for task, group in zip(tasks, played, strict=True)
    ]


@dataclass(slots=True)
class PassAtK:
    """pass@k of a set for each k in `ks`: `overall[k]`; `by_label[label][value]` = ({k: pass@k}, tasks)."""

    ks: list[int]
    overall: dict[int, float]
    num_tasks: int
    by_label: dict[str, dict[str, tuple[dict[int, float], int]]] = field(default_factory=dict)

    def table(self, greedy: EvalResult | None = None) -> str:
        """One row per group of tasks (all, then each label's values): greedy accuracy, then pass@k."""
        header = f"{'':28}" + (f" {'greedy':>7}" if greedy else "")
        header += "".join(f" {f'pass@{k}':>8}" for k in self.ks) + f" {'tasks':>6}"
        rows = [("all", self.overall, self.num_tasks, greedy.accuracy if greedy else None)]
        for label, values in self.by_label.items():
            for value, (by_k, count) in sorted(values.items()):
                accuracy = greedy.by_label.get(label, {}).get(value, (None,))[0] if greedy else None
                rows.append((f"{label}={value}", by_k, count, accuracy))
        lines = [header]
        for name, by_k, count, accuracy in rows:
            line = f"{name:28}"
            if greedy:
                line += f" {accuracy:7.3f}" if accuracy is not None else f" {'-':>7}"
            lines.append(line + "".join(f" {by_k[k]:8.3f}" for k in self.ks) + f" {count:6d}")
        return "\n".join(lines)


def score_pass_at_k(samples: Sequence[TaskSamples], ks: Sequence[int], labels: Sequence[str]) -> PassAtK:
    """Each k's pass@k, the mean over tasks of `pass_at_k(n, c, k)`, overall and by each of `labels`."""

    def mean_by_k(group: Sequence[TaskSamples]) -> dict[int, float]:
        return {k: sum(pass_at_k(s.n, s.c, k) for s in group) / len(group) if group else 0.0 for k in ks}

    by_label = {}
    for label in labels:
        buckets: dict[str, list[TaskSamples]] = defaultdict(list)
        for task in samples:
            if label in task.labels:
                buckets[task.labels[label]].append(task)
        if buckets:
            by_label[label] = {value: (mean_by_k(group), len(group)) for value, group in buckets.items()}
    return PassAtK(list(ks), mean_by_k(samples), len(samples), by_label)
