"""The run logger: the JSONL log line by line, what W&B offline writes, W&B failures, and the progress bar."""

import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import wandb
from wandb.proto import wandb_internal_pb2

from rl.report.logger import ProgressBars, RunLogger, SampleRow

STEPS = {
    1: {
        "reward": 0.25,
        "rewards/sql_exec": torch.tensor(0.5),
        "kl": np.float32(0.125),
        "rollout/preemptions": 3,
    },
    2: {
        "reward": 0.75,
        "rewards/sql_exec": torch.tensor(1.0),
        "kl": np.float32(0.0625),
        "rollout/preemptions": 0,
    },
    3: {
        "reward": -1.5,
        "rewards/sql_exec": torch.tensor(0.0),
        "kl": np.float32(2.0),
        "rollout/preemptions": 7,
    },
}
EXPECTED = {  # the same numbers worked out by hand as plain floats
    1: {"reward": 0.25, "rewards/sql_exec": 0.5, "kl": 0.125, "rollout/preemptions": 3.0},
    2: {"reward": 0.75, "rewards/sql_exec": 1.0, "kl": 0.0625, "rollout/preemptions": 0.0},
    3: {"reward": -1.5, "rewards/sql_exec": 0.0, "kl": 2.0, "rollout/preemptions": 7.0},
}
SUMMARY = {
    "success_name": "answer accuracy",
    "eval_tasks_name": "unseen questions",
    "final_accuracy": 0.5,
    "num_eval_tasks": 64,
    "base_accuracy": None,  # a resumed run's
    "by_label": {"op": {"+": [0.5, 64]}},
}
ROWS = [
    SampleRow("SELECT count(*) FROM t?", "SELECT count(*) FROM t;", 1.0),
    SampleRow("Names?", "SELEC", 0.0),
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: a 7-byte header, then LevelDB-style log blocks of 32 KiB whose
    chunks carry a 4-byte checksum, a 2-byte little-endian length and a type (1 full, 2 first, 3 middle,
    4 last)."""
    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    position, chunks, block = 7, [], 32768
    while position + 7 <= len(raw):
        if block - position % block < 7:
            position += block - position % block
            continue
        length, kind = int.from_bytes(raw[position + 4 : position + 6], "little"), raw[position + 6]
        chunks.append(raw[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def finished_wandb_records(path: Path, patience_s: float = 60.0) -> list:
    """The records once the run's closing `exit` record is on disk: wandb-core writes the file after finish()
    returns."""
    deadline = time.monotonic() + patience_s
    while True:
        records = list(wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def test_jsonl_has_one_object_per_step_with_step_time_and_the_metrics(tmp_path):
    start = time.time()
    with RunLogger(tmp_path, wandb_mode="disabled", progress=False, sample_every=2) as logger:
        for step, metrics in STEPS.items():
            logger.log(step, metrics)
        assert [logger.wants_samples(step) for step in (1, 2, 3, 4)] == [False, True, False, True]
        logger.log_samples(2, ROWS)
    end = time.time()

    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert start <= line.pop("time") <= end
        assert line == {"step": line["step"], **EXPECTED[line["step"]]}
    assert read_jsonl(tmp_path / "samples.jsonl") == [
        {
            "step": 2,
            "prompt": "SELECT count(*) FROM t?",
            "completion": "SELECT count(*) FROM t;",
            "reward": 1.0,
        },
        {"step": 2, "prompt": "Names?", "completion": "SELEC", "reward": 0.0},
    ]
    assert not (tmp_path / "wandb").exists()


def test_a_line_torn_by_a_killed_run_is_cut_before_the_resumed_run_appends(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n{"step": 2, "rew')
    (tmp_path / "samples.jsonl").write_text('{"step": 0, "pro')
    with RunLogger(tmp_path, wandb_mode="disabled", progress=False) as logger:
        logger.log(2, {"reward": 0.75})
        logger.log_samples(2, ROWS[:1])
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(line["step"], line["reward"]) for line in lines] == [(1, 0.5), (2, 0.75)]
    assert [line["step"] for line in read_jsonl(tmp_path / "samples.jsonl")] == [2]


def test_bad_metric_values_are_dropped_with_a_warning_and_the_rest_logged(tmp_path):
    with RunLogger(tmp_path, wandb_mode="disabled", progress=False) as logger:
        with pytest.warns(RuntimeWarning) as caught:
            logger.log(1, {"reward": 0.5, "comment": "fine", "step": 9})
    assert sorted(str(w.message).split("=")[0] for w in caught) == ["Metric 'comment'", "Metric 'step'"]
    assert all("single numbers" in str(w.message) and "reserved" in str(w.message) for w in caught)
    (line,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert (line["step"], line["reward"], "comment" in line) == (1, 0.5, False)
    with pytest.raises(ValueError, match="Unknown W&B mode 'cloud'"):
        RunLogger(tmp_path, wandb_mode="cloud")


def test_wandb_offline_run_holds_the_config_the_logged_steps_and_the_samples_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    with RunLogger(
        tmp_path / "run", run_name="tiny", config={"trainer": {"lr": 0.01}}, progress=False
    ) as logger:
        for step, metrics in STEPS.items():
            logger.log(step, metrics)
        logger.log_samples(3, ROWS)
        logger.log_summary(SUMMARY)

    (run_dir,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    records = finished_wandb_records(next(run_dir.glob("run-*.wandb")))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "tiny"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["trainer"] == {"lr": 0.01}
    history = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[row["_step"]] = row
    assert sorted(history) == [1, 2, 3]
    for step, expected in EXPECTED.items():
        assert {key: history[step][key] for key in expected} == expected
    assert history[3]["samples/_type"] == "table-file" and history[3]["samples/nrows"] == 2
    table = json.loads((run_dir / "files" / history[3]["samples/path"]).read_text())
    assert table["columns"] == ["step", "prompt", "completion", "reward"]
    assert table["data"] == [[3, row.prompt, row.completion, row.reward] for row in ROWS]
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update})
    # the run summary's single values, the env's words among them; its tables stay in summary.json
    assert {key: summary.get(key) for key in SUMMARY} == {
        "success_name": "answer accuracy",
        "eval_tasks_name": "unseen questions",
        "final_accuracy": 0.5,
        "num_eval_tasks": 64,
        "base_accuracy": None,
        "by_label": None,
    }


def test_wandb_failing_at_start_degrades_to_a_warning_and_jsonl_continues(tmp_path, monkeypatch):
    def broken_init(**kwargs):
        raise ConnectionError("api.wandb.ai unreachable")

    monkeypatch.setattr(wandb, "init", broken_init)
    with pytest.warns(RuntimeWarning, match="W&B logging failed.*unreachable.*metrics.jsonl"):
        logger = RunLogger(tmp_path, wandb_mode="online", progress=False)
    logger.log(1, STEPS[1])
    logger.log_samples(1, ROWS)
    logger.close()
    assert [line["step"] for line in read_jsonl(tmp_path / "metrics.jsonl")] == [1]
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 2


def test_wandb_failing_mid_run_warns_once_and_jsonl_continues(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    calls = []

    def broken_log(self, *args, **kwargs):
        calls.append(args)
        raise OSError("wandb-core exited")

    logger = RunLogger(tmp_path / "run", progress=False)
    monkeypatch.setattr(wandb.Run, "log", broken_log)
    with pytest.warns(RuntimeWarning, match="W&B logging failed.*wandb-core exited") as caught:
        for step, metrics in STEPS.items():
            logger.log(step, metrics)
        logger.close()
    assert len(calls) == 1 and len([w for w in caught if "W&B" in str(w.message)]) == 1
    assert [line["step"] for line in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    monkeypatch.undo()
    wandb.finish()


def test_progress_bar_shows_position_live_reward_tokens_per_second_and_eta(tmp_path, capsys):
    logger = RunLogger(tmp_path, wandb_mode="disabled", total_steps=5, start_step=2)
    logger.log(3, {"reward": 0.4375, "rollout/tokens_per_s": 1234.4, "eval/accuracy": 0.5})
    shown = capsys.readouterr().err.split("\r")[-1]
    logger.close()
    assert "3/5" in shown and "reward=0.438" in shown and "tok/s=1234" in shown and "acc=0.500" in shown
    assert "<" in shown  # tqdm's elapsed<remaining (the ETA)


def frames(stream: io.StringIO) -> list[str]:
    """What a terminal showed, redraw by redraw: tqdm starts each one with a carriage return."""
    return [frame.strip() for frame in stream.getvalue().split("\r") if frame.strip()]


def test_a_stage_bar_shows_its_total_from_the_start_and_advances_to_it():
    stream = io.StringIO()
    with ProgressBars(stream=stream).bar("held-out eval, base model", 64, "task") as bar:
        shown_at_start = frames(stream)[-1]
        for _ in range(64):
            bar.update(1)
    assert shown_at_start.startswith("held-out eval, base model:   0%|") and "| 0/64 [" in shown_at_start
    assert (
        frames(stream)[-1].startswith("held-out eval, base model: 100%|")
        and "| 64/64 [" in frames(stream)[-1]
    )
    assert stream.getvalue().endswith("\n")  # a bar opened alone stays on screen as its stage's record


def test_grpo_bar_is_drawn_from_the_start_of_grpo_to_its_end(tmp_path):
    stream = io.StringIO()
    logger = RunLogger(tmp_path, wandb_mode="disabled", total_steps=40, stream=stream)
    assert stream.getvalue() == ""  # the stages before GRPO draw their own bars meanwhile
    logger.start_grpo()
    assert frames(stream)[-1].startswith("GRPO:   0%|") and "| 0/40 [" in frames(stream)[-1]
    logger.log(1, {"reward": 0.5})
    logger.end_grpo()
    assert "| 1/40 [" in frames(stream)[-1] and "reward=0.500" in frames(stream)[-1]
    drawn = stream.getvalue()
    logger.log(40, {"eval/accuracy": 0.5})  # the final evaluation's metrics: its own bar showed its progress
    logger.close()
    assert stream.getvalue() == drawn


def test_progress_off_draws_no_bar_at_all(tmp_path):
    stream = io.StringIO()
    logger = RunLogger(tmp_path, wandb_mode="disabled", total_steps=4, progress=False, stream=stream)
    with logger.bars.bar("warm start", 3, "step") as bar:
        bar.update(3)
    logger.start_grpo()
    logger.log(1, {"reward": 0.5})
    logger.close()
    assert stream.getvalue() == ""


def test_a_resumed_run_logs_into_the_same_wandb_run(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        def __init__(self, run_id):
            self.id = run_id

        def finish(self):
            pass

    def fake_init(**kwargs):
        calls.append(kwargs)
        return FakeRun(kwargs["id"] or f"run{len(calls)}")

    monkeypatch.setattr(wandb, "init", fake_init)
    RunLogger(tmp_path, progress=False).close()
    assert (tmp_path / "wandb_run_id").read_text() == "run1"
    RunLogger(tmp_path, progress=False, resume=True).close()
    RunLogger(tmp_path, progress=False).close()  # no resume: a new W&B run, whose id is kept from now on
    assert [(c["id"], c["resume"]) for c in calls] == [(None, None), ("run1", "allow"), (None, None)]
    assert (tmp_path / "wandb_run_id").read_text() == "run3"
    RunLogger(tmp_path / "fresh", progress=False, resume=True).close()  # resume=true before any W&B run
    assert (calls[-1]["id"], calls[-1]["resume"]) == (None, None)
