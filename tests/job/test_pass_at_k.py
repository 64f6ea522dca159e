"""pass@k in mode=eval: Chen et al.'s unbiased estimator on hand-worked cases, the k reported, the range of
eval.samples, and a tiny model's eval run whose printed pass@k is the estimator on its written counts."""

import contextlib
import io
import json
import math

import pytest
import torch

import train
from host import cpu_threads
from rl.config.checks import check_config
from rl.config.schema import register_configs
from rl.eval.compare import outcome_file
from rl.eval.evaluate import EvalResult
from rl.eval.pass_at_k import TaskSamples, ks_up_to, pass_at_k, score_pass_at_k
from rl.job import modes
from rl.settings import ConfigError
from rollout_engine import LLMEngine
from tests.helpers.outcome_files import read_outcomes
from tests.helpers.plugin_envs import PARITY, TRANSFER
from tests.helpers.train_runs import compose_cfg


def test_pass_at_k_matches_hand_worked_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 2 of 5 succeed: one draw succeeds 2/5 of the time
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 0, 3) == 0.0  # nothing succeeded
    assert pass_at_k(5, 4, 2) == 1.0  # n - c = 1 < k = 2: every pair holds a success
    assert pass_at_k(5, 5, 5) == 1.0


def test_pass_at_k_is_the_binomial_ratio_and_stays_exact_where_the_binomials_are_huge():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    # C(2000, 1000) has 600 digits: as floats the ratio would be inf / inf; 1 of 2000 succeeding, k = n/2
    assert pass_at_k(2000, 1, 1000) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 8)


def test_k_runs_over_the_powers_of_two_up_to_the_sample_count_and_the_count_itself():
    assert ks_up_to(1) == [1]
    assert ks_up_to(4) == [1, 2, 4]
    assert ks_up_to(6) == [1, 2, 4, 6]
    assert ks_up_to(16) == [1, 2, 4, 8, 16]


def test_a_sets_pass_at_k_is_the_mean_over_tasks_overall_and_by_label():
    samples = [
        TaskSamples("a", 4, 0, {"family": "join"}),
        TaskSamples("b", 4, 1, {"family": "join"}),
        TaskSamples("c", 4, 4, {"family": "agg"}),
    ]
    result = score_pass_at_k(samples, [1, 2, 4], ["family", "db_id"])
    # per task at k=1: 0, 1/4, 1; at k=2: 0, 1 - C(3,2)/C(4,2) = 1/2, 1; at k=4: 0, 1, 1
    assert result.overall == pytest.approx({1: 1.25 / 3, 2: 1.5 / 3, 4: 2 / 3})
    assert result.num_tasks == 3 and set(result.by_label) == {"family"}  # no task has a db_id
    join, num_join = result.by_label["family"]["join"]
    assert num_join == 2 and join == pytest.approx({1: 0.125, 2: 0.25, 4: 0.5})
    greedy = EvalResult(1 / 3, 0.0, 3, {"family": {"join": (0.0, 2), "agg": (1.0, 1)}})
    lines = result.table(greedy).splitlines()
    assert lines[0].split() == ["greedy", "pass@1", "pass@2", "pass@4", "tasks"]
    assert lines[1].split() == ["all", "0.333", "0.417", "0.500", "0.667", "3"]
    assert lines[2].split() == ["family=agg", "1.000", "1.000", "1.000", "1.000", "1"]


@pytest.mark.parametrize(
    "override, message",
    [
        ("eval.samples=-1", "eval.samples=-1: use an integer >= 0"),
        ("eval.samples=300", "eval.samples=300: use at most rollout.max_num_seqs=256 .* or raise that"),
    ],
)
def test_eval_samples_out_of_range_is_refused_naming_the_fix(tmp_path, override, message):
    register_configs()
    with pytest.raises(ConfigError, match=message):
        check_config(compose_cfg(tmp_path, "mode=eval", override))
    check_config(compose_cfg(tmp_path, "mode=eval", "eval.samples=256"))  # up to max_num_seqs is fine


def table_rows(out: str, title: str) -> dict[str, list[str]]:
    """The rows of the table printed under the line that starts with `title`, by their first column."""
    lines = out[out.index(title) :].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line or line.endswith(":"):
            break
        rows[line.split()[0]] = line.split()[1:]
    return rows


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    """mode=eval with eval.samples=4 on the parity env (half the replies win), with a transfer set; every
    engine call is recorded."""
    register_configs()
    run_dir = tmp_path_factory.mktemp("passk")
    calls = []
    generate = LLMEngine.generate

    def recording(self, prompts, params=None, **kwargs):  # play_groups sends one params per prompt
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        (settings,) = {(p.n, p.temperature) for p in per_prompt}
        calls.append((len(prompts), *settings))
        return generate(self, prompts, params, **kwargs)

    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(LLMEngine, "generate", recording)
        patch.setattr(cpu_threads, "_governor", lambda: None)
        threads = torch.get_num_threads()
        cfg = compose_cfg(
            run_dir, *PARITY, *TRANSFER, "mode=eval", "eval.samples=4", "rollout.temperature=1.0"
        )
        modes.eval_only(cfg)
        torch.set_num_threads(threads)
    return run_dir, printed.getvalue(), calls


