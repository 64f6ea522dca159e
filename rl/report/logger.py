"""The run logger: a local JSONL metrics log always, W&B (offline by default), sample tables, progress bars.

``RUN_DIR/metrics.jsonl`` holds one JSON object per ``log`` call: ``step``, ``time`` (Unix seconds) and the
metrics under their own names (``reward``, ``rewards/<component>``, ``kl``, ``rollout/tokens_per_s`` ...).
``RUN_DIR/samples.jsonl`` holds the sampled prompts, completions and rewards. W&B is a mirror: any failure in
it becomes one warning, W&B is switched off and the JSONL logs go on. ``RUN_DIR/wandb_run_id`` holds the W&B
run's id, so a resumed run (``resume=True``) goes on logging into the same W&B run.

Every stage draws its own progress bar (``ProgressBars``): each evaluation over its tasks, the warm start over
its steps, and GRPO over its steps (from ``start_grpo`` to ``end_grpo``, so it neither sits at 0 while the
stages before it run nor holds the final evaluation's bar below it). ``logger.progress=false`` draws none.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm.auto import tqdm

from rl.settings import Settings, at_least, choices

WANDB_MODES = ("offline", "online", "disabled")
WandbMode = choices("WandbMode", WANDB_MODES)
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
WANDB_RUN_ID_FILE = "wandb_run_id"
RESERVED = ("step", "time", "stage")
SAMPLE_COLUMNS = ("step", "prompt", "completion", "reward")
# progress-bar label: (metric, format)
PROGRESS_FIELDS = {
    "reward": ("reward", ".3f"),
    "tok/s": ("rollout/tokens_per_s", ".0f"),
    "acc": ("eval/accuracy", ".3f"),
}


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.offline  # offline needs no account or network; `wandb sync` uploads later
    project: str = "pagedrl"
    run_name: str | None = None


@dataclass
class LoggerConfig(Settings):
    """The logger's settings (the logger.* keys); `RunLogger` takes them as flat arguments."""

    RULES = (("samples_every", at_least(1), "use an integer >= 1"),)

    wandb: WandbConfig = field(default_factory=WandbConfig)
    samples_every: int = 5  # a table of prompts, completions and rewards every N steps
    progress: bool = True


