"""Tasks known by their answer (envs.sql.answers): graded against the stored rows, loaded from answer rows or
by hiding all but a labelled share of the gold queries, and never demonstrated."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest

from envs.sql import SqlEnv, SqlMultiTurnEnv
from envs.sql.answers import answer_result, encode_answer
from envs.sql.loaders import spider_tasks
from tests.envs.test_sql_loaders import spider_root

QUERIES = [
    "SELECT name FROM items WHERE price < 5",
    "SELECT name FROM items ORDER BY price DESC",
    "SELECT count(*), max(price) FROM items",
    "SELECT name FROM items WHERE price > 100",
]


def sqlite_rows(db_path, sql):
    with sqlite3.connect(db_path) as conn:
        cursor = conn.execute(sql)
        return [list(row) for row in cursor.fetchall()], len(cursor.description)


def train_rows(n_per_db=5):
    return [
        {"db_id": db_id, "question": f"{db_id}{i}", "query": QUERIES[i % len(QUERIES)]}
        for db_id in ("a", "b", "c", "d")
        for i in range(n_per_db)
    ]


def test_labelled_fraction_keeps_that_share_of_gold_queries_and_gives_the_rest_sqlites_answer(tmp_path):
    root = spider_root(tmp_path, train_rows())
    full = spider_tasks(root, test_fraction=0.2, split_seed=3)
    part = spider_tasks(root, test_fraction=0.2, split_seed=3, labelled_fraction=0.25)
    assert part["test"]["gold_sql"] == full["test"]["gold_sql"]  # the test split keeps its queries
    assert part["train"]["question"] == full["train"]["question"]  # nothing dropped, order kept
    n = len(full["train"])
    labelled = [row for row in part["train"] if row["gold_sql"]]
    assert len(labelled) == round(0.25 * n) and all(row["answer"] == "" for row in labelled)
    originals = {row["question"]: row for row in full["train"]}
    for row in part["train"]:
        if row["gold_sql"]:
            assert row["gold_sql"] == originals[row["question"]]["gold_sql"]
            continue
        gold = originals[row["question"]]["gold_sql"]
        rows, num_columns = sqlite_rows(row["db_path"], gold)
        assert json.loads(row["answer"]) == {
            "columns": num_columns,
            "rows": rows,
            "ordered": "ORDER BY" in gold,
        }
        assert row["family"] == row["difficulty"] == "unknown"  # both are read from the hidden query
    other = spider_tasks(root, test_fraction=0.2, split_seed=4, labelled_fraction=0.25)
    assert len([row for row in other["train"] if row["gold_sql"]]) == round(0.25 * len(other["train"]))
    none = spider_tasks(root, test_fraction=0.2, split_seed=3, labelled_fraction=0.0)
    assert not any(none["train"]["gold_sql"])


@pytest.mark.parametrize("fraction", [-0.1, 1.5, "half", True])
def test_a_labelled_fraction_outside_0_1_is_one_error_naming_it(tmp_path, fraction):
    root = spider_root(tmp_path, train_rows())
    with pytest.raises(ValueError, match=r"labelled_fraction=.*use a number in \[0, 1\]"):
        spider_tasks(root, labelled_fraction=fraction)


def test_answer_rows_in_a_questions_file_and_the_malformed_ones(tmp_path, caplog):
    dev = [
        {"db_id": "shop", "question": "Names under 5?", "answer": [["pen"], ["pad"]]},
        {"db_id": "shop", "question": "By price", "answer": [["ink"], ["pad"], ["pen"]], "ordered": True},
        {"db_id": "shop", "question": "Nothing", "answer": []},
        {"db_id": "shop", "question": "A blob", "answer": [[{"x": 1}]]},
        {"db_id": "shop", "question": "Ragged", "answer": [["a"], ["b", "c"]]},
    ]
    root = spider_root(tmp_path, train_rows(1), dev=dev, db_ids=["a", "b", "c", "d", "shop"])
    with caplog.at_level(logging.WARNING, logger="envs.sql.loaders"):
        test = spider_tasks(root)["test"]
    assert test["question"] == ["Names under 5?", "By price"] and test["gold_sql"] == ["", ""]
    assert answer_result(test[1]["answer"])[1] is True and answer_result(test[0]["answer"])[1] is False
    assert "row 2 of" in caplog.text and "an empty answer" in caplog.text
    assert "row 3 of" in caplog.text and "a cell must be a number, a string or null" in caplog.text
    assert "row 4 of" in caplog.text and "each row must be a list of 1 cell(s)" in caplog.text


@pytest.mark.parametrize("env_class", [SqlEnv, SqlMultiTurnEnv])
def test_an_answer_task_is_graded_by_its_rows_and_has_no_demonstration(tmp_path, env_class):
    root = spider_root(tmp_path, train_rows(1))
    db_path = spider_tasks(root)["train"][0]["db_path"]
    cheap = {"question": "Cheap items?", "db_path": db_path, "gold_sql": "", "answer": ""}
    cheap["answer"] = encode_answer([["pad"], ["pen"]], 1, ordered=False)
    by_price = {**cheap, "answer": encode_answer([["ink"], ["pad"], ["pen"]], 1, ordered=True)}
    env = env_class()
    assert env.demonstration(cheap) is None and env.demonstration({**cheap, "gold_sql": "SELECT 1"})

    def reward(task, sql):
        text = f"<answer>{sql}</answer>" if env_class is SqlMultiTurnEnv else f"```sql\n{sql}\n```"
        return env.start(task).step(text).rewards["execution"]

    # another query with the same rows
    assert reward(cheap, "SELECT name FROM items WHERE price BETWEEN 1 AND 4") == 1.0
    assert reward(cheap, "SELECT name FROM items WHERE price < 2") == 0.0
    assert reward(by_price, "SELECT name FROM items ORDER BY price DESC") == 1.0
    assert reward(by_price, "SELECT name FROM items ORDER BY price") == 0.0  # the order counts
    assert reward({**by_price, "answer": cheap["answer"]}, "SELECT name FROM items WHERE id != 2") == 1.0
