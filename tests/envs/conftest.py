"""Small databases written by the tests themselves, and the built-in tasks generated once per session."""

import sqlite3

import pytest

STAFF_ROWS = [
    (1, "Ann", "Sales", 50000.0, 500.0),
    (2, "Bob", "Sales", 62000.5, None),
    (3, "Cid", "Research", 75000.25, None),
    (4, "Dee", "Support", 52000.0, 250.0),
    (5, "Eve", "Research", 91000.0, 1000.0),
    (6, "Fay", "Legal", 43000.75, None),
]
DEPT_ROWS = [
    (1, "Sales", "Boston"),
    (2, "Research", "Denver"),
    (3, "Support", "Boston"),
    (4, "Legal", "Austin"),
]


def write_staff_db(path) -> str:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE emp (id INTEGER PRIMARY KEY, name TEXT, dept TEXT, salary REAL, bonus REAL)")
    conn.execute("CREATE TABLE dept (id INTEGER PRIMARY KEY, name TEXT, city TEXT)")
    conn.execute("CREATE TABLE big (id INTEGER PRIMARY KEY, note TEXT)")
    conn.executemany("INSERT INTO emp VALUES (?, ?, ?, ?, ?)", STAFF_ROWS)
    conn.executemany("INSERT INTO dept VALUES (?, ?, ?)", DEPT_ROWS)
    conn.executemany("INSERT INTO big VALUES (?, ?)", [(i, f"note {i}") for i in range(1, 1001)])
    conn.commit()
    conn.close()
    return str(path)


@pytest.fixture(scope="session")
def staff_db(tmp_path_factory) -> str:
    """emp(6 rows), dept(4 rows) and big(1000 rows): a database the tests know by heart."""
    return write_staff_db(tmp_path_factory.mktemp("staff") / "staff.sqlite")


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """The built-in task set for seed 0 and the directory of its databases."""
    from envs.sql.generator import generate_sql_tasks

    db_dir = tmp_path_factory.mktemp("generated")
    return generate_sql_tasks(seed=0, db_dir=str(db_dir)), db_dir
