"""Per-task outcomes: keys that pair the same task across runs, the JSONL files, scoring from outcomes, and
the ranks' shards put back in the set's order."""

import json

import pytest

from rl.eval.eval_sets import EvalSet, score_eval_set
from rl.eval.evaluate import score
from rl.eval.outcomes import (
    MAX_TEXT_CHARS,
    TaskOutcome,
    mark_repeats,
    outcome_of,
    outcome_path,
    task_key,
    write_outcomes,
)
from rl.job.distributed import DistInfo, shard, unshard
from tests.helpers.outcome_files import read_outcomes

TASK = {
    "question": "How many staff are in Sales?",
    "db_id": "staff",
    "db_path": "/home/a/.cache/pagedrl/staff.sqlite",
    "gold_sql": "SELECT count(*) FROM emp WHERE dept = 'Sales'",
    "family": "aggregate",
}


def test_a_task_key_names_what_the_task_is_not_where_its_database_lies():
    moved = {**TASK, "db_path": "/other/machine/staff.sqlite", "schema": "CREATE TABLE emp (...)"}
    assert task_key(moved) == task_key(TASK) and len(task_key(TASK)) == 16
    assert task_key({**TASK, "gold_sql": "SELECT 1"}) != task_key(TASK)
    assert task_key({**TASK, "db_id": "staff2"}) != task_key(TASK)
    # rows without any of db_id/question/gold_sql: the whole row but db_path
    assert task_key({"prompt": "2+2", "answer": 4}) != task_key({"prompt": "2+2", "answer": 5})


def test_repeated_tasks_are_numbered_in_the_sets_order():
    outcomes = [TaskOutcome(key, True, 1.0) for key in ("x", "y", "x", "x")]
    mark_repeats(outcomes)
    assert [o.key for o in outcomes] == ["x", "y", "x#2", "x#3"]


def test_an_outcome_file_holds_one_line_per_task_with_its_labels(tmp_path):
    long_reply = "SELECT " + "x" * (2 * MAX_TEXT_CHARS)
    outcomes = [
        outcome_of(TASK, True, 1.0, "SELECT count(*) FROM emp WHERE dept = 'Sales'", ["family", "db_id"]),
        outcome_of(
            {**TASK, "question": "Who?"}, False, -0.1, long_reply, ["family", "difficulty"], failure="timeout"
        ),
    ]
    path = write_outcomes(outcome_path(tmp_path, "transfer", "grpo", 40), outcomes)
    assert path == tmp_path / "evals" / "transfer_grpo_40.jsonl"
    first, second = read_outcomes(path)
    assert first == {
        "key": task_key(TASK),
        "family": "aggregate",
        "db_id": "staff",
        "success": 1,
        "reward": 1.0,
        "question": TASK["question"],
        "completion": "SELECT count(*) FROM emp WHERE dept = 'Sales'",
        "failure": None,
    }
    assert "difficulty" not in second and second["success"] == 0  # a label the task lacks is left out
    assert second["failure"] == "timeout"
    assert outcome_of(TASK, True, 1.0, "", [], "wrong result").failure is None  # a success has no failure
    assert len(second["completion"]) == MAX_TEXT_CHARS + 3  # cut, with "..."
    assert not list(path.parent.glob("*.tmp"))


def test_accuracy_and_label_tables_come_from_the_outcomes():
    outcomes = [
        TaskOutcome("a", True, 1.0, {"family": "join"}),
        TaskOutcome("b", False, -0.1, {"family": "join"}, failure="unknown column"),
        TaskOutcome("c", True, 0.5, {"family": "agg"}),
        TaskOutcome("d", True, 1.0, {}),
        TaskOutcome("e", False, 0.0, {}, failure="unknown column"),
        TaskOutcome("f", False, 0.0, {}, failure="wrong result"),
        TaskOutcome("g", False, 0.0, {}),  # the env said nothing of why
        TaskOutcome("h", True, 1.0, {}),
    ]
    result = score(outcomes, ["family", "db_id"])
    assert (result.accuracy, result.num_tasks) == (0.5, 8)
    assert result.reward == pytest.approx((1.0 - 0.1 + 0.5 + 1.0 + 1.0) / 8)
    assert result.by_label == {"family": {"join": (0.5, 2), "agg": (1.0, 1)}}  # no task has a db_id
    assert result.failures == {"unknown column": 2, "wrong result": 1}
    metrics = result.metrics("transfer")
    assert metrics["transfer/failure/unknown_column"] == 0.25
    assert metrics["transfer/failure/wrong_result"] == 0.125
    table = result.table().splitlines()
    at = table.index(next(line for line in table if line.startswith("failed, why")))
    assert [line.split()[-2:] for line in table[at + 1 :]] == [["0.250", "2"], ["0.125", "1"]]
    assert table[at + 1].startswith("unknown column") and table[at + 2].startswith("wrong result")
    assert score([], ["family"]).num_tasks == 0


def test_shards_go_back_into_the_sets_order():
    items = list(range(7))
    shards = [shard(items, DistInfo(rank=r, world_size=3)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert unshard(shards) == items
    with pytest.raises(ValueError):  # lengths no sharding of one list gives
        unshard([[0], [1, 2, 3]])


def test_score_eval_set_writes_on_rank_zero_and_keys_repeats_over_the_whole_set(tmp_path):
    tasks = [{"question": q, "family": f} for q, f in [("q1", "a"), ("q2", "b"), ("q1", "a")]]

    def play(rows):
        return [outcome_of(t, t["question"] == "q1", 1.0, "", ["family"]) for t in rows]

    eval_set = EvalSet("held_out", tasks, ["family"])
    result = score_eval_set(play, eval_set, DistInfo(), tmp_path, "base", 0)
    records = read_outcomes(tmp_path / "evals" / "held_out_base_0.jsonl")
    assert [r["key"] for r in records] == [task_key(tasks[0]), task_key(tasks[1]), task_key(tasks[0]) + "#2"]
    assert result.accuracy == pytest.approx(2 / 3) == sum(r["success"] for r in records) / 3
    score_eval_set(play, eval_set, DistInfo(rank=1, world_size=1), tmp_path, "sft", 3)
    assert not (tmp_path / "evals" / "held_out_sft_3.jsonl").exists()  # only rank 0 writes
    assert json.loads(json.dumps(result.by_label)) == {"family": {"a": [1.0, 2], "b": [0.0, 1]}}
