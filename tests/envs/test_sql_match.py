"""execution_match on hand-written pairs over the staff database (see conftest for its rows)."""

import tracemalloc

import pytest

from envs.sql import GoldQueryError, execution_match, has_top_level_order_by
from envs.sql.match import result_overlap, results_match
from envs.sql.sandbox import MAX_RESULT_BYTES, execute

INFINITE = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"

PAIRS = [
    # row order: ordered only when the gold query has a top-level ORDER BY
    (
        "same ordered query",
        "SELECT name FROM emp ORDER BY salary",
        "SELECT name FROM emp ORDER BY salary",
        True,
    ),
    (
        "reversed order",
        "SELECT name FROM emp ORDER BY salary",
        "SELECT name FROM emp ORDER BY salary DESC",
        False,
    ),
    ("gold unordered, pred sorted", "SELECT name FROM emp", "SELECT name FROM emp ORDER BY name DESC", True),
    (
        "inner ORDER BY is not top-level",
        "SELECT name FROM (SELECT name FROM emp ORDER BY salary)",
        "SELECT name FROM emp ORDER BY salary DESC",
        True,
    ),
    (
        "ORDER BY on a compound",
        "SELECT name FROM emp WHERE dept = 'Sales' UNION SELECT name FROM emp "
        "WHERE salary > 70000 ORDER BY name",
        "SELECT name FROM emp WHERE dept = 'Sales' OR salary > 70000 ORDER BY name DESC",
        False,
    ),
    (
        "same rows, order ignored",
        "SELECT name FROM emp WHERE dept = 'Sales' OR salary > 70000",
        "SELECT name FROM emp WHERE salary > 70000 UNION ALL SELECT name FROM emp WHERE dept = 'Sales'",
        True,
    ),
    # duplicates: multisets, not sets
    ("DISTINCT drops duplicates", "SELECT dept FROM emp", "SELECT DISTINCT dept FROM emp", False),
    ("doubled rows", "SELECT dept FROM emp", "SELECT dept FROM emp UNION ALL SELECT dept FROM emp", False),
    ("duplicates in another order", "SELECT dept FROM emp", "SELECT dept FROM emp ORDER BY dept", True),
    (
        "join duplicates vs DISTINCT",
        "SELECT DISTINCT d.name FROM dept d JOIN emp e ON e.dept = d.name",
        "SELECT d.name FROM dept d JOIN emp e ON e.dept = d.name",
        False,
    ),
    # column permutation
    ("two columns swapped", "SELECT name, salary FROM emp", "SELECT salary, name FROM emp", True),
    (
        "swapped under ORDER BY",
        "SELECT name, dept FROM emp ORDER BY id",
        "SELECT dept, name FROM emp ORDER BY id",
        True,
    ),
    (
        "consistent swap of literal rows",
        "SELECT 1, 2 UNION ALL SELECT 3, 4",
        "SELECT 2, 1 UNION ALL SELECT 4, 3",
        True,
    ),
    ("swap in one row only", "SELECT 1, 2 UNION ALL SELECT 3, 4", "SELECT 2, 1 UNION ALL SELECT 3, 4", False),
    ("extra column", "SELECT name FROM emp", "SELECT name, dept FROM emp", False),
    ("wrong column", "SELECT name FROM emp", "SELECT dept FROM emp", False),
    # floats: relative tolerance 1e-6; ints equal floats of the same value
    ("AVG vs SUM/COUNT", "SELECT AVG(salary) FROM emp", "SELECT SUM(salary) / COUNT(*) FROM emp", True),
    ("0.1 + 0.2 vs 0.3", "SELECT 0.3", "SELECT 0.1 + 0.2", True),
    ("relative error 5e-8", "SELECT 1000000.0", "SELECT 1000000.05", True),
    ("relative error 1e-5", "SELECT 1.0", "SELECT 1.00001", False),
    ("integer vs real count", "SELECT COUNT(*) FROM emp", "SELECT CAST(COUNT(*) AS REAL) FROM emp", True),
    ("rounded average", "SELECT AVG(salary) FROM emp", "SELECT ROUND(AVG(salary), 0) FROM emp", False),
    # integers compare exactly: 10000000 and 10000001 differ by 1e-7, inside the float tolerance
    (
        "ordered integers reversed",
        "SELECT column1 FROM (VALUES (10000000), (10000001)) ORDER BY column1",
        "SELECT column1 FROM (VALUES (10000000), (10000001)) ORDER BY column1 DESC",
        False,
    ),
    (
        "integers re-paired next to a float column",
        "SELECT 10000000, 0.5 UNION ALL SELECT 10000001, 0.25",
        "SELECT 10000001, 0.5 UNION ALL SELECT 10000000, 0.25",
        False,
    ),
    ("integer vs float within tolerance", "SELECT 10000000", "SELECT 10000000.5", True),
    # NULLs
    ("NULL equals NULL", "SELECT bonus FROM emp WHERE id = 3", "SELECT NULL", True),
    ("NULL is not 0", "SELECT bonus FROM emp WHERE id = 3", "SELECT 0", False),
    ("NULLs in a multiset", "SELECT bonus FROM emp", "SELECT bonus FROM emp ORDER BY bonus DESC", True),
    ("COALESCE changes NULLs", "SELECT bonus FROM emp", "SELECT COALESCE(bonus, 0) FROM emp", False),
    # string case: keywords are free, values are not
    (
        "keyword case",
        "SELECT name FROM emp WHERE dept = 'Sales'",
        "select NAME from EMP where DEPT = 'Sales'",
        True,
    ),
    ("value case", "SELECT name FROM emp", "SELECT upper(name) FROM emp", False),
    (
        "filter on wrong case",
        "SELECT name FROM emp WHERE dept = 'Sales'",
        "SELECT name FROM emp WHERE dept = 'sales'",
        False,
    ),
    # equivalent rewrites
    (
        "JOIN vs IN subquery",
        "SELECT e.name FROM emp e JOIN dept d ON e.dept = d.name WHERE d.city = 'Boston'",
        "SELECT name FROM emp WHERE dept IN (SELECT name FROM dept WHERE city = 'Boston')",
        True,
    ),
    (
        "COUNT vs SUM(CASE)",
        "SELECT COUNT(*) FROM emp WHERE salary > 50000",
        "SELECT SUM(CASE WHEN salary > 50000 THEN 1 ELSE 0 END) FROM emp",
        True,
    ),
    (
        "BETWEEN vs two bounds",
        "SELECT name FROM emp WHERE salary BETWEEN 50000 AND 75000.25",
        "SELECT name FROM emp WHERE salary >= 50000 AND salary <= 75000.25",
        True,
    ),
    (
        "MAX vs ORDER BY LIMIT 1",
        "SELECT name FROM emp WHERE salary = (SELECT MAX(salary) FROM emp)",
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 1",
        True,
    ),
    # near misses
    (
        "> vs >= at a boundary row",
        "SELECT name FROM emp WHERE salary > 50000",
        "SELECT name FROM emp WHERE salary >= 50000",
        False,
    ),
    (
        "LIMIT 3 vs LIMIT 4",
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 3",
        "SELECT name FROM emp ORDER BY salary DESC LIMIT 4",
        False,
    ),
    (
        "LEFT JOIN keeps unmatched rows",
        "SELECT d.name FROM dept d JOIN emp e ON e.dept = d.name AND e.bonus > 0",
        "SELECT d.name FROM dept d LEFT JOIN emp e ON e.dept = d.name AND e.bonus > 0",
        False,
    ),
    ("both empty", "SELECT name FROM emp WHERE salary > 1e9", "SELECT name FROM emp WHERE 0", True),
    ("empty vs rows", "SELECT name FROM emp WHERE salary > 1e9", "SELECT name FROM emp", False),
    # errors and timeouts never match
    ("syntax error", "SELECT name FROM emp", "SELEC name FROM emp", False),
    ("unknown column", "SELECT name FROM emp", "SELECT nam FROM emp", False),
    ("write attempt", "SELECT COUNT(*) FROM emp", "DELETE FROM emp", False),
    ("runaway query", "SELECT COUNT(*) FROM emp", INFINITE, False),
]


