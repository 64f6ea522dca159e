"""The built-in task generator: determinism, schema-disjoint split, gold queries checked by plain sqlite3."""

import hashlib
import os
import re
import sqlite3
from collections import Counter

import pytest

from envs.sql.generator import generate_sql_tasks
from envs.sql.generator.domains import DOMAINS, TEST_DOMAINS


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
    assert test_dbs == {name for domain in TEST_DOMAINS for name in (domain, f"{domain}_2")}
    assert len(train_dbs | test_dbs) == 2 * len(DOMAINS) >= 16
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
    # Joins are the most common kind of real question, and so of the generated ones.
    assert families.most_common(1)[0][0] == "join2"
    assert families["join2"] + families["join3"] >= 0.3 * len(train)
    difficulties = Counter(train["difficulty"])
    assert set(difficulties) == {"easy", "medium", "hard"}
    assert difficulties["easy"] >= 0.2 * len(train)
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
        for (ddl,) in sqlite3.connect(row["db_path"]).execute(
            "SELECT sql FROM sqlite_master WHERE type='table'"
        ):
            assert ddl in row["schema"]
        literals = re.findall(r"(?:=|!=) '((?:[^']|'')*)'", row["gold_sql"])
        assert all(value.replace("''", "'") in row["question"] for value in literals), (
            row["question"],
            row["gold_sql"],
        )


def foreign_keys(db_path: str) -> set[frozenset[tuple[str, str]]]:
    """Every declared foreign key as {(child table, column), (parent table, column)}, read by SQLite."""
    conn = sqlite3.connect(db_path)
    tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {
        frozenset({(table, fk[3]), (fk[2], fk[4])})
        for table in tables
        for fk in conn.execute(f'PRAGMA foreign_key_list("{table}")')
    }


def test_every_join_follows_a_declared_foreign_key(generated):
    tasks, _ = generated
    joins = 0
    for row in tasks["train"]:
        aliases = {
            alias: table for table, alias in re.findall(r"(?:FROM|JOIN) (\w+) AS (T\d)", row["gold_sql"])
        }
        declared = foreign_keys(row["db_path"])
        for a1, c1, a2, c2 in re.findall(r"(T\d)\.(\w+) = (T\d)\.(\w+)", row["gold_sql"]):
            assert frozenset({(aliases[a1], c1), (aliases[a2], c2)}) in declared, row["gold_sql"]
            joins += 1
    assert joins >= 1000


def test_databases_are_named_in_several_styles(generated):
    tasks, _ = generated
    keys, fk_clauses, quoted = set(), set(), set()
    for db_path in set(tasks["train"]["db_path"]):
        conn = sqlite3.connect(db_path)
        for name, ddl in conn.execute("SELECT name, sql FROM sqlite_master WHERE type='table'"):
            key = next(col[1] for col in conn.execute(f'PRAGMA table_info("{name}")') if col[5] == 1)
            keys.add("id" if key.lower() == "id" else "entity_id")
            fk_clauses.add("FOREIGN KEY" in ddl)
            quoted.add(ddl.startswith('CREATE TABLE "'))
    assert keys == {"id", "entity_id"}
    assert fk_clauses == {True, False} and quoted == {True, False}


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
    with pytest.raises(ValueError, match="variants=0"):
        generate_sql_tasks(db_dir=str(tmp_path), variants=0)


def test_databases_default_to_the_project_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGEDRL_CACHE", str(tmp_path))
    tasks = generate_sql_tasks(seed=0, scale=0.05)
    assert {os.path.dirname(p) for p in tasks["train"]["db_path"]} == {str(tmp_path / "sql_tasks")}
