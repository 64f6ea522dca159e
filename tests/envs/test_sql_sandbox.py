"""The sandbox refuses or cuts off hostile SQL, and the database file never changes."""

import hashlib
import math
import os
import sqlite3
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs.sql import QueryResult, execute, sandbox

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
    # virtual tables other than the read-only json_each, json_tree and schema pragmas stay denied
    "dbstat": "SELECT * FROM dbstat",
    "database_list": "SELECT * FROM pragma_database_list",
    "journal_mode vtab": "SELECT * FROM pragma_journal_mode",
}


def counting_to(n: int) -> str:
    return f"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT {n}) "


# Each is one VM operation, quadratic in its arguments' lengths: the old sandbox ran them for 4-12 s.
ONE_LONG_OPERATION = {
    "like": "SELECT printf('%.*c', 200000, 'a') LIKE '%' || printf('%.*c', 20000, 'a') || 'b'",
    "glob": "SELECT printf('%.*c', 200000, 'a') GLOB '*' || printf('%.*c', 20000, 'a') || 'b'",
    "instr": "SELECT instr(printf('%.*c', 999000, 'a'), printf('%.*c', 499000, 'a') || 'b')",
    "trim": "SELECT ltrim(printf('%.*c', 200000, 'a'), printf('%.*c', 20000, 'b') || 'a')",
}
# About 0.05 s of LIKE on every row of big; random() stops SQLite from computing it once for all rows.
SLOW_ON_EVERY_ROW = (
    "SELECT printf('%.*c', 30000 + (random() & 1), 'a') LIKE '%' || printf('%.*c', 900, 'a') || 'b' FROM big"
)


def traced_peak(fn):
    """``fn()`` and the peak bytes Python allocated while it ran."""
    tracemalloc.start()
    try:
        return fn(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


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


def test_queries_run_concurrently_on_a_thread_pool(staff_db):
    queries = [f"SELECT name FROM emp WHERE id = {i % 6 + 1}" for i in range(60)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda sql: execute(staff_db, sql), queries))
        assert [r.rows for r in results] == [execute(staff_db, q).rows for q in queries]
        # A runaway query on one thread does not hold back a quick one on another.
        slow = pool.submit(execute, staff_db, RUNAWAY_CTE, timeout_s=2.0)
        quick = pool.submit(execute, staff_db, "SELECT COUNT(*) FROM dept")
        assert quick.result().rows == [(4,)]
        assert not slow.done()
        assert "time limit" in slow.result().error


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(ONE_LONG_OPERATION))
def test_one_long_operation_cannot_outlast_the_time_limit(staff_db, name):
    start = time.monotonic()
    result = execute(staff_db, ONE_LONG_OPERATION[name], timeout_s=0.2)
    assert time.monotonic() - start < 3 * 0.2
    assert not result.ok or result.rows == [(None,)]  # refused, or printf's too-long string became NULL


@pytest.mark.timeout(120)
def test_a_slow_operation_on_every_row_is_stopped_between_rows(staff_db):
    start = time.monotonic()
    result = execute(staff_db, SLOW_ON_EVERY_ROW, timeout_s=0.5)
    assert not result.ok and "time limit" in result.error
    assert time.monotonic() - start < 3 * 0.5


@pytest.mark.timeout(120)
def test_concurrent_slow_queries_each_keep_the_time_limit(staff_db):
    with ThreadPoolExecutor(max_workers=8) as pool:
        start = time.monotonic()
        results = list(pool.map(lambda _: execute(staff_db, SLOW_ON_EVERY_ROW, timeout_s=0.5), range(8)))
        assert time.monotonic() - start < 3 * 0.5
    assert all(not r.ok and "time limit" in r.error for r in results)


