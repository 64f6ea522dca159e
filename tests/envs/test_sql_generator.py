"""The built-in task generator: determinism, schema-disjoint split, gold queries checked by plain sqlite3."""

import hashlib
import os
import sqlite3
from collections import Counter

import pytest

from envs.sql.domains import DOMAINS, TEST_DOMAINS
from envs.sql.generator import generate_sql_tasks


def file_hashes(db_dir) -> dict[str, str]:
    return {
        name: hashlib.sha256((db_dir / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(db_dir))
        if name.endswith(".sqlite")
    }


def content(split) -> list[tuple]:
    return list(
        zip(
            split["db_id"],
            split["question"],
            split["gold_sql"],
            split["family"],
            split["difficulty"],
            strict=True,
        )
    )


def test_deterministic_for_a_seed(generated, tmp_path):
    tasks, db_dir = generated
    again = generate_sql_tasks(seed=0, db_dir=str(tmp_path))
    for split in ("train", "test"):
        assert content(again[split]) == content(tasks[split])
    assert file_hashes(tmp_path) == file_hashes(db_dir)
    other = generate_sql_tasks(seed=1, db_dir=str(tmp_path / "seed1"), scale=0.2)
    assert set(other["train"]["gold_sql"]) != set(tasks["train"]["gold_sql"][: len(other["train"])])


def test_split_is_by_schema(generated):
    tasks, _ = generated
    train_dbs, test_dbs = set(tasks["train"]["db_id"]), set(tasks["test"]["db_id"])
    assert not train_dbs & test_dbs
    assert test_dbs == set(TEST_DOMAINS)
    assert len(train_dbs | test_dbs) == len(DOMAINS) >= 8
    train_paths, test_paths = set(tasks["train"]["db_path"]), set(tasks["test"]["db_path"])
    assert not train_paths & test_paths


def test_every_gold_query_executes_with_a_result(generated):
    tasks, _ = generated
    for split in ("train", "test"):
        connections = {}
        for row in tasks[split]:
            conn = connections.setdefault(row["db_path"], sqlite3.connect(row["db_path"]))
            rows = conn.execute(row["gold_sql"]).fetchall()
            assert rows and rows != [(0,)] and rows != [(None,)], row["gold_sql"]


def test_size_mix_and_labels(generated):
    tasks, _ = generated
    train = tasks["train"]
    assert len(set(zip(train["db_id"], train["gold_sql"], strict=True))) == len(train) >= 2000
    families = Counter(train["family"])
    assert set(families) == {
        "filter",
        "aggregate",
        "group_having",
        "join2",
        "join3",
        "order_limit",
        "nested",
        "set_ops",
    }
    difficulties = Counter(train["difficulty"])
    assert set(difficulties) == {"easy", "medium", "hard"}
    assert difficulties["easy"] >= 0.3 * len(train)
    # Several templates per family: no family asks everything in one wording.
    for family in families:
        openings = {
            q.split()[0] for q, f in zip(train["question"], train["family"], strict=True) if f == family
        }
        assert len(openings) >= 2, family


def test_rows_carry_schema_and_questions_match_sql(generated):
    tasks, _ = generated
    row = tasks["train"][0]
    assert set(row) >= {"question", "db_id", "db_path", "gold_sql", "family", "difficulty", "schema"}
    for row in tasks["train"].select(range(0, len(tasks["train"]), 97)):
        for table in sqlite3.connect(row["db_path"]).execute(
            "SELECT name FROM sqlite_master WHERE type='table'"
        ):
            assert f"CREATE TABLE {table[0]} (" in row["schema"]
        literals = [part.split("'")[0] for part in row["gold_sql"].split(" = '")[1:]]
        assert all(f"'{value}'" in row["question"] for value in literals), (row["question"], row["gold_sql"])


def test_databases_are_reused(generated):
    tasks, db_dir = generated
    stamps = {p: os.stat(p).st_mtime_ns for p in set(tasks["train"]["db_path"])}
    generate_sql_tasks(seed=0, db_dir=str(db_dir), scale=0.05)
    assert {p: os.stat(p).st_mtime_ns for p in stamps} == stamps


def test_difficulty_filter_and_bad_arguments(tmp_path):
    easy = generate_sql_tasks(seed=0, db_dir=str(tmp_path), scale=0.1, difficulties=("easy",))
    assert set(easy["train"]["difficulty"]) == {"easy"}
    with pytest.raises(ValueError, match="unknown test domains"):
        generate_sql_tasks(db_dir=str(tmp_path), test_domains=("atlantis",))
    with pytest.raises(ValueError, match="unknown difficulties"):
        generate_sql_tasks(db_dir=str(tmp_path), difficulties=("trivial",))


def test_databases_default_to_the_project_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDRL_CACHE", str(tmp_path))
    tasks = generate_sql_tasks(seed=0, scale=0.05)
    assert {os.path.dirname(p) for p in tasks["train"]["db_path"]} == {str(tmp_path / "sql_tasks")}
