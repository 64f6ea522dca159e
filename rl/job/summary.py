"""The run's learning record: every held-out evaluation by stage, ``summary.json``, and the printed summary.

Stages: ``base`` (the untouched model, before anything trains), ``sft`` (after the supervised warm start:
where GRPO starts) and ``grpo`` (every ``eval_every`` GRPO steps and at the end).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.job.evaluate import EvalResult
from rl.job.loop_metrics import PHASES, StepTimer

SUMMARY_FILE = "summary.json"


@dataclass(slots=True)
class EvalPoint:
    stage: str  # base | sft | grpo
    step: int  # the stage's own step count when the evaluation ran
    result: EvalResult

    def as_dict(self) -> dict[str, Any]:
        low, high = self.result.ci95
        return {
            "stage": self.stage,
            "step": self.step,
            "accuracy": self.result.accuracy,
            "ci95": [low, high],
            "reward": self.result.reward,
            "num_tasks": self.result.num_tasks,
        }


def _accuracy_at(points: Sequence[EvalPoint], stage: str, last: bool = False) -> float | None:
    matching = [p.result.accuracy for p in points if p.stage == stage]
    return (matching[-1] if last else matching[0]) if matching else None


def run_summary(points: Sequence[EvalPoint], seed: int, wall_s: float, sft_steps: int) -> dict[str, Any]:
    """The keys of ``summary.json``. ``grpo_start_accuracy`` is where GRPO began: after the warm start when
    there was one, else the base model (None for either when a resumed run did not see it)."""
    base = _accuracy_at(points, "base")
    grpo_start = _accuracy_at(points, "sft", last=True) if sft_steps > 0 else base
    final = points[-1].result
    return {
        "base_accuracy": base,
        "grpo_start_accuracy": grpo_start,
        "final_accuracy": final.accuracy,
        "final_ci95": list(final.ci95),
        "num_eval_tasks": final.num_tasks,
        "seed": seed,
        "wall_s": wall_s,
        "sft_steps": sft_steps,
        "eval_history": [p.as_dict() for p in points],
        "by_label": final.by_label,
        "base_by_label": points[0].result.by_label if points[0].stage == "base" else None,
    }


def write_summary(run_dir: str | os.PathLike, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically into ``run_dir``; returns its path."""
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _label_table(summary: dict[str, Any], label: str) -> list[str]:
    final = summary["by_label"].get(label, {})
    base = (summary["base_by_label"] or {}).get(label, {})
    lines = [f"  {label:24} {'base':>6} {'final':>6} {'tasks':>6}"]
    for value, (accuracy, count) in sorted(final.items()):
        before = f"{base[value][0]:6.3f}" if value in base else f"{'-':>6}"
        lines.append(f"  {value:24} {before} {accuracy:6.3f} {count:6d}")
    return lines


def summary_text(summary: dict[str, Any], history: Sequence[dict[str, float]], timer: StepTimer) -> str:
    """The end-of-run report: held-out accuracy by stage with 95% intervals, accuracy by label, the reward
    curve, where the time went and peak memory."""
    lines = ["", "=== pagedrl run summary ==="]
    evals = summary["eval_history"]
    lines.append(
        f"held-out greedy execution accuracy ({summary['num_eval_tasks']} tasks on unseen schemas, 95% CI):"
    )
    for point in evals:
        low, high = point["ci95"]
        lines.append(
            f"  {point['stage']:5} step {point['step']:4d}: {point['accuracy']:.3f} [{low:.3f}, {high:.3f}]"
            f"  reward {point['reward']:+.3f}"
        )
    for key in ("base_accuracy", "grpo_start_accuracy", "final_accuracy"):
        value = summary[key]
        lines.append(f"  {key:20} {'n/a (resumed run)' if value is None else f'{value:.3f}'}")
    for label in summary["by_label"]:
        lines += _label_table(summary, label)
    rewards = [m["reward"] for m in history]
    if rewards:
        width = max(1, len(rewards) // 10)
        chunks = [rewards[i : i + width] for i in range(0, len(rewards), width)]
        curve = " ".join(f"{sum(c) / len(c):.2f}" for c in chunks)
        lines.append(f"train reward (mean per {width} step(s)): {curve}")
    total = sum(timer.totals.values()) or 1.0
    split = ", ".join(
        f"{p} {timer.totals[p]:.0f}s ({100 * timer.totals[p] / total:.0f}%)"
        for p in PHASES
        if p in timer.totals
    )
    lines.append(f"time: {split} (wall {summary['wall_s']:.0f}s)")
    if history:
        last = history[-1]
        lines.append(
            f"peak memory: trainer {last['memory/trainer_peak_gb']:.2f} GB, "
            f"engine KV pool {last['memory/engine_gb']:.2f} GB held of "
            f"{last['memory/engine_reserved_gb']:.2f} GB reserved"
        )
    return "\n".join(lines)
