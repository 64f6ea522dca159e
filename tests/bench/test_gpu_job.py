"""bench/gpu_job.py, the GPU check's `job` part, on the CPU: how far a job got and its per-step phase means,
read from a metrics.jsonl written by hand and from a real tiny run against its own summary.json."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY_JOB = [
    "model=tiny_llama",
    "model.dtype=float32",
    "env.tasks.scale=0.05",
    "prompts_per_step=2",
    "algo.group_size=4",
    "rollout.max_tokens=10",
    "rollout.memory_budget_bytes=1000000000",
    "env.eval_tasks=4",
    "sft.steps=0",
    "num_steps=3",
    "eval_every=2",
]


@pytest.fixture
def gpu_job(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the script's own imports (json_line, machine) live there
    import gpu_job

    return gpu_job


def write_records(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def step(number, at, generate, train, **extra):
    return {"step": number, "time": at, "time/generate": generate, "time/env": 0.5, "time/train": train,
            "time/sync": 0.1, **extra}  # fmt: skip


def test_the_report_times_steps_from_the_second_on_without_those_that_evaluated(gpu_job, tmp_path):
    records = [
        {"stage": "base", "step": 0, "time": 90.0, "eval/accuracy": 0.01},
        {"stage": "sft", "step": 1, "time": 95.0, "sft/nll": 2.0},
        {"step": 0, "time": 100.0, "eval/accuracy": 0.1},  # the warm start's score, where GRPO starts
        step(1, 120.0, 12.0, 6.0),
        step(2, 130.0, 6.0, 3.0),
        step(3, 150.0, 8.0, 4.0, **{"eval/accuracy": 0.2}),  # 20 s: 8 of them the evaluation's
        step(4, 155.0, 2.0, 1.0),
        {"step": 4, "time": 160.0, "eval/accuracy": 0.25},  # the final evaluation
    ]
    write_records(tmp_path / "run", records)
    report = gpu_job.job_report(tmp_path / "run")
    # steps 2 and 4 alone: 10 s and 5 s of wall time, generate 6 and 2, train 3 and 1
    assert report["steps_timed"] == 2 and report["step_s"] == 7.5
    assert (report["generate_s"], report["train_s"], report["env_s"]) == (4.0, 2.0, 0.5)
    assert report["grpo_steps_done"] == 4 and not report["finished"] and report["wall_s"] is None
    assert [(e["stage"], e["step"], e["accuracy"]) for e in report["evals"]] == [
        ("base", 0, 0.01),
        ("start", 0, 0.1),
        ("grpo", 3, 0.2),
        ("grpo", 4, 0.25),
    ]
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"wall_s": 70.0}))
    ended = gpu_job.job_report(tmp_path / "run")
    assert ended["finished"] and ended["wall_s"] == 70.0


def test_a_run_that_logged_no_step_reports_none_timed(gpu_job, tmp_path):
    report = gpu_job.job_report(tmp_path / "never_started")
    assert (report["grpo_steps_done"], report["steps_timed"]) == (0, 0)
    assert report["step_s"] is None and report["train_s"] is None
    assert report["evals"] == [] and not report["finished"]


def run_script(run_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    done = subprocess.run(
        [sys.executable, str(BENCH / "gpu_job.py"), "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done, json.loads(done.stdout.splitlines()[-1])


def test_a_tiny_job_runs_to_its_end_and_reports_what_its_summary_says(tmp_path):
    done, report = run_script(tmp_path / "job", *TINY_JOB)
    assert done.returncode == 0 and report["exit_code"] == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert report["finished"] and report["grpo_steps_done"] == 3 and report["wall_s"] == summary["wall_s"]
    history = [(p["stage"], p["step"], p["accuracy"]) for p in summary["eval_history"]]
    assert [(e["stage"], e["step"], e["accuracy"]) for e in report["evals"][1:]] == history[1:]
    assert report["evals"][0]["accuracy"] == history[0][2]  # the base model's, logged as step 0
    assert report["steps_timed"] == 1 and report["train_s"] > 0  # step 3 alone: step 2 evaluated
    assert not (tmp_path / "job" / "checkpoints").exists()  # checkpoints off


def test_a_job_past_its_deadline_is_stopped_and_reported_as_not_finished(tmp_path):
    done, report = run_script(tmp_path / "job", "--deadline", "0.2", *TINY_JOB)
    assert report["exit_code"] != 0 and not report["finished"] and report["grpo_steps_done"] == 0
    assert "stopped before its end" in done.stdout
