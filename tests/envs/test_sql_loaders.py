"""Spider- and BIRD-format loading from tiny fixture directories written here."""

import json
import logging
import sqlite3

import pytest

from envs.sql import execution_match
from envs.sql.loaders import load_bird, load_spider, sql_family


def make_root(tmp_path, questions, questions_file="dev.json", db_ids=("shop",)):
    tables = [{"db_id": db_id, "table_names_original": ["items"]} for db_id in db_ids]
    (tmp_path / "tables.json").write_text(json.dumps(tables))
    (tmp_path / questions_file).write_text(json.dumps(questions))
    db_dir = tmp_path / "database" / "shop"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "shop.sqlite")
    conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    conn.executemany(
        "INSERT INTO items VALUES (?, ?, ?)", [(1, "pen", 1.5), (2, "ink", 7.0), (3, "pad", 3.25)]
    )
    conn.commit()
    conn.close()
    return tmp_path


def test_spider_rows_and_malformed_rows(tmp_path, caplog):
    questions = [
        {"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM items"},
        {"db_id": "shop", "question": "Cheap items?", "query": "SELECT name FROM items WHERE price < 2"},
        {"db_id": "shop", "question": "No SQL here"},
        {"db_id": "mall", "question": "Unknown db", "query": "SELECT 1"},
        ["not", "an", "object"],
        {"db_id": "shop", "question": "Sorted", "query": "SELECT name FROM items ORDER BY price DESC"},
    ]
    root = make_root(tmp_path, questions)
    with caplog.at_level(logging.WARNING, logger="envs.sql.loaders"):
        data = load_spider(str(root))
    assert data["question"] == ["How many items?", "Cheap items?", "Sorted"]
    assert data["family"] == ["aggregate", "filter", "order_limit"]
    assert data["difficulty"] == ["easy", "easy", "easy"] and set(data["source"]) == {"spider"}
    assert "row 2 of" in caplog.text and "missing or empty 'query'" in caplog.text
    assert "row 3 of" in caplog.text and "'mall' is not in the tables file" in caplog.text
    assert "row 4 of" in caplog.text and "skipped 3 malformed rows of 6" in caplog.text
    row = data[1]
    assert "CREATE TABLE items" in row["schema"]
    assert execution_match(row["db_path"], row["gold_sql"], "SELECT name FROM items WHERE id = 1")


def test_bird_rows_keep_evidence_and_difficulty(tmp_path):
    questions = [
        {
            "db_id": "shop",
            "question": "Dear items?",
            "evidence": "dear means price > 5",
            "SQL": "SELECT name FROM items WHERE price > 5",
            "difficulty": "moderate",
        },
        {
            "db_id": "shop",
            "question": "Total?",
            "SQL": "SELECT SUM(price) FROM items",
            "difficulty": "challenging",
        },
    ]
    data = load_bird(str(make_root(tmp_path, questions)))
    assert data["evidence"] == ["dear means price > 5", ""]
    assert data["difficulty"] == ["medium", "hard"] and data["gold_sql"][1] == "SELECT SUM(price) FROM items"


def test_missing_database_file_names_the_path(tmp_path):
    questions = [{"db_id": "ghost", "question": "q", "query": "SELECT 1"}]
    root = make_root(tmp_path, questions, db_ids=("shop", "ghost"))
    with pytest.raises(FileNotFoundError, match=r"database/ghost/ghost\.sqlite"):
        load_spider(str(root))
    with pytest.raises(FileNotFoundError, match="train.json does not exist"):
        load_spider(str(root), questions_file="train.json")


@pytest.mark.parametrize(
    "sql, family",
    [
        ("SELECT a FROM t WHERE b = 1", "filter"),
        ("SELECT count(*) FROM t", "aggregate"),
        ("SELECT a FROM t ORDER BY b LIMIT 1", "order_limit"),
        ("SELECT a, count(*) FROM t GROUP BY a HAVING count(*) > 1", "group_having"),
        ("SELECT t.a FROM t JOIN u ON t.id = u.tid", "join2"),
        ("SELECT t.a FROM t JOIN u ON t.id = u.tid JOIN v ON v.id = u.vid", "join3"),
        ("SELECT a FROM t WHERE b > (SELECT avg(b) FROM t)", "nested"),
        ("SELECT a FROM t INTERSECT SELECT a FROM u", "set_ops"),
    ],
)
def test_sql_family(sql, family):
    assert sql_family(sql) == family