def test_rows_are_counted_against_the_byte_budget_as_they_arrive(staff_db):
    # 2000 rows of 30 kB are 60 MB; the grader asks for 10,000 rows and no character cap to speak of.
    sql = counting_to(2000) + "SELECT zeroblob(30000) FROM c"
    result, peak = traced_peak(lambda: execute(staff_db, sql, max_rows=10_000, max_chars=10**9))
    assert result.ok and result.truncated and 0 < len(result.rows) < 2000
    assert result.rows[0] == (bytes(30000),)
    assert peak < 2 * sandbox.MAX_RESULT_BYTES


def test_one_row_cannot_be_huge(staff_db):
    # 2000 columns sharing one 32 kB value would be a 64 MB row.
    sql = "SELECT " + ", ".join(["v"] * 2000) + " FROM (SELECT zeroblob(32000) AS v LIMIT 1)"
    result, peak = traced_peak(lambda: execute(staff_db, sql, max_rows=10_000, max_chars=10**9))
    assert not result.ok and "too many columns" in result.error
    assert peak < 2 * sandbox.MAX_RESULT_BYTES


def test_tables_wider_than_a_result_can_still_be_read(tmp_path):
    path = str(tmp_path / "wide.sqlite")
    conn = sqlite3.connect(path)
    num_columns = sandbox.MAX_RESULT_COLUMNS + 44
    conn.execute(f"CREATE TABLE wide ({', '.join(f'c{i}' for i in range(num_columns))})")
    conn.execute(f"INSERT INTO wide VALUES ({', '.join(str(i) for i in range(num_columns))})")
    conn.commit()
    conn.close()
    assert execute(path, f"SELECT c0, c{num_columns - 1} FROM wide").rows == [(0, num_columns - 1)]
    assert "too many columns" in execute(path, "SELECT * FROM wide").error


def test_concurrent_queries_share_a_global_memory_bound(staff_db, monkeypatch):
    budget = 1 << 20
    monkeypatch.setattr(sandbox, "MAX_RESULT_BYTES", budget)
    # 40 rows of 8 x 32 kB (256 kB) each, 10 MB per query if fetched whole.
    sql = counting_to(40) + "SELECT " + ", ".join(["zeroblob(32000)"] * 8) + " FROM c"
    limits = {"max_rows": 10_000, "max_chars": 10**9}

    def eight_at_once():
        with ThreadPoolExecutor(max_workers=8) as pool:
            return [f.result() for f in [pool.submit(execute, staff_db, sql, **limits) for _ in range(8)]]

    results, peak = traced_peak(eight_at_once)
    assert all(r.ok and r.truncated and 0 < len(r.rows) < 40 for r in results)
    assert peak < sandbox.MAX_RUNNING_QUERIES * 2 * budget


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "limits, name",
    [
        ({"timeout_s": math.nan}, "timeout_s"),
        ({"timeout_s": math.inf}, "timeout_s"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": "2"}, "timeout_s"),
        ({"max_rows": -1}, "max_rows"),
        ({"max_rows": 2.5}, "max_rows"),
        ({"max_chars": -1}, "max_chars"),
    ],
)
def test_bad_limits_are_refused_at_once(staff_db, limits, name):
    with pytest.raises(ValueError, match=f"{name} must be"):
        execute(staff_db, "SELECT note FROM big", **limits)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT key, value, type FROM json_each('[1, \"two\", [3]]')",
        'SELECT fullkey, atom FROM json_tree(\'{"a": {"b": 2}}\')',
        "SELECT e.name, j.value FROM emp e, json_each('[1, 2]') j WHERE e.id = 1",
        "SELECT name, type FROM pragma_table_info('emp')",
        "SELECT name FROM pragma_index_list('emp')",
    ],
)
def test_read_only_table_valued_functions_work(victim_db, sql):
    before = sha256(victim_db)
    result = execute(victim_db, sql)
    assert result.ok, result.error
    assert result.rows == sqlite3.connect(victim_db).execute(sql).fetchall()
    assert sha256(victim_db) == before
