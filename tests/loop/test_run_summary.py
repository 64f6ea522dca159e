"""The end-of-run summary: the held-out curve, the reward curve, the time split and peak memory."""

from rl.evaluate import EvalResult
from rl.step_metrics import StepTimer, summary_text


def history_step(reward, **extra):
    return {"reward": reward, "memory/trainer_peak_gb": 1.25, "memory/engine_gb": 0.5, **extra}


def test_summary_shows_held_out_curve_rewards_time_and_memory():
    before = EvalResult(accuracy=0.0, reward=-0.05, num_tasks=64)
    after = EvalResult(accuracy=0.125, reward=0.2, num_tasks=64)
    history = [
        history_step(0.1),
        history_step(0.3, **{"eval/accuracy": 0.0625, "eval/reward": 0.05}),
        history_step(0.5),
    ]
    timer = StepTimer()
    timer.add("generate", 30.0)
    timer.add("train", 60.0)
    timer.add("eval", 10.0)
    text = summary_text(before, after, history, timer)
    assert "64 test tasks on unseen schemas; before training, then" in text
    assert "accuracy 0.000 -> 0.062 -> 0.125" in text
    assert "reward   -0.050 -> 0.050 -> 0.200" in text
    assert "train reward (mean per 1 step(s)): 0.10 0.30 0.50" in text
    assert "generate 30s (30%)" in text and "train 60s (60%)" in text and "eval 10s (10%)" in text
    assert "peak memory: trainer 1.25 GB, engine KV pool 0.50 GB" in text


def test_summary_after_a_resume_has_no_before():
    after = EvalResult(accuracy=0.5, reward=0.4, num_tasks=8)
    text = summary_text(None, after, [history_step(0.2)], StepTimer())
    assert "since the resume:" in text and "accuracy 0.500" in text and "->" not in text.split("\n")[3]
