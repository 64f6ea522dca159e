"""The run's learning record: every held-out evaluation by stage, ``summary.json``, and the printed summary.

Stages: ``base`` (the untouched model, before anything trains), ``sft`` (after the supervised warm start:
where GRPO starts) and ``grpo`` (every ``eval_every`` GRPO steps and at the end). A transfer set, when one is
configured, is scored at the base, after the warm start and at the end only; its keys start with
``transfer_``, and a run without one has none of them. The score is named in the env's own words
(``envs.ScoreWords``: "execution accuracy" on "tasks on unseen schemas" for SQL), kept in ``summary.json``
as ``success_name`` and ``eval_tasks_name``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs import ScoreWords
from rl.eval.evaluate import EvalResult
from rl.eval.pass_at_k import PassAtK
from rl.report.metrics import PHASES, StepTimer

SUMMARY_FILE = "summary.json"


@dataclass(slots=True)
class EvalPoint:
    stage: str  # base | sft | grpo
    step: int  # the stage's own step count when the evaluation ran
    result: EvalResult  # the held-out set's
    transfer: EvalResult | None = None  # the transfer set's, where it was scored
    passk: PassAtK | None = None  # the held-out set's pass@k from sampled answers (eval.samples)

    def metrics(self) -> dict[str, float]:
        """``eval/*`` for the held-out set (with ``eval/pass@k`` where it was sampled), and ``transfer/*``
        where the transfer set was scored."""
        transfer = self.transfer.metrics(prefix="transfer") if self.transfer is not None else {}
        sampled = (
            {f"eval/pass@{k}": v for k, v in self.passk.overall.items()} if self.passk is not None else {}
        )
        return {**self.result.metrics(), **sampled, **transfer}

    def as_dict(self) -> dict[str, Any]:
        low, high = self.result.ci95
        point = {
            "stage": self.stage,
            "step": self.step,
            "accuracy": self.result.accuracy,
            "ci95": [low, high],
            "reward": self.result.reward,
            "num_tasks": self.result.num_tasks,
        }
        if self.passk is not None:
            point["pass_at_k"] = {str(k): v for k, v in self.passk.overall.items()}
        if self.transfer is not None:
            point.update(
                transfer_accuracy=self.transfer.accuracy,
                transfer_ci95=list(self.transfer.ci95),
                transfer_reward=self.transfer.reward,
                transfer_num_tasks=self.transfer.num_tasks,
            )
        return point


def _base_result(points: Sequence[EvalPoint], transfer: bool = False) -> EvalResult | None:
    """The base model's evaluation (of the transfer set with `transfer`), where the run scored it."""
    matching = [p.transfer if transfer else p.result for p in points if p.stage == "base"]
    return next((r for r in matching if r is not None), None)


def _grpo_start(points: Sequence[EvalPoint], transfer: bool = False) -> float | None:
    """The accuracy GRPO began from: the last evaluation before it (the warm start's, else the base model's or
    the starting checkpoint's); None when the run did not see it (a resumed run)."""
    before = [p.transfer if transfer else p.result for p in points if p.stage != "grpo"]
    before = [r for r in before if r is not None]
    return before[-1].accuracy if before else None


def transfer_summary(points: Sequence[EvalPoint]) -> dict[str, Any]:
    """The ``transfer_*`` keys of ``summary.json``; none when no point scored a transfer set."""
    scored = [p.transfer for p in points if p.transfer is not None]
    if not scored:
        return {}
    base = _base_result(points, transfer=True)
    base_accuracy = None if base is None else base.accuracy
    start = _grpo_start(points, transfer=True)
    final = scored[-1]
    return {
        "transfer_base_accuracy": base_accuracy,
        "transfer_grpo_start_accuracy": start,
        "transfer_final_accuracy": final.accuracy,
        "transfer_final_ci95": list(final.ci95),
        "transfer_num_tasks": final.num_tasks,
        "transfer_by_label": final.by_label,
        "transfer_base_by_label": None if base is None else base.by_label,
        "transfer_failures": final.failures,
        "transfer_base_failures": None if base is None else base.failures,
    }


def run_summary(
    points: Sequence[EvalPoint], seed: int, wall_s: float, sft_steps: int, words: ScoreWords
) -> dict[str, Any]:
    """The keys of ``summary.json``. ``grpo_start_accuracy`` is where GRPO began: after the warm start when
    there was one, else the base model, or the checkpoint the run started from (None for any of them when a
    resumed run did not see it; ``base_accuracy`` is None too when the run started from a checkpoint).
    ``words`` are the env's names for its score and its held-out tasks. ``best_eval`` is the point that
    scored highest (the earliest of a tie): where a run with intermediate points (sft.eval_every,
    eval_every) should stop."""
    base = _base_result(points)
    best = max(points, key=lambda p: p.result.accuracy)  # max keeps the first of equals
    grpo_start = _grpo_start(points)
    final = points[-1].result
    return {
        "success_name": words.success,
        "eval_tasks_name": words.tasks,
        "base_accuracy": None if base is None else base.accuracy,
        "grpo_start_accuracy": grpo_start,
        "final_accuracy": final.accuracy,
        "final_ci95": list(final.ci95),
        "best_eval": {"stage": best.stage, "step": best.step, "accuracy": best.result.accuracy},
        "num_eval_tasks": final.num_tasks,
        "seed": seed,
        "wall_s": wall_s,
        "sft_steps": sft_steps,
        "eval_history": [p.as_dict() for p in points],
        "by_label": final.by_label,
        "base_by_label": points[0].result.by_label if points[0].stage == "base" else None,
        "failures": final.failures,
        "base_failures": points[0].result.failures if points[0].stage == "base" else None,
        **transfer_summary(points),
    }


def write_summary(run_dir: str | os.PathLike, summary: dict[str, Any]) -> Path:
    """Write ``summary.json`` atomically into ``run_dir``; returns its path."""
    path = Path(run_dir) / SUMMARY_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _label_table(summary: dict[str, Any], label: str, prefix: str = "") -> list[str]:
    final = summary[f"{prefix}by_label"].get(label, {})
    base = (summary[f"{prefix}base_by_label"] or {}).get(label, {})
    lines = [f"  {label:24} {'base':>6} {'final':>6} {'tasks':>6}"]
    for value, (accuracy, count) in sorted(final.items()):
        before = f"{base[value][0]:6.3f}" if value in base else f"{'-':>6}"
        lines.append(f"  {value:24} {before} {accuracy:6.3f} {count:6d}")
    return lines


def _failure_table(summary: dict[str, Any], prefix: str = "") -> list[str]:
    """Why the unsolved tasks failed, as shares of all tasks, at the base and at the end (none: no lines)."""
    final = summary[f"{prefix}failures"]
    base = summary[f"{prefix}base_failures"] or {}
    if not final and not base:
        return []
    tasks = summary[f"{prefix}num_tasks" if prefix else "num_eval_tasks"]
    lines = [f"  {'failed, why':24} {'base':>6} {'final':>6}"]
    for kind in sorted(final.keys() | base.keys(), key=lambda k: (-final.get(k, 0), k)):
        before = f"{base.get(kind, 0) / tasks:6.3f}" if base else f"{'-':>6}"
        lines.append(f"  {kind:24} {before} {final.get(kind, 0) / tasks:6.3f}")
    return lines


def _stage_accuracies(summary: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for key in ("base_accuracy", "grpo_start_accuracy", "final_accuracy"):
        value = summary[prefix + key]
        name = f"{prefix + key:{20 + len(prefix)}}"
        lines.append(f"  {name} {'n/a (not scored in this run)' if value is None else f'{value:.3f}'}")
    return lines


def _transfer_lines(summary: dict[str, Any]) -> list[str]:
    """The transfer set's accuracy at each stage it was scored at, and by label at the end and the base."""
    lines = [
        f"transfer set greedy {summary['success_name']} ({summary['transfer_num_tasks']} tasks, 95% CI):"
    ]
    for point in summary["eval_history"]:
        if "transfer_accuracy" in point:
            low, high = point["transfer_ci95"]
            lines.append(
                f"  {point['stage']:5} step {point['step']:4d}: {point['transfer_accuracy']:.3f} "
                f"[{low:.3f}, {high:.3f}]  reward {point['transfer_reward']:+.3f}"
            )
    lines += _stage_accuracies(summary, prefix="transfer_")
    for label in summary["transfer_by_label"]:
        lines += _label_table(summary, label, prefix="transfer_")
    return lines + _failure_table(summary, prefix="transfer_")


def summary_text(summary: dict[str, Any], history: Sequence[dict[str, float]], timer: StepTimer) -> str:
    """The end-of-run report: held-out accuracy by stage with 95% intervals, accuracy by label, the reward
    curve, where the time went and peak memory."""
    lines = ["", "=== pagedrl run summary ==="]
    evals = summary["eval_history"]
    tasks = f"{summary['num_eval_tasks']} {summary['eval_tasks_name']}"
    lines.append(f"held-out greedy {summary['success_name']} ({tasks}, 95% CI):")
    for point in evals:
        low, high = point["ci95"]
        lines.append(
            f"  {point['stage']:5} step {point['step']:4d}: {point['accuracy']:.3f} [{low:.3f}, {high:.3f}]"
            f"  reward {point['reward']:+.3f}"
        )
    best = summary["best_eval"]
    if len(evals) > 2:
        lines.append(f"  best: {best['stage']} step {best['step']} ({best['accuracy']:.3f})")
    lines += _stage_accuracies(summary)
    for label in summary["by_label"]:
        lines += _label_table(summary, label)
    lines += _failure_table(summary)
    if "transfer_final_accuracy" in summary:
        lines += _transfer_lines(summary)
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
            f"peak memory: process RSS {last['memory/peak_rss_gb']:.2f} GB"
            + (f", CUDA {last['memory/cuda_peak_gb']:.2f} GB" if "memory/cuda_peak_gb" in last else "")
            + f", engine KV pool {last['memory/kv_held_peak_gb']:.2f} GB held of "
            f"{last['memory/kv_reserved_gb']:.2f} GB reserved"
        )
    return "\n".join(lines)
