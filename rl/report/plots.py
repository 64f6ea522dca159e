"""PNG plots of a run's metrics log, for users without W&B: ``python -m rl.report.plots RUN_DIR [--out DIR]``.

Reads ``RUN_DIR/metrics.jsonl`` (written by ``rl.report.logger.RunLogger``) and draws the reward, held-out
accuracy, KL, completion lengths, rollout throughput and the step-time breakdown, each only when its metrics
are in the log; from ``RUN_DIR/summary.json`` it draws the learning curve over every stage (the base model,
the warm start, GRPO) with 95% intervals, and takes the env's names for its score and its tasks. A step
logged twice (a resumed run repeats the steps after its checkpoint) keeps its last value.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from matplotlib.figure import Figure

from rl.report.logger import METRICS_FILE, RESERVED
from rl.report.summary import SUMMARY_FILE

Series = dict[str, dict[int, float]]  # metric -> step -> value


class PlotSpec(NamedTuple):
    file: str
    title: str
    ylabel: str
    metrics: tuple[str, ...]  # a name ending in "/" stands for every metric under that prefix


PLOTS = (
    PlotSpec("reward.png", "Reward", "mean reward", ("reward", "rewards/")),
    PlotSpec("eval_accuracy.png", "Held-out {success}", "{success}", ("eval/accuracy",)),
    PlotSpec("kl.png", "KL to the reference policy", "KL", ("kl",)),
    PlotSpec(
        "completion_lengths.png",
        "Completion lengths",
        "tokens",
        ("completions/mean_length", "completions/min_length", "completions/max_length"),
    ),
    PlotSpec("throughput.png", "Rollout throughput", "tokens / s", ("rollout/tokens_per_s",)),
    PlotSpec("step_time.png", "Where the step time goes", "seconds", ("time/",)),
)


class ReportError(ValueError):
    """A missing or malformed metrics log."""


@dataclass(slots=True)
class Report:
    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # one note per plot left out


def load_metrics(path: str | os.PathLike) -> Series:
    """Each metric's values by GRPO step from a metrics.jsonl; the last value logged for a step wins."""
    series = stage_metrics(path, stage=None)
    if not series:
        raise ReportError(f"{path} holds no metrics: log at least one step before making a report.")
    return series


def stage_metrics(path: str | os.PathLike, stage: str | None) -> Series:
    """The series of one stage's records (``"stage": "sft"``, ...), or of GRPO's (stage None, no key)."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(
            f"No metrics log at {path}: pass the directory of a training run (it holds {METRICS_FILE})."
        )
    series: Series = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ReportError(
                f"{path}:{number} is not valid JSON ({error}): each line must be one JSON object."
            ) from error
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ReportError(
                f"{path}:{number} is not a metrics record: each line must be a JSON object with an integer "
                "'step'."
            )
        if record.get("stage") != stage:
            continue
        for key, value in record.items():
            if key not in RESERVED and isinstance(value, (int, float)) and math.isfinite(value):
                series.setdefault(key, {})[record["step"]] = float(value)
    return series


def _read_summary(run_dir: str | os.PathLike) -> dict | None:
    """The run's summary.json, or None before the run has finished."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _score_names(summary: dict | None) -> tuple[str, str]:
    """The env's names for its held-out score and tasks (summary.json's ``success_name`` and
    ``eval_tasks_name``); plain words for an unfinished run or a summary written before runs kept them."""
    summary = summary or {}
    return summary.get("success_name", "accuracy"), summary.get("eval_tasks_name", "tasks")


