"""rl.report.plots: PNG plots from a synthetic metrics log, skipped plots, and clear errors for bad logs."""

import json
import runpy
import sys

import matplotlib.image
import numpy as np
import pytest
from matplotlib.figure import Figure

from envs import ScoreWords
from rl.report.logger import RunLogger
from rl.report.plots import ReportError, load_metrics, main, write_plots

WORDS = ScoreWords(success="answer accuracy", tasks="unseen questions")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIRST_LINE_RGB = np.array([0x1F, 0x77, 0xB4]) / 255  # matplotlib's default first line colour, C0


def record(step: int, reward: float) -> dict:
    return {
        "step": step,
        "time": 1000.0 + step,
        "reward": reward,
        "rewards/sql_exec": 0.04 * step,
        "rewards/format": 0.01 * step,
        "reward_std": 0.1,
        "kl": 0.001 * step**2,
        "completions/mean_length": 40.0 - step,
        "completions/min_length": 10.0,
        "completions/max_length": 64.0,
        "rollout/tokens_per_s": 900.0 + 10 * step,
        "time/generate": 2.0,
        "time/train": 1.5,
    }


def synthetic_log(num_steps: int = 12, resumed_at: int | None = 8) -> list[dict]:
    """A run without eval/accuracy. With `resumed_at`, the steps after it are logged twice: first with the
    reward -1 by a run that then crashed, then with reward 0.05 * step by the run resumed from that step."""
    crashed = resumed_at if resumed_at is not None else num_steps
    first = [record(step, 0.05 * step if step <= crashed else -1.0) for step in range(1, num_steps + 1)]
    return first + [record(step, 0.05 * step) for step in range(crashed + 1, num_steps + 1)]


def write_log(run_dir, records) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def assert_drawn_png(path) -> None:
    raw = path.read_bytes()
    assert raw[:8] == PNG_SIGNATURE
    assert (int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")) == (700, 400)  # IHDR
    pixels = matplotlib.image.imread(path)[..., :3]  # [height, width, rgb]
    assert pixels.std() > 0.05  # not a blank canvas
    assert (np.abs(pixels - FIRST_LINE_RGB).max(axis=-1) < 0.02).sum() > 100  # the first curve is drawn


def test_report_writes_a_png_per_present_metric_and_notes_the_missing_one(tmp_path, capsys):
    write_log(tmp_path, synthetic_log())
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    written = ["reward.png", "kl.png", "completion_lengths.png", "throughput.png", "step_time.png"]
    for name in written:
        assert_drawn_png(tmp_path / "plots" / name)
        assert f"wrote {tmp_path / 'plots' / name}" in out
    assert not (tmp_path / "plots" / "eval_accuracy.png").exists()
    assert "skipped eval_accuracy.png: no eval/accuracy in the log" in out


def test_eval_accuracy_is_plotted_when_present_and_out_dir_is_honoured(tmp_path):
    write_log(tmp_path / "run", [{"step": 0, "eval/accuracy": 0.2}, {"step": 10, "eval/accuracy": 0.45}])
    report = write_plots(tmp_path / "run", tmp_path / "figures")
    assert report.written == [tmp_path / "figures" / "eval_accuracy.png"]
    assert len(report.skipped) == 6
    assert "learning_curve.png: no summary.json" in report.skipped[-1]
    assert_drawn_png(tmp_path / "figures" / "eval_accuracy.png")


def test_load_metrics_keeps_the_last_value_of_a_repeated_step(tmp_path):
    write_log(tmp_path, synthetic_log(num_steps=10, resumed_at=8))
    series = load_metrics(tmp_path / "metrics.jsonl")
    assert sorted(series["reward"]) == list(range(1, 11))
    assert series["reward"][9] == pytest.approx(0.45) and series["reward"][10] == pytest.approx(0.5)
    assert "time" not in series and series["kl"][3] == pytest.approx(0.009)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "No metrics log at"),
        ('{"step": 1, "reward": 0.5}\n{"step": 2, "reward": \n', r"metrics.jsonl:2 is not valid JSON"),
        ('{"reward": 0.5}\n', r"metrics.jsonl:1 is not a metrics record.*integer 'step'"),
        ("\n", "holds no metrics"),
    ],
)
def test_missing_or_malformed_log_gets_a_clear_error(tmp_path, capsys, content, message):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ReportError, match=message):
        write_plots(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert not (tmp_path / "plots").exists() or not list((tmp_path / "plots").iterdir())


@pytest.mark.filterwarnings("ignore:'rl.report.plots' found in sys.modules")
def test_python_dash_m_entry_point(tmp_path, monkeypatch, capsys):
    write_log(tmp_path, synthetic_log(num_steps=3, resumed_at=None))
    monkeypatch.setattr(sys, "argv", ["rl.report.plots", str(tmp_path), "--out", str(tmp_path / "png")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("rl.report.plots", run_name="__main__")
    assert exit_info.value.code == 0
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == sorted(
        ["reward.png", "kl.png", "completion_lengths.png", "throughput.png", "step_time.png"]
    )


def test_report_reads_what_the_run_logger_writes(tmp_path):
    with RunLogger(tmp_path, wandb_mode="disabled", progress=False) as logger:
        for step in range(1, 4):
            logger.log(step, {"reward": 0.1 * step, "kl": 0.01 * step})
    series = load_metrics(tmp_path / "metrics.jsonl")
    assert series["reward"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    report = write_plots(tmp_path)
    assert [path.name for path in report.written] == ["reward.png", "kl.png"]
    assert_drawn_png(tmp_path / "plots" / "kl.png")


def test_learning_curve_spans_the_warm_start_and_grpo_from_the_summary(tmp_path, monkeypatch):
    from rl.eval.evaluate import EvalResult
    from rl.report.summary import EvalPoint, run_summary, write_summary

    points = [
        EvalPoint("base", 0, EvalResult(0.02, -0.05, 200)),
        EvalPoint("sft", 40, EvalResult(0.3, 0.3, 200)),
    ]
    points += [EvalPoint("grpo", s, EvalResult(0.3 + 0.01 * s, 0.4, 200)) for s in (10, 20, 30)]
    write_summary(tmp_path, run_summary(points, seed=0, wall_s=10.0, sft_steps=40, words=WORDS))
    with RunLogger(tmp_path, wandb_mode="disabled", progress=False) as logger:
        for step in range(1, 41):
            logger.log_stage("sft", step, {"sft/nll": 1.0 / step})
        logger.log(1, {"reward": 0.1, "eval/accuracy": 0.31})
    labels = {}
    savefig = Figure.savefig

    def labelled(figure, path, *args, **kwargs):
        labels[path.name] = (figure.axes[0].get_title(), figure.axes[0].get_ylabel())
        return savefig(figure, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", labelled)
    report = write_plots(tmp_path)
    assert [p.name for p in report.written] == [
        "reward.png",
        "eval_accuracy.png",
        "learning_curve.png",
        "sft_nll.png",
    ]
    # the env's own words for its score (summary.json), not SQL's
    assert labels["learning_curve.png"] == (
        "Held-out greedy answer accuracy (200 unseen questions, seed 0, 95% CI)",
        "answer accuracy",
    )
    assert labels["eval_accuracy.png"] == ("Held-out answer accuracy", "answer accuracy")
    assert_drawn_png(tmp_path / "plots" / "learning_curve.png")
    assert_drawn_png(tmp_path / "plots" / "sft_nll.png")
    grpo = {"reward": {1: 0.1}, "eval/accuracy": {1: 0.31}}
    assert load_metrics(tmp_path / "metrics.jsonl") == grpo  # the warm start's records stay apart