class ProgressBars:
    """Opens one terminal progress bar per stage on `stream` (stderr when None); draws nothing when
    `enabled` is False. A bar opened while another is open (an evaluation during GRPO) sits below it and is
    cleared when it closes; a bar opened alone stays on screen as the record of its stage."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream

    def bar(self, desc: str, total: int, unit: str, initial: int = 0) -> tqdm:
        """A bar for `total` `unit`s of work named `desc`; use it as a context manager, advance it with
        ``update(n)``."""
        return tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            dynamic_ncols=True,
            file=self.stream,
            leave=None,  # tqdm: kept when it is the top bar, cleared when it sits below another
            disable=not self.enabled,
        )


@dataclass(slots=True)
class SampleRow:
    """One sampled completion for the samples table."""

    prompt: str
    completion: str
    reward: float


class RunLogger:
    """Logs each step to JSONL, W&B and a progress bar; use it as a context manager or call ``close``."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        project: str = WandbConfig.project,
        run_name: str | None = WandbConfig.run_name,
        wandb_mode: str = WandbConfig.mode.value,
        config: Mapping[str, Any] | None = None,
        wandb_dir: str | os.PathLike | None = None,
        total_steps: int | None = None,
        start_step: int = 0,
        sample_every: int = LoggerConfig.samples_every,
        progress: bool = LoggerConfig.progress,
        resume: bool = False,
        stream: TextIO | None = None,
    ):
        if wandb_mode not in WANDB_MODES:
            raise ValueError(
                f"Unknown W&B mode {wandb_mode!r}: use one of {WANDB_MODES} (logger.wandb.mode)."
            )
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.sample_every = sample_every
        self._metrics = _open_for_append(self.run_dir / METRICS_FILE)
        self._samples = _open_for_append(self.run_dir / SAMPLES_FILE)
        self._last_step = start_step
        self._total_steps = total_steps
        self.bars = ProgressBars(progress, stream)  # every stage's bars, drawn as the logger's settings say
        self._bar: tqdm | None = None  # GRPO's, from start_grpo on
        self._wandb = None
        self._run = None
        if wandb_mode != "disabled":
            self._start_wandb(project, run_name, wandb_mode, config, wandb_dir, resume)

    def start_grpo(self) -> None:
        """Open GRPO's progress bar at the run's start step; ``log`` advances it (and opens it if needed)."""
        if self._bar is None:
            self._bar = self.bars.bar("GRPO", self._total_steps, "step", initial=self._last_step)

    def end_grpo(self) -> None:
        """Close GRPO's progress bar for good: what follows (the final evaluation) draws its own."""
        self.start_grpo()
        self._bar.close()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append one step's metrics (floats, ints, 0-d tensors) to the JSONL log, W&B and the bar."""
        values = _numeric(metrics)
        self._write(self._metrics, {"step": step, "time": time.time(), **values})
        self._call_wandb(lambda: self._run.log(values, step=step))
        self._advance(step, values)

    def log_stage(self, stage: str, step: int, metrics: Mapping[str, Any]) -> None:
        """Log a step of a stage other than GRPO (the supervised warm start, the base model's evaluation).

        The JSONL record carries ``"stage"`` beside its own step count; W&B keeps the stage's latest values
        in the run summary, since its history axis is the GRPO step.
        """
        values = _numeric(metrics)
        self._write(self._metrics, {"stage": stage, "step": step, "time": time.time(), **values})
        named = {key if key.startswith(f"{stage}/") else f"{stage}/{key}": v for key, v in values.items()}
        self._call_wandb(lambda: self._run.summary.update(named))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The run summary's single values (summary.json's accuracies, task count, wall time, and the env's
        names for its score: ``success_name``, ``eval_tasks_name``) into the W&B run's summary."""
        values = {key: v for key, v in summary.items() if isinstance(v, (int, float, str))}
        self._call_wandb(lambda: self._run.summary.update(values))

    def wants_samples(self, step: int) -> bool:
        """Whether ``step`` is one whose samples go into the table (every ``sample_every`` steps)."""
        return step % self.sample_every == 0

    def log_samples(self, step: int, rows: Sequence[SampleRow]) -> None:
        """Write sample prompts, completions and rewards to samples.jsonl and a W&B table."""
        records = [{"step": step, **asdict(row)} for row in rows]
        for record in records:
            self._write(self._samples, record)
        self._call_wandb(lambda: self._run.log({"samples": self._table(records)}, step=step))

    def close(self) -> None:
        """Finish W&B and close the logs and the progress bar; safe to call twice."""
        self._call_wandb(lambda: self._run.finish())
        self._run = None
        if self._bar is not None:
            self._bar.close()
        self._metrics.close()
        self._samples.close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start_wandb(self, project, run_name, mode, config, wandb_dir, resume) -> None:
        """Start a W&B run, or with ``resume`` continue the one whose id this run directory holds."""
        id_file = self.run_dir / WANDB_RUN_ID_FILE
        try:
            import wandb

            run_id = id_file.read_text().strip() if resume and id_file.is_file() else ""

            directory = Path(wandb_dir or os.environ.get("WANDB_DIR") or self.run_dir)
            directory.mkdir(parents=True, exist_ok=True)
            # console="off": W&B must not wrap stdout/stderr, which the progress bar draws on
            settings = wandb.Settings(console="off")
            self._run = wandb.init(
                project=project,
                name=run_name,
                mode=mode,
                dir=directory,
                config=dict(config or {}),
                settings=settings,
                id=run_id or None,
                resume="allow" if run_id else None,
            )
            id_file.write_text(self._run.id)
            self._wandb = wandb
        except Exception as error:  # no W&B (not installed, no login, no network) still leaves the JSONL log
            self._wandb_failed(error)

    def _call_wandb(self, action: Callable[[], Any]) -> None:
        if self._run is None:
            return
        try:
            action()
        except Exception as error:  # any W&B failure must leave training and the JSONL log running
            self._wandb_failed(error)

    def _wandb_failed(self, error: Exception) -> None:
        self._run = None
        warnings.warn(
            f"W&B logging failed and is off for the rest of this run ({type(error).__name__}: {error}); "
            f"the metrics go on in {self.run_dir / METRICS_FILE}. Set logger.wandb.mode=disabled to skip "
            "W&B.",
            RuntimeWarning,
            stacklevel=4,
        )

    def _table(self, records: list[dict[str, Any]]):
        return self._wandb.Table(
            columns=list(SAMPLE_COLUMNS), data=[[record[c] for c in SAMPLE_COLUMNS] for record in records]
        )

    def _advance(self, step: int, values: dict[str, float]) -> None:
        self.start_grpo()
        if step > self._last_step:
            self._bar.update(step - self._last_step)
            self._last_step = step
        postfix = {
            label: format(values[key], spec)
            for label, (key, spec) in PROGRESS_FIELDS.items()
            if key in values
        }
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.refresh()

    @staticmethod
    def _write(file, record: dict[str, Any]) -> None:
        file.write(json.dumps(record) + "\n")
        file.flush()


def _open_for_append(path: Path):
    """Open a JSONL log for appending, first cutting off a last line torn by a killed run (resume appends)."""
    if path.exists():
        content = path.read_bytes()
        if content and not content.endswith(b"\n"):
            os.truncate(path, content.rfind(b"\n") + 1)
    return open(path, "a")


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics as floats; a reserved name or a value that is not a number is dropped with a warning."""
    values = {}
    for key, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):
            number = None
        if key in RESERVED or number is None:
            warnings.warn(
                f"Metric {key!r}={value!r} is not logged: metric values must be single numbers and the names "
                f"{RESERVED} are reserved.",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        values[key] = number
    return values
