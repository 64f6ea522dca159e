"""A transfer set beside the held-out set: scored at the base, after the warm start and at the end of a tiny
run, with per-task outcome files that summary.json and metrics.jsonl must agree with; a run without one is
unchanged; mode=eval scores it too; its task source is checked by the env like the env's own."""

import json
import sqlite3
from collections import Counter

import pytest
import torch

import train
from envs import EnvError
from envs.sql.prompts import extract_sql
from host import cpu_threads
from rl.config.schema import register_configs
from rl.eval.eval_sets import held_out_tasks
from rl.eval.outcomes import task_key
from rl.job import modes
from rl.job.parts import build_parts
from rl.settings import ConfigError
from tests.helpers.outcome_files import read_outcomes
from tests.helpers.plugin_envs import DATABASES, PARITY, TRANSFER, other_tasks, sql_tasks
from tests.helpers.train_runs import SMALL_SQL, compose_cfg

STAGES = [("base", 0), ("sft", 1), ("grpo", 1), ("grpo", 2)]


def successes(path) -> list[int]:
    return [record["success"] for record in read_outcomes(path)]


def metric_records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run with and without a transfer set, at one thread count (so they can match exactly)."""
    register_configs()
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_threads, "_governor", lambda: None)
        threads = torch.get_num_threads()
        for name, extra in (("with", TRANSFER), ("without", [])):
            run_dir = tmp_path_factory.mktemp(name)
            cfg = compose_cfg(run_dir, *PARITY, *extra)
            torch.manual_seed(cfg.seed)
            out[name] = (run_dir, train.train(cfg))
        torch.set_num_threads(threads)
    return out


def test_the_transfer_set_is_scored_at_the_base_after_the_warm_start_and_at_the_end(runs):
    run_dir, result = runs["with"]
    assert [(p.stage, p.step) for p in result.evals] == STAGES
    assert [p.transfer is not None for p in result.evals] == [True, True, False, True]  # not at eval_every
    names = sorted(p.name for p in (run_dir / "evals").iterdir())
    assert names == sorted(
        [f"held_out_{s}_{n}.jsonl" for s, n in STAGES]
        + ["transfer_base_0.jsonl", "transfer_sft_1.jsonl", "transfer_grpo_2.jsonl"]
    )
    # the sample of the source's test split, drawn by transfer.eval_seed as held_out_tasks draws
    expected = held_out_tasks(other_tasks()["test"], 12, seed=3)
    assert [r["key"] for r in read_outcomes(run_dir / "evals" / "transfer_base_0.jsonl")] == [
        task_key(t) for t in expected
    ]


def test_summary_json_agrees_with_the_outcome_files(runs):
    run_dir, _ = runs["with"]
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = run_dir / "evals"
    base, start, final = (successes(evals / f"transfer_{n}.jsonl") for n in ("base_0", "sft_1", "grpo_2"))
    everything = base + start + final
    assert 0 < sum(everything) < len(everything)  # mixed outcomes: the checks below can fail
    assert summary["transfer_num_tasks"] == len(final) == 12
    assert summary["transfer_base_accuracy"] == sum(base) / 12
    assert summary["transfer_grpo_start_accuracy"] == sum(start) / 12
    assert summary["transfer_final_accuracy"] == sum(final) / 12
    assert summary["final_accuracy"] == sum(successes(evals / "held_out_grpo_2.jsonl")) / 8
    records = read_outcomes(evals / "transfer_grpo_2.jsonl")
    for label in ("family", "db_id"):
        counts = Counter(r[label] for r in records)
        wins = Counter(r[label] for r in records if r["success"])
        assert summary["transfer_by_label"][label] == {v: [wins[v] / n, n] for v, n in counts.items()}
    assert summary["transfer_base_by_label"]["db_id"].keys() == set(DATABASES)
    history = summary["eval_history"]
    assert [p.get("transfer_accuracy") for p in history] == [
        summary["transfer_base_accuracy"], summary["transfer_grpo_start_accuracy"], None,
        summary["transfer_final_accuracy"],
    ]  # fmt: skip
    assert history[-1]["transfer_num_tasks"] == 12


def test_metrics_log_the_transfer_set_where_it_ran(runs):
    run_dir, result = runs["with"]
    logged = [(r.get("stage"), r["step"], r["transfer/accuracy"]) for r in metric_records(run_dir)
              if "transfer/accuracy" in r]  # fmt: skip
    base, start, final = (p.transfer.accuracy for p in result.evals if p.transfer is not None)
    assert logged == [("base", 0, base), (None, 0, start), (None, 2, final)]
    step_1 = [r for r in metric_records(run_dir) if r["step"] == 1 and "eval/accuracy" in r]
    assert step_1 and "transfer/accuracy" not in step_1[0]


def test_without_a_transfer_set_nothing_changes(runs):
    with_dir, with_result = runs["with"]
    run_dir, result = runs["without"]
    assert not list((run_dir / "evals").glob("transfer_*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not [key for key in summary if key.startswith("transfer")]
    assert not [key for r in metric_records(run_dir) for key in r if key.startswith("transfer/")]
    # the held-out evaluations and the training steps are those of the run with a transfer set
    for stage, step in STAGES:
        name = f"held_out_{stage}_{step}.jsonl"
        assert read_outcomes(run_dir / "evals" / name) == read_outcomes(with_dir / "evals" / name)
    assert [m["reward"] for m in result.history] == [m["reward"] for m in with_result.history]


@pytest.fixture(scope="module")
def sql_db_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("shop_db"))


def test_mode_eval_scores_sql_transfer_tasks_after_the_held_out_set(sql_db_dir, tmp_path, capsys):
    register_configs()
    transfer = ["+transfer.tasks._target_=e2e_transfer_env.sql_tasks", f"+transfer.tasks.db_dir={sql_db_dir}"]
    modes.eval_only(compose_cfg(tmp_path, "mode=eval", "env.eval_tasks=3", SMALL_SQL, *transfer))
    out = capsys.readouterr().out
    held_out_at = out.index("held-out greedy execution accuracy (base model):")
    transfer_at = out.index("transfer set greedy execution accuracy (base model):")
    assert held_out_at < transfer_at
    table = out[transfer_at:].splitlines()
    assert table[2].split()[0] == "all" and table[2].split()[-1] == "4"
    why = next(i for i, line in enumerate(table) if line.startswith("failed, why"))
    assert {line.split()[0] for line in table[3:why]} == {
        "family=aggregate", "family=filter", "family=order_limit", "db_id=shop",
    }  # fmt: skip
    records = read_outcomes(tmp_path / "evals" / "transfer_base_0.jsonl")
    failures = Counter(r["failure"] for r in records if not r["success"])
    assert sum(int(line.split()[-1]) for line in table[why + 1 :] if line.strip()) == sum(failures.values())
    for record in records:  # each failure agrees with what SQLite itself makes of the reply's query
        assert (record["failure"] is None) == bool(record["success"])
        query = extract_sql(record["completion"])
        if query is None:
            assert record["failure"] == "no SQL"
            continue
        try:
            with sqlite3.connect(f"{sql_db_dir}/shop.sqlite") as db:
                db.execute(query).fetchall()
        except sqlite3.Error:
            assert record["failure"] not in ("wrong result", "no SQL", None)
        else:
            assert record["failure"] in ("wrong result", None)
    test_split = sql_tasks(sql_db_dir)["test"]
    assert sorted(r["key"] for r in records) == sorted(task_key(t) for t in test_split)
    assert all(r["db_id"] == "shop" and r["completion"].startswith("```sql\nSELECT") for r in records)
    assert len(read_outcomes(tmp_path / "evals" / "held_out_base_0.jsonl")) == 3


def test_a_transfer_row_the_env_cannot_play_stops_the_run_at_start(sql_db_dir, tmp_path):
    register_configs()
    transfer = [
        "+transfer.tasks._target_=e2e_transfer_env.sql_tasks",
        f"+transfer.tasks.db_dir={sql_db_dir}",
        "+transfer.tasks.missing_db=true",
    ]
    where = "row 1 of the 'test' split from e2e_transfer_env.sql_tasks"
    with pytest.raises(EnvError, match=f"{where}: .*gone.sqlite"):
        build_parts(compose_cfg(tmp_path, SMALL_SQL, *transfer))


def never_built(*args, **kwargs):
    raise AssertionError("build_parts ran: the check came too late")


def test_transfer_spider_without_its_root_stops_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "build_parts", never_built)
    with pytest.raises(ConfigError, match=r"transfer.tasks.root=\?\?\?: this setting has no default; set it"):
        train.train(compose_cfg(tmp_path, "transfer=spider_heldout"))
    cfg = compose_cfg(tmp_path, "transfer=spider_heldout", "transfer.tasks.root=/data/spider")
    assert cfg.transfer.tasks._target_ == "envs.sql.loaders.spider_tasks" and cfg.transfer.eval_tasks == 500
    assert list(cfg.transfer.labels) == ["family", "db_id"]
    zero = compose_cfg(tmp_path, "transfer=spider_heldout", "transfer.tasks.root=/x", "transfer.eval_tasks=0")
    with pytest.raises(ConfigError, match="transfer.eval_tasks=0: use an integer >= 1"):
        train.train(zero)