@pytest.mark.parametrize("gold, pred, expected", [p[1:] for p in PAIRS], ids=[p[0] for p in PAIRS])
def test_execution_match_pairs(staff_db, gold, pred, expected):
    assert execution_match(staff_db, gold, pred, timeout_s=0.5) is expected


def test_pair_count_covers_the_specification():
    assert len(PAIRS) >= 30


def test_truncated_prediction_never_matches(staff_db):
    # Six rows cut to max_rows=5 are the five gold rows plus one; the prefix alone would match.
    gold, pred = "SELECT id FROM big WHERE id <= 5", "SELECT id FROM big WHERE id <= 6"
    assert not execution_match(staff_db, gold, pred, max_rows=5)
    assert execution_match(staff_db, gold, "SELECT id FROM big WHERE id < 6", max_rows=5)
    gold_result, cut = execute(staff_db, gold), execute(staff_db, pred, max_rows=5)
    assert cut.truncated and cut.rows == gold_result.rows
    assert not results_match(gold_result, cut, ordered=False)
    assert result_overlap(gold_result, cut) == 0.0


def test_grading_a_huge_prediction_holds_only_the_sandbox_budget(staff_db):
    # 2000 rows of 30 kB: the grader once fetched all 60 MB of them, and copied them again.
    pred = (
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 2000) "
        "SELECT zeroblob(30000) FROM c"
    )
    tracemalloc.start()
    try:
        assert not execution_match(staff_db, "SELECT id FROM big", pred)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_RESULT_BYTES


