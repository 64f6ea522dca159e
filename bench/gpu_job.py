"""The default job run whole, or until a deadline, and where its GRPO steps' time went.

    python bench/gpu_job.py --run-dir /tmp/job                   # python train.py, the default job
    python bench/gpu_job.py --run-dir /tmp/job --deadline 300 num_steps=10

Arguments after the options are Hydra overrides of the job (conf/train.yaml). `bash bench/gpu_check.sh job`
runs it on the GPU with its run directory under $OUT. The job runs as `python train.py` in a child process,
with checkpoints, W&B and progress bars off. At the deadline it is interrupted (Ctrl-C, then killed 15 s
later). Under bench/gpu_check.sh the deadline falls 25 s before the part's limit.

Its metrics.jsonl then says how far it got and where the time went:
- the GRPO steps done, and whether the job ran to its end;
- per GRPO step, from the second on (the first pays for first calls), leaving out the steps that also
  evaluated: the mean of each phase the job logs (time/generate, env, train, sync) and of its wall time;
- every held-out evaluation's accuracy, by stage and step.

Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from json_line import emit
from machine import cpu_description

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("generate", "env", "train", "sync")
STOP_GRACE_S = 15  # how long an interrupted job may take to stop before it is killed
REPORT_S = 25  # what stopping the job and reporting may take, under bench/gpu_check.sh's limit for the part
DEFAULT_LIMIT_S = 425  # that limit where the script runs on its own


def run_job(run_dir: Path, overrides: list[str], deadline_s: float) -> tuple[int, float]:
    """Run the job to its end or to the deadline; (its exit code, its wall seconds)."""
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        f"run_dir={run_dir}",
        "checkpoint_every=0",
        "logger.wandb.mode=disabled",
        "logger.progress=false",
        *overrides,
    ]
    started = time.monotonic()
    job = subprocess.Popen(command, cwd=ROOT)
    try:
        code = job.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        job.send_signal(signal.SIGINT)
        try:
            code = job.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            job.kill()
            code = job.wait()
    return code, time.monotonic() - started


def job_report(run_dir: Path) -> dict:
    """How far the run in `run_dir` got, and its per-step phase means, read from its metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    evals = [
        {
            "stage": r.get("stage", "grpo" if r["step"] else "start"),
            "step": r["step"],
            "accuracy": r["eval/accuracy"],
        }
        for r in records
        if "eval/accuracy" in r
    ]
    steps: dict[int, dict] = {}
    for record in records:
        if "stage" not in record and "time/generate" in record:
            steps.setdefault(record["step"], record)
    timed = [
        (record, record["time"] - steps[step - 1]["time"])
        for step, record in sorted(steps.items())
        if step >= 2 and step - 1 in steps and "eval/accuracy" not in record
    ]
    means = {f"{p}_s": statistics.fmean(r[f"time/{p}"] for r, _ in timed) if timed else None for p in PHASES}
    summary = run_dir / "summary.json"
    return {
        "grpo_steps_done": len(steps),
        "finished": summary.exists(),
        "steps_timed": len(timed),
        "step_s": statistics.fmean(wall for _, wall in timed) if timed else None,
        **means,
        "evals": evals,
        "wall_s": json.loads(summary.read_text())["wall_s"] if summary.exists() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="a new directory for the job's run")
    limit = float(os.environ.get("PART_LIMIT_S", DEFAULT_LIMIT_S))  # gpu_check.sh's limit for the part
    parser.add_argument(
        "--deadline", type=float, default=limit - REPORT_S, help="seconds before the job is stopped"
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the job")
    args = parser.parse_args()
    code, seconds = run_job(args.run_dir, args.overrides, args.deadline)
    report = job_report(args.run_dir)
    print(
        f"job: exit {code} after {seconds:.0f} s, {report['grpo_steps_done']} GRPO steps, "
        f"{'to its end' if report['finished'] else 'stopped before its end'}"
    )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    emit("gpu_job", {"device": device, **cpu_description(), "exit_code": code, "seconds": seconds, **report})


if __name__ == "__main__":
    main()