def test_each_tasks_samples_are_one_request_of_n_at_the_rollouts_temperature(eval_run):
    _, _, calls = eval_run
    # greedy held-out (8 tasks), greedy transfer (12), then the samples: one request of n=4 per task
    assert calls == [(8, 1, 0.0), (12, 1, 0.0), (8, 4, 1.0), (12, 4, 1.0)]


@pytest.mark.parametrize("set_name, num_tasks", [("held_out", 8), ("transfer", 12)])
def test_printed_pass_at_k_is_the_estimator_on_the_written_counts(eval_run, set_name, num_tasks):
    run_dir, out, _ = eval_run
    records = read_outcomes(run_dir / "evals" / f"{set_name}_passk_base_0.jsonl")
    greedy = read_outcomes(run_dir / "evals" / f"{set_name}_base_0.jsonl")
    assert [r["key"] for r in records] == [r["key"] for r in greedy]  # the same tasks, in the same order
    assert all(r["n"] == 4 for r in records) and len(records) == num_tasks
    successes = [r["c"] for r in records]
    assert 0 < sum(successes) < 4 * num_tasks  # mixed outcomes: the checks below can fail
    rows = table_rows(
        out, f"{set_name} pass@k from 4 samples per task at rollout.temperature=1.0 (base model):"
    )
    greedy_accuracy, *printed, tasks = rows["all"]
    assert int(tasks) == num_tasks
    assert float(greedy_accuracy) == pytest.approx(sum(r["success"] for r in greedy) / num_tasks, abs=5e-4)
    expected = [sum(pass_at_k(4, c, k) for c in successes) / num_tasks for k in (1, 2, 4)]
    assert [float(v) for v in printed] == pytest.approx(expected, abs=5e-4)
    assert expected[0] <= expected[1] <= expected[2]
    assert expected[0] == pytest.approx(sum(successes) / (4 * num_tasks))  # pass@1 is the sample success rate


def test_the_transfer_sets_pass_at_k_is_broken_down_by_its_labels(eval_run):
    run_dir, out, _ = eval_run
    rows = table_rows(out, "transfer pass@k from 4 samples")
    records = read_outcomes(run_dir / "evals" / "transfer_passk_base_0.jsonl")
    for family in ("filter", "join"):
        group = [r["c"] for r in records if r["family"] == family]
        *_, pass_4, tasks = rows[f"family={family}"]
        assert int(tasks) == len(group)
        assert float(pass_4) == pytest.approx(sum(pass_at_k(4, c, 4) for c in group) / len(group), abs=5e-4)
    assert {name.split("=")[0] for name in rows if "=" in name} == {"family", "db_id"}


def test_the_compare_tool_still_finds_the_greedy_outcome_files_beside_the_counts(eval_run):
    run_dir, _, _ = eval_run
    assert outcome_file(run_dir, "held_out", "final").name == "held_out_base_0.jsonl"
    assert outcome_file(run_dir, "transfer", "base").name == "transfer_base_0.jsonl"


def test_without_eval_samples_mode_eval_draws_no_samples(tmp_path, capsys):
    register_configs()
    modes.eval_only(compose_cfg(tmp_path, *PARITY, "mode=eval"))
    assert "pass@k" not in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == ["held_out_base_0.jsonl"]


def test_a_training_runs_evaluation_points_report_sampled_pass_at_k_beside_greedy(tmp_path):
    """GRPO trains the sampled objective: with eval.samples each evaluation point of a run also samples the
    held-out set, logs eval/pass@k and writes its counts."""
    register_configs()
    cfg = compose_cfg(
        tmp_path, *PARITY, "num_steps=2", "eval_every=1", "eval.samples=4", "rollout.temperature=1.0"
    )
    torch.manual_seed(cfg.seed)
    result = train.train(cfg)
    stages = [(p.stage, p.step) for p in result.evals]
    assert stages == [("base", 0), ("sft", 1), ("grpo", 1), ("grpo", 2)]  # the parity env warms up a step
    for point, logged in [(result.evals[2], result.history[0]), (result.evals[3], point_metrics(tmp_path))]:
        records = read_outcomes(tmp_path / "evals" / f"held_out_passk_grpo_{point.step}.jsonl")
        successes = [r["c"] for r in records]
        expected = [sum(pass_at_k(4, c, k) for c in successes) / len(records) for k in (1, 2, 4)]
        assert [logged[f"eval/pass@{k}"] for k in (1, 2, 4)] == pytest.approx(expected)
        assert logged["eval/accuracy"] == point.result.accuracy  # greedy, beside it
    assert 0 < sum(r["c"] for r in read_outcomes(tmp_path / "evals" / "held_out_passk_base_0.jsonl")) < 32
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_history"][-1]["pass_at_k"]["1"] == pytest.approx(result.evals[-1].passk.overall[1])


def point_metrics(run_dir):
    """The metrics.jsonl line that logged the final evaluation (the last line with eval/accuracy)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "eval/accuracy" in line][-1]
