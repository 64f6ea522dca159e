"""The end-of-run summary and summary.json: accuracy by stage with intervals, by label, rewards, time."""

import json

import pytest

from envs import ScoreWords
from envs.sql.execution_env import SQL_SCORE_WORDS
from rl.eval.evaluate import EvalResult, wilson_interval
from rl.report.metrics import StepTimer
from rl.report.summary import EvalPoint, run_summary, summary_text, write_summary


def history_step(reward, **extra):
    return {
        "reward": reward,
        "memory/peak_rss_gb": 1.25,
        "memory/kv_held_peak_gb": 0.5,
        "memory/kv_reserved_gb": 7.75,
        **extra,
    }


def result(accuracy, reward=0.0, num_tasks=200, family=None):
    return EvalResult(accuracy, reward, num_tasks, {"family": family} if family else {})


def test_wilson_interval_matches_the_textbook_values():
    # 10 of 100: the Wilson 95% interval is [0.0552, 0.1744]; 0 of 20: [0, 0.1611]
    assert wilson_interval(0.1, 100) == pytest.approx((0.0552, 0.1744), abs=1e-4)
    assert wilson_interval(0.0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    assert wilson_interval(0.5, 0) == (0.0, 1.0)


def test_summary_keys_separate_the_warm_start_from_grpo(tmp_path):
    points = [
        EvalPoint("base", 0, result(0.02, -0.05, family={"filter": (0.0, 60)})),
        EvalPoint("sft", 40, result(0.30)),
        EvalPoint("grpo", 10, result(0.33)),
        EvalPoint("grpo", 20, result(0.37, 0.4, family={"filter": (0.5, 60)})),
    ]
    summary = run_summary(points, seed=1, wall_s=1500.0, sft_steps=40, words=SQL_SCORE_WORDS)
    assert (summary["base_accuracy"], summary["grpo_start_accuracy"], summary["final_accuracy"]) == (
        0.02,
        0.30,
        0.37,
    )
    assert summary["num_eval_tasks"] == 200 and summary["seed"] == 1 and summary["wall_s"] == 1500.0
    assert [p["stage"] for p in summary["eval_history"]] == ["base", "sft", "grpo", "grpo"]
    assert summary["final_ci95"] == list(wilson_interval(0.37, 200))
    assert summary["by_label"] == {"family": {"filter": (0.5, 60)}}
    path = write_summary(tmp_path, summary)
    assert json.loads(path.read_text())["grpo_start_accuracy"] == 0.30
    timer = StepTimer()
    timer.add("sft", 30.0)
    timer.add("generate", 30.0)
    timer.add("train", 40.0)
    text = summary_text(summary, [history_step(0.1), history_step(0.3)], timer)
    assert "held-out greedy execution accuracy (200 tasks on unseen schemas, 95% CI):" in text
    assert "base  step    0: 0.020" in text and "sft   step   40: 0.300" in text
    assert "grpo  step   20: 0.370 [0.306, 0.439]" in text
    assert "grpo_start_accuracy  0.300" in text
    assert "  filter                    0.000  0.500     60" in text
    assert "train reward (mean per 1 step(s)): 0.10 0.30" in text
    assert "sft 30s (30%)" in text and "train 40s (40%)" in text and "(wall 1500s)" in text
    assert "peak memory: process RSS 1.25 GB, engine KV pool 0.50 GB held of 7.75 GB reserved" in text
    on_gpu = summary_text(summary, [history_step(0.3, **{"memory/cuda_peak_gb": 3.5})], StepTimer())
    assert "peak memory: process RSS 1.25 GB, CUDA 3.50 GB, engine KV pool 0.50 GB held" in on_gpu


def test_without_a_warm_start_grpo_starts_at_the_base_and_a_resume_knows_neither():
    plain = run_summary(
        [EvalPoint("base", 0, result(0.1)), EvalPoint("grpo", 5, result(0.2))], 0, 1.0, 0, SQL_SCORE_WORDS
    )
    assert plain["grpo_start_accuracy"] == plain["base_accuracy"] == 0.1
    resumed = run_summary([EvalPoint("grpo", 5, result(0.2))], 0, 1.0, 0, SQL_SCORE_WORDS)
    assert resumed["base_accuracy"] is None and resumed["grpo_start_accuracy"] is None
    assert "base_accuracy        n/a (not scored in this run)" in summary_text(resumed, [], StepTimer())


def test_a_transfer_set_adds_its_own_keys_lines_and_tables():
    transfer = {"db_id": {"concert": (0.0, 30), "pets": (0.1, 20)}}
    points = [
        EvalPoint("base", 0, result(0.02), EvalResult(0.04, -0.1, 50, transfer)),
        EvalPoint("sft", 20, result(0.30), EvalResult(0.10, 0.0, 50)),
        EvalPoint("grpo", 10, result(0.33)),  # not scored on the transfer set
        EvalPoint("grpo", 20, result(0.37), EvalResult(0.12, 0.1, 50, {"db_id": {"pets": (0.3, 20)}})),
    ]
    summary = run_summary(points, seed=0, wall_s=10.0, sft_steps=20, words=SQL_SCORE_WORDS)
    assert (
        summary["transfer_base_accuracy"],
        summary["transfer_grpo_start_accuracy"],
        summary["transfer_final_accuracy"],
        summary["transfer_num_tasks"],
    ) == (0.04, 0.10, 0.12, 50)
    assert summary["transfer_final_ci95"] == list(wilson_interval(0.12, 50))
    assert summary["transfer_by_label"] == {"db_id": {"pets": (0.3, 20)}}
    assert summary["transfer_base_by_label"] == transfer
    assert [p.get("transfer_accuracy") for p in summary["eval_history"]] == [0.04, 0.10, None, 0.12]
    assert summary["final_accuracy"] == 0.37  # the held-out keys keep their meaning
    assert points[2].metrics().keys() == {"eval/accuracy", "eval/accuracy_ci_low", "eval/accuracy_ci_high",
                                          "eval/reward"}  # fmt: skip
    assert points[3].metrics()["transfer/accuracy"] == 0.12 and points[3].metrics()["eval/accuracy"] == 0.37
    text = summary_text(summary, [], StepTimer())
    transfer_text = text[text.index("transfer set greedy execution accuracy (50 tasks, 95% CI):") :]
    assert "  base  step    0: 0.040 [" in transfer_text and "  grpo  step   20: 0.120 [" in transfer_text
    assert "grpo  step   10" not in transfer_text
    assert "  transfer_grpo_start_accuracy  0.100" in transfer_text
    assert "  pets                      0.100  0.300     20" in transfer_text
    assert "concert" not in transfer_text  # the table lists the final point's values


def test_without_a_transfer_set_the_summary_has_no_transfer_keys():
    summary = run_summary(
        [EvalPoint("base", 0, result(0.1)), EvalPoint("grpo", 5, result(0.2))], 0, 1.0, 0, SQL_SCORE_WORDS
    )
    assert not [key for key in summary if key.startswith("transfer")]
    assert not [key for p in summary["eval_history"] for key in p if key.startswith("transfer")]
    assert "transfer" not in summary_text(summary, [], StepTimer())


def test_without_a_warm_start_the_transfer_sets_grpo_start_is_its_base():
    points = [
        EvalPoint("base", 0, result(0.1), EvalResult(0.25, 0.0, 8)),
        EvalPoint("grpo", 5, result(0.2), EvalResult(0.5, 0.0, 8)),
    ]
    summary = run_summary(points, 0, 1.0, sft_steps=0, words=SQL_SCORE_WORDS)
    assert summary["transfer_grpo_start_accuracy"] == summary["transfer_base_accuracy"] == 0.25
    resumed = run_summary(points[1:], 0, 1.0, sft_steps=0, words=SQL_SCORE_WORDS)
    assert resumed["transfer_base_accuracy"] is None and resumed["transfer_base_by_label"] is None
    text = summary_text(resumed, [], StepTimer())
    assert "transfer_base_accuracy        n/a (not scored in this run)" in text


def test_the_summary_speaks_of_the_score_in_the_envs_own_words(tmp_path):
    points = [
        EvalPoint("base", 0, result(0.0, num_tasks=64)),
        EvalPoint("grpo", 10, result(0.5, num_tasks=64)),
    ]
    words = ScoreWords(success="answer accuracy", tasks="unseen questions")
    summary = run_summary(points, 0, 1.0, 0, words)
    assert (summary["success_name"], summary["eval_tasks_name"]) == ("answer accuracy", "unseen questions")
    assert json.loads(write_summary(tmp_path, summary).read_text())["success_name"] == "answer accuracy"
    text = summary_text(summary, [], StepTimer())
    assert "held-out greedy answer accuracy (64 unseen questions, 95% CI):" in text
    assert "execution" not in text and "schemas" not in text
    plain = summary_text(run_summary(points, 0, 1.0, 0, ScoreWords()), [], StepTimer())
    assert "held-out greedy success rate (64 tasks, 95% CI):" in plain


def test_the_summary_says_why_tasks_failed_at_the_base_and_at_the_end():
    base = EvalResult(0.0, 0.0, 8, failures={"syntax error": 6, "unknown column": 2})
    final = EvalResult(0.5, 0.5, 8, failures={"unknown column": 3, "wrong result": 1})
    transfer = EvalResult(0.25, 0.0, 4, failures={"unknown table": 3})
    points = [EvalPoint("base", 0, base), EvalPoint("grpo", 5, final, transfer)]
    summary = run_summary(points, 0, 1.0, sft_steps=0, words=SQL_SCORE_WORDS)
    assert summary["failures"] == {"unknown column": 3, "wrong result": 1}
    assert summary["base_failures"] == {"syntax error": 6, "unknown column": 2}
    assert summary["transfer_failures"] == {"unknown table": 3} and summary["transfer_base_failures"] is None
    lines = summary_text(summary, [], StepTimer()).splitlines()
    held_out = lines.index("  failed, why                base  final")
    # shares of the 8 tasks, the final's most frequent first, then what only the base had
    assert lines[held_out + 1 : held_out + 4] == [
        "  unknown column            0.250  0.375",
        "  wrong result              0.000  0.125",
        "  syntax error              0.750  0.000",
    ]
    transfer_at = lines.index("  failed, why                base  final", held_out + 1)
    assert lines[transfer_at + 1] == "  unknown table                 -  0.750"  # no base: a dash
    plain = run_summary([EvalPoint("base", 0, result(0.1))], 0, 1.0, 0, SQL_SCORE_WORDS)
    assert "failed, why" not in summary_text(plain, [], StepTimer())  # an env that names no failures