def write_plots(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Report:
    """Write one PNG per plot whose metrics are in the run's log (to RUN_DIR/plots by default)."""
    series = load_metrics(Path(run_dir) / METRICS_FILE)
    summary = _read_summary(run_dir)
    success, _ = _score_names(summary)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    report = Report()
    for spec in PLOTS:
        names = _matching(spec.metrics, series)
        if not names:
            report.skipped.append(f"{spec.file}: no {' or '.join(spec.metrics)} in the log")
            continue
        named = spec._replace(
            title=spec.title.format(success=success), ylabel=spec.ylabel.format(success=success)
        )
        _draw(named, {name: series[name] for name in names}, series.get("reward_std"), out / spec.file)
        report.written.append(out / spec.file)
    write_learning_curve(run_dir, summary, out, report)
    return report


def write_learning_curve(run_dir: str | os.PathLike, summary: dict | None, out: Path, report: Report) -> None:
    """learning_curve.png from summary.json: held-out accuracy with its 95% interval at every evaluation,
    the warm start's steps first and GRPO's after them; and the warm start's NLL when the log has it."""
    if summary is None:
        report.skipped.append(f"learning_curve.png: no {SUMMARY_FILE} (the run has not finished)")
        return
    success, tasks = _score_names(summary)
    sft_steps = summary.get("sft_steps", 0)
    figure = Figure(figsize=(7, 4), dpi=100)
    axes = figure.add_subplot()
    for stage, colour in (("base", "black"), ("sft", "tab:orange"), ("grpo", "tab:blue")):
        points = [p for p in summary["eval_history"] if p["stage"] == stage]
        if not points:
            continue
        x = [p["step"] + (sft_steps if stage == "grpo" else 0) for p in points]
        y = [p["accuracy"] for p in points]
        errors = [
            [a - p["ci95"][0] for a, p in zip(y, points, strict=True)],
            [p["ci95"][1] - a for a, p in zip(y, points, strict=True)],
        ]
        axes.errorbar(x, y, yerr=errors, marker="o", capsize=3, color=colour, label=stage)
        start = [p for p in summary["eval_history"] if p["stage"] != "grpo"]
        if stage == "grpo" and start:  # GRPO's line starts where the stages before it ended
            axes.plot([start[-1]["step"], x[0]], [start[-1]["accuracy"], y[0]], color=colour)
    if sft_steps:
        axes.axvline(sft_steps, linestyle="--", color="grey", alpha=0.6)
    title = f"Held-out greedy {success} ({summary['num_eval_tasks']} {tasks}, seed {summary['seed']}, 95% CI)"
    xlabel = "optimizer step (warm start, then GRPO)" if sft_steps else "GRPO step"
    axes.set(title=title, xlabel=xlabel, ylabel=success)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(out / "learning_curve.png")
    report.written.append(out / "learning_curve.png")
    nll = stage_metrics(Path(run_dir) / METRICS_FILE, "sft").get("sft/nll")
    if nll:
        _draw(PlotSpec("sft_nll.png", "Warm start: NLL of the demonstrations", "nll", ()), {"sft/nll": nll},
              None, out / "sft_nll.png")  # fmt: skip
        report.written.append(out / "sft_nll.png")


def _matching(patterns: tuple[str, ...], series: Series) -> list[str]:
    names = []
    for pattern in patterns:
        if pattern.endswith("/"):
            names += sorted(name for name in series if name.startswith(pattern))
        elif pattern in series:
            names.append(pattern)
    return names


def _draw(spec: PlotSpec, lines: Series, reward_std: dict[int, float] | None, path: Path) -> None:
    figure = Figure(figsize=(7, 4), dpi=100)
    axes = figure.add_subplot()
    for name, values in lines.items():
        steps = sorted(values)
        axes.plot(steps, [values[s] for s in steps], marker="o" if len(steps) < 30 else None, label=name)
        if name == "reward" and reward_std:
            band = [s for s in steps if s in reward_std]
            low = [values[s] - reward_std[s] for s in band]
            high = [values[s] + reward_std[s] for s in band]
            axes.fill_between(band, low, high, alpha=0.2, label="reward ± std")
    axes.set(title=spec.title, xlabel="step", ylabel=spec.ylabel)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)


def main(argv: list[str] | None = None) -> int:
    """Command line: write the plots and list what was written and what was skipped."""
    parser = argparse.ArgumentParser(prog="python -m rl.report.plots", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help=f"a training run's directory (holding {METRICS_FILE})")
    parser.add_argument("--out", default=None, help="where to write the PNGs (default: RUN_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        report = write_plots(args.run_dir, args.out)
    except ReportError as error:
        parser.error(str(error))
    for path in report.written:
        print(f"wrote {path}")
    for note in report.skipped:
        print(f"skipped {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