def test_failing_gold_query_is_a_task_error(staff_db):
    with pytest.raises(GoldQueryError, match="no such column"):
        execution_match(staff_db, "SELECT nope FROM emp", "SELECT name FROM emp")


@pytest.mark.parametrize(
    "sql, expected",
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("select a from t order\n  by a desc limit 3", True),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a)", False),
        ("SELECT 'order by' FROM t", False),
        ("SELECT a FROM t -- ORDER BY a", False),
        ("SELECT a FROM t /* ORDER BY a */", False),
        ('SELECT "order" FROM t', False),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT a, RANK() OVER (ORDER BY a) FROM t", False),
    ],
)
def test_top_level_order_by(sql, expected):
    assert has_top_level_order_by(sql) is expected


OVERLAP_GOLD = "SELECT name FROM emp WHERE dept = 'Research'"  # Cid, Eve


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        (OVERLAP_GOLD, OVERLAP_GOLD, 1.0),
        (OVERLAP_GOLD, "SELECT name FROM emp", 2 * 2 / (2 + 6)),  # all 6 names: F1 of {Cid, Eve} in them
        (OVERLAP_GOLD, "SELECT * FROM emp WHERE dept = 'Research'", 1 / 5),  # right rows, 5 columns
        (OVERLAP_GOLD, "SELECT dept, name FROM emp WHERE dept = 'Research'", 1 / 2),
        (OVERLAP_GOLD, "SELECT name FROM emp WHERE dept = 'Sales'", 0.0),
        (OVERLAP_GOLD, "SELECT id FROM emp WHERE dept = 'Research'", 0.0),
        (OVERLAP_GOLD, "SELECT nope FROM emp", 0.0),  # an error earns nothing
        # salaries {50000, 62000.5} against {50000, 52000, 43000.75}: one in common
        (
            "SELECT salary FROM emp WHERE dept = 'Sales'",
            "SELECT salary FROM emp WHERE salary < 60000",
            2 * 1 / (2 + 3),
        ),
        ("SELECT count(*) FROM emp WHERE dept = 'Sales'", "SELECT 2.0", 1.0),  # 2 == 2.0
        ("SELECT name FROM emp WHERE salary > 1e9", "SELECT name FROM emp WHERE id < 0", 1.0),
        ("SELECT name FROM emp WHERE salary > 1e9", "SELECT name FROM emp", 0.0),
    ],
)
def test_result_overlap_is_partial_credit_worked_by_hand(staff_db, gold, pred, expected):
    gold_result = execute(staff_db, gold)
    assert gold_result.ok
    assert result_overlap(gold_result, execute(staff_db, pred)) == pytest.approx(expected)
