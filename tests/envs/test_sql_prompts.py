"""SQL extraction from messy model outputs, schema rendering and result observations."""

import sqlite3

import pytest

from envs.sql import QueryResult, SqlEnv, extract_sql, render_schema
from envs.sql.prompts import format_result, sql_messages, task_messages

OUTPUTS = [
    ("fenced", "```sql\nSELECT name FROM emp;\n```", "SELECT name FROM emp"),
    (
        "fence with chatter",
        "Sure! Here is the query:\n\n```sql\nSELECT COUNT(*)\nFROM emp\nWHERE dept = 'Sales';\n```"
        "\nThis counts the sales staff.",
        "SELECT COUNT(*)\nFROM emp\nWHERE dept = 'Sales'",
    ),
    ("upper-case fence tag", "```SQL\nselect 1\n```", "select 1"),
    ("last fence wins", "First try:\n```sql\nSELECT 1\n```\nBetter:\n```sql\nSELECT 2\n```", "SELECT 2"),
    ("plain fence holding SQL", "```\nSELECT name FROM emp\n```", "SELECT name FROM emp"),
    ("python fence is skipped", "```python\nprint(1)\n```\nSELECT 3", "SELECT 3"),
    ("answer tag beats fences", "```sql\nSELECT 1\n```\n<answer>SELECT 2</answer>", "SELECT 2"),
    ("fence inside answer", "<answer>\n```sql\nSELECT 5;\n```\n</answer>", "SELECT 5"),
    ("last answer tag", "<answer>SELECT 1</answer> wait, no: <answer>SELECT 7</answer>", "SELECT 7"),
    ("unclosed answer at the end", "Final: <answer>SELECT name FROM emp", "SELECT name FROM emp"),
    ("unclosed fence at the end", "```sql\nSELECT name\nFROM emp", "SELECT name\nFROM emp"),
    (
        "bare SQL after prose",
        "The answer is:\nSELECT name FROM emp WHERE id = 1; hope this helps",
        "SELECT name FROM emp WHERE id = 1",
    ),
    (
        "bare multi-line SQL",
        "Query:\nSELECT name\nFROM emp\nWHERE id = 2\n\nDone.",
        "SELECT name\nFROM emp\nWHERE id = 2",
    ),
    ("bare WITH", "with t as (select 1 as x) select x from t", "with t as (select 1 as x) select x from t"),
    ("markdown bullet", "- SELECT id FROM dept", "SELECT id FROM dept"),
    ("no SQL at all", "I am not sure how to answer this question.", None),
    ("empty answer tag", "<answer></answer>", None),
    ("empty", "", None),
]


@pytest.mark.parametrize("text, expected", [o[1:] for o in OUTPUTS], ids=[o[0] for o in OUTPUTS])
def test_extract_sql(text, expected):
    assert extract_sql(text) == expected


def test_render_schema_lists_tables_and_sample_rows(staff_db):
    plain = render_schema(staff_db)
    assert plain.count("CREATE TABLE") == 3 and "emp (id INTEGER PRIMARY KEY, name TEXT" in plain
    assert "sample rows" not in plain
    sampled = render_schema(staff_db, sample_rows=2)
    assert (
        "/* 2 sample rows from emp:\nid | name | dept | salary | bonus\n1 | Ann | Sales | 50000.0 | 500.0"
        in sampled
    )


@pytest.fixture(scope="module")
def keyed_db(tmp_path_factory) -> str:
    """Two tables with a composite primary key, a composite foreign key, a foreign key to an implicit
    primary key, quoted names and Spider's declared types."""
    path = tmp_path_factory.mktemp("keyed") / "keyed.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(
            """
            CREATE TABLE "Course Info" (
                course_id   VARCHAR(8),
                "Year"      numeric(4,0),
                title       TEXT,
                credits     REAL,
                PRIMARY KEY (course_id, "Year")
            );
            CREATE TABLE enrol (
                stu_id      INTEGER PRIMARY KEY,
                course_id   VARCHAR(8),
                yr          numeric(4,0),
                enrolled_on DATETIME,
                grade,
                mentor      INTEGER REFERENCES enrol,
                FOREIGN KEY (course_id, yr) REFERENCES "Course Info"(course_id, "Year")
            );
            INSERT INTO enrol VALUES (7, 'CS101', 2020, '2020-09-01', 'A', NULL);
            """
        )
    conn.close()
    return str(path)


def test_compact_schema_is_one_line_a_table_with_kinds_and_keys(keyed_db):
    assert render_schema(keyed_db, style="compact") == (
        "Course Info(course_id text pk, Year number pk, title text, credits number)\n"
        "enrol(stu_id number pk, course_id text -> Course Info.course_id, yr number -> Course Info.Year, "
        "enrolled_on date, grade, mentor number -> enrol)"
    )
    assert render_schema(keyed_db, sample_rows=1, style="compact").endswith(
        "enrol(stu_id number pk, course_id text -> Course Info.course_id, yr number -> Course Info.Year, "
        "enrolled_on date, grade, mentor number -> enrol)\n"
        "/* 1 sample rows from enrol:\nstu_id | course_id | yr | enrolled_on | grade | mentor\n"
        "7 | CS101 | 2020 | 2020-09-01 | A | None\n*/"
    )


def test_task_messages_render_the_schema_style_from_the_database(keyed_db):
    task = {"question": "Who?", "db_path": keyed_db, "gold_sql": "SELECT 1", "schema": "the row's own text"}
    assert "the row's own text" in task_messages(task, "Be precise.")[1]["content"]
    compact = task_messages(task, "Be precise.", schema_style="compact")[1]["content"]
    assert (
        compact.startswith("Database schema:\nCourse Info(course_id text pk,") and "row's own" not in compact
    )
    with pytest.raises(ValueError, match=r"schema_style='yaml' is not a schema style: use one of \['ddl'"):
        SqlEnv(schema_style="yaml")


def test_messages_hold_schema_question_and_evidence():
    messages = sql_messages("CREATE TABLE t (x);", "How many?", "Be precise.", evidence="x counts things")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "Be precise."
    assert (
        messages[1]["content"]
        == "Database schema:\nCREATE TABLE t (x);\n\nHint: x counts things\n\nQuestion: How many?"
    )


def test_format_result_truncates_rows_and_characters():
    result = QueryResult(ok=True, columns=("n",), rows=[(i,) for i in range(25)])
    assert format_result(result, max_rows=3) == "n\n0\n1\n2\n... (25 rows in total)"
    long = QueryResult(ok=True, columns=("s",), rows=[("x" * 50,)])
    assert format_result(long, max_chars=10) == "s\nxxxxxxxx ..."
    assert format_result(QueryResult(ok=False, error="boom")) == "Error: boom"
    assert format_result(QueryResult(ok=True, columns=("a", "b"))) == "(no rows) columns: a, b"
