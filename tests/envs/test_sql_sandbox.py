"""The sandbox refuses or cuts off hostile SQL, and the database file never changes."""

import hashlib
import os
import sqlite3
import threading

import pytest

from envs.sql import QueryResult, SqlExecutor, execute

RUNAWAY_CTE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
ATTACKS = {
    "insert": "INSERT INTO emp VALUES (7, 'Mal', 'Sales', 1.0, NULL)",
    "update": "UPDATE emp SET salary = 0",
    "delete": "DELETE FROM emp",
    "drop": "DROP TABLE emp",
    "create": "CREATE TABLE evil (x)",
    "create temp": "CREATE TEMP TABLE evil (x)",
    "create view": "CREATE VIEW evil AS SELECT 1",
    "trigger": "CREATE TRIGGER t AFTER INSERT ON emp BEGIN DELETE FROM emp; END",
    "alter": "ALTER TABLE emp ADD COLUMN evil TEXT",
    "replace": "REPLACE INTO dept VALUES (1, 'X', 'Y')",
    "writable_schema": "PRAGMA writable_schema = 1",
    "query_only off": "PRAGMA query_only = 0",
    "journal_mode": "PRAGMA journal_mode = WAL",
    "load_extension": "SELECT load_extension('/tmp/evil.so')",
    "vacuum into": "VACUUM INTO '/tmp/pagedrl_vacuum_copy.sqlite'",
    "begin": "BEGIN IMMEDIATE",
    "many statements": "SELECT 1; DROP TABLE emp",
    "many selects": "SELECT 1; SELECT 2",
    "huge blob": "SELECT zeroblob(2000000000)",
}


def sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture()
def victim_db(tmp_path, staff_db):
    path = tmp_path / "victim.sqlite"
    path.write_bytes(open(staff_db, "rb").read())
    return str(path)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_refused_and_file_unchanged(victim_db, name):
    before = sha256(victim_db)
    result = execute(victim_db, ATTACKS[name], timeout_s=1.0)
    assert not result.ok and result.error
    assert sha256(victim_db) == before
    assert sorted(os.listdir(os.path.dirname(victim_db))) == ["victim.sqlite"]
    rows = sqlite3.connect(victim_db).execute("SELECT COUNT(*) FROM emp").fetchall()
    assert rows == [(6,)]


def test_attach_of_another_file_is_refused(victim_db, tmp_path):
    other = tmp_path / "other.sqlite"
    before = sha256(victim_db)
    result = execute(victim_db, f"ATTACH DATABASE '{other}' AS other")
    assert not result.ok
    assert not other.exists()
    assert sha256(victim_db) == before


@pytest.mark.timeout(60)
def test_runaway_recursive_cte_is_cut_off(victim_db):
    before = sha256(victim_db)
    result = execute(victim_db, RUNAWAY_CTE, timeout_s=0.3)
    assert not result.ok and "time limit" in result.error
    assert sha256(victim_db) == before


@pytest.mark.timeout(60)
def test_billion_row_cross_join(victim_db):
    # big has 1000 rows, so the triple product has 10^9 rows.
    rows = execute(victim_db, "SELECT * FROM big a, big b, big c", max_rows=50)
    assert rows.ok and rows.truncated and len(rows.rows) == 50
    assert rows.rows[0] == (1, "note 1", 1, "note 1", 1, "note 1")
    counted = execute(victim_db, "SELECT count(*) FROM big a, big b, big c", timeout_s=0.3)
    assert not counted.ok and "time limit" in counted.error


def test_oversized_values_are_bounded(staff_db):
    text = execute(staff_db, "SELECT printf('%.*c', 5000000, 'x')")
    assert not text.ok or all(v is None or len(v) <= 1_000_000 for row in text.rows for v in row)
    blob = execute(staff_db, "SELECT zeroblob(2000000000)")
    assert not blob.ok and "too big" in blob.error


def test_read_only_queries_and_schema_pragmas_work(staff_db):
    result = execute(staff_db, "SELECT name, salary FROM emp WHERE dept = 'Research' ORDER BY id")
    assert result == QueryResult(
        ok=True, columns=("name", "salary"), rows=[("Cid", 75000.25), ("Eve", 91000.0)]
    )
    info = execute(staff_db, "PRAGMA table_info(dept)")
    assert info.ok and [row[1] for row in info.rows] == ["id", "name", "city"]
    master = execute(staff_db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    assert master.rows == [("big",), ("dept",), ("emp",)]


def test_connection_survives_a_timeout(staff_db):
    assert not execute(staff_db, RUNAWAY_CTE, timeout_s=0.2).ok
    assert execute(staff_db, "SELECT COUNT(*) FROM emp").rows == [(6,)]


def test_character_cap_truncates_rows(staff_db):
    # "note 1" .. "note 9" are 6 characters each: 20 characters fit three rows.
    result = execute(staff_db, "SELECT note FROM big ORDER BY id", max_chars=20)
    assert result.ok and result.truncated
    assert result.rows == [("note 1",), ("note 2",), ("note 3",)]


@pytest.mark.parametrize(
    "sql, needle",
    [
        ("", "empty query"),
        ("   ", "empty query"),
        ("-- just a comment", "no statement"),
        ("SELEC 1", "syntax"),
    ],
)
def test_errors_come_back_as_results(staff_db, sql, needle):
    result = execute(staff_db, sql)
    assert not result.ok and needle in result.error


def test_missing_database_is_an_error_result(tmp_path):
    missing = str(tmp_path / "nope.sqlite")
    result = execute(missing, "SELECT 1")
    assert not result.ok and missing in result.error
    assert not os.path.exists(missing)


def test_rebuilt_file_is_reopened(tmp_path):
    path = tmp_path / "swap.sqlite"
    for value in (1, 2):
        tmp = tmp_path / "swap.tmp"
        conn = sqlite3.connect(tmp)
        conn.execute("CREATE TABLE t (x)")
        conn.execute("INSERT INTO t VALUES (?)", (value,))
        conn.commit()
        conn.close()
        os.replace(tmp, path)
        assert execute(str(path), "SELECT x FROM t").rows == [(value,)]


def test_executor_runs_concurrently_in_input_order(staff_db):
    queries = [(staff_db, f"SELECT name FROM emp WHERE id = {i % 6 + 1}") for i in range(60)]
    executor = SqlExecutor(num_threads=4)
    try:
        results = executor.map(queries)
        assert [r.rows for r in results] == [execute(p, q).rows for p, q in queries]
        # A runaway query on one thread does not hold back a quick one on another.
        slow = executor.submit(staff_db, RUNAWAY_CTE, timeout_s=2.0)
        quick = executor.submit(staff_db, "SELECT COUNT(*) FROM dept")
        assert quick.result().rows == [(4,)]
        assert not slow.done()
        assert "time limit" in slow.result().error
    finally:
        executor.shutdown()


def test_threads_hold_their_own_connections(staff_db):
    results, errors = [], []

    def work():
        try:
            for _ in range(50):
                results.append(execute(staff_db, "SELECT SUM(salary) FROM emp").rows)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [[(373001.5,)]] * 200
