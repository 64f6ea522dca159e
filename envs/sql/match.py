"""Execution match in the style of Spider's test-suite evaluation.

Both queries run in the sandbox. Rows compare as multisets, or as ordered lists when the gold query has a
top-level ORDER BY. Columns may come in any order, NULL equals NULL, integers compare exactly, and a predicted
query that errors, times out or was cut off by the sandbox's caps (``QueryResult.truncated``) never matches.

Deliberate departures from test-suite-sql-eval's ``result_eq``:

- Row order matters only when the gold query has an ORDER BY outside every subquery, string and comment.
  Spider's rule is ``'order by' in gold.lower()``, so an ORDER BY inside a subquery, a window or a string
  literal makes it compare row order too.
- A float equals a number within a relative tolerance of 1e-6 (``REL_TOL``), so ``AVG(x)`` matches
  ``SUM(x) / COUNT(*)``; Spider compares floats exactly. Integers compare exactly in both.
- Two empty results match only when they have the same number of columns; Spider matches any two.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import lru_cache

from envs.sql.sandbox import MAX_RESULT_BYTES, QueryResult, execute

REL_TOL = 1e-6
MAX_GRADED_ROWS = 10_000
_MAX_GREEDY_ROWS = 2000
_TOKEN = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?(?:\*/|$)|[()]|\w+|[^\s\w()]",
    re.DOTALL,
)


class GoldQueryError(ValueError):
    """The reference query of a task fails or returns too many rows: the task itself is broken."""


def has_top_level_order_by(sql: str) -> bool:
    """True when ORDER BY appears outside every parenthesis, string and comment of ``sql``."""
    depth, previous = 0, ""
    for match in _TOKEN.finditer(sql):
        token = match.group(0)
        if token.startswith(("--", "/*")):
            continue
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        if depth != 0 or not (token[0].isalnum() or token[0] == "_"):
            previous = ""
            continue
        word = token.lower()
        if previous == "order" and word == "by":
            return True
        previous = word
    return False


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _values_close(a: object, b: object) -> bool:
    """Equal, or within ``REL_TOL`` when a float is involved: two integers never differ by a tolerance."""
    if a is None or b is None:
        return a is b
    if _is_number(a) and _is_number(b):
        inexact = isinstance(a, float) or isinstance(b, float)
        return a == b or (inexact and math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12))
    return type(a) is type(b) and a == b


def _rows_close(a: tuple, b: tuple) -> bool:
    return all(_values_close(x, y) for x, y in zip(a, b, strict=True))


def _sort_key(row: tuple) -> tuple:
    key = []
    for value in row:
        if value is None:
            key.append((0, 0))
        elif _is_number(value):
            key.append((1, value))  # Python orders ints and floats by exact value; float() would round ints
        elif isinstance(value, str):
            key.append((2, value))
        else:
            key.append((3, bytes(value)))
    return tuple(key)


def _greedy_match(gold: Sequence[tuple], pred: Sequence[tuple]) -> bool:
    unused = list(pred)
    for row in gold:
        for i, candidate in enumerate(unused):
            if _rows_close(row, candidate):
                del unused[i]
                break
        else:
            return False
    return True


def _rows_equal(gold: Sequence[tuple], pred: Sequence[tuple], ordered: bool) -> bool:
    if len(gold) != len(pred):
        return False
    if ordered:
        return all(_rows_close(g, p) for g, p in zip(gold, pred, strict=True))
    if Counter(gold) == Counter(pred):
        return True
    has_float = any(isinstance(v, float) for rows in (gold, pred) for row in rows for v in row)
    if not has_float:
        return False
    pairs = zip(sorted(gold, key=_sort_key), sorted(pred, key=_sort_key), strict=True)
    if all(_rows_close(g, p) for g, p in pairs):
        return True
    # Tolerance can reorder near-equal rows; fall back to pairing rows one by one.
    return len(gold) <= _MAX_GREEDY_ROWS and _greedy_match(gold, pred)


def _column_permutations(gold_columns: list[tuple], pred_columns: list[tuple]) -> Iterator[tuple[int, ...]]:
    """Assignments of predicted columns to gold columns whose values agree as multisets."""
    candidates = [
        [j for j, p in enumerate(pred_columns) if _rows_equal([(v,) for v in g], [(v,) for v in p], False)]
        for g in gold_columns
    ]

    def extend(prefix: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        if len(prefix) == len(candidates):
            yield prefix
            return
        for j in candidates[len(prefix)]:
            if j not in prefix:
                yield from extend(prefix + (j,))

    return extend(())


def results_match(gold: QueryResult, pred: QueryResult, ordered: bool) -> bool:
    """Compare two successful, complete results under the rules in this module's docstring."""
    if (
        not (gold.ok and pred.ok)
        or gold.truncated
        or pred.truncated
        or len(gold.columns) != len(pred.columns)
        or len(gold.rows) != len(pred.rows)
    ):
        return False
    if not gold.rows:
        return True
    gold_columns, pred_columns = list(zip(*gold.rows, strict=True)), list(zip(*pred.rows, strict=True))
    for perm in _column_permutations(gold_columns, pred_columns):
        permuted = [tuple(row[j] for j in perm) for row in pred.rows]
        if _rows_equal(gold.rows, permuted, ordered):
            return True
    return False


def _cell_key(value: object) -> object:
    """Numbers compare by value at 6 significant digits (3 == 3.0), everything else exactly."""
    if _is_number(value):
        return float(f"{float(value):.6g}")
    return value


def _multiset_f1(gold: Counter, pred: Counter) -> float:
    common = sum((gold & pred).values())
    total = sum(gold.values()) + sum(pred.values())
    return 2 * common / total if total else 1.0


def result_overlap(gold: QueryResult, pred: QueryResult) -> float:
    """Partial credit in [0, 1]: how much of the gold result the prediction holds.

    Each gold column is scored by the best multiset F1 of its values against any predicted column, the mean
    over gold columns is scaled by ``len(gold columns) / len(pred columns)`` when extra columns were
    returned (so ``SELECT *`` is not free), and a result that matches scores 1. Rows of an empty gold result
    count as matched only by an empty prediction. A truncated prediction scores 0: its prefix says nothing
    about the rows the sandbox did not return.
    """
    if not (gold.ok and pred.ok) or pred.truncated or not pred.columns:
        return 0.0
    if not gold.rows or not pred.rows:
        return float(not gold.rows and not pred.rows) * min(1.0, len(gold.columns) / len(pred.columns))
    gold_columns = [Counter(map(_cell_key, column)) for column in zip(*gold.rows, strict=True)]
    pred_columns = [Counter(map(_cell_key, column)) for column in zip(*pred.rows, strict=True)]
    recall = sum(max(_multiset_f1(g, p) for p in pred_columns) for g in gold_columns) / len(gold_columns)
    return recall * min(1.0, len(gold_columns) / len(pred_columns))


def run_for_grading(db_path: str, sql: str, timeout_s: float, max_rows: int = MAX_GRADED_ROWS) -> QueryResult:
    """Run a gold or predicted query whole: up to ``max_rows`` rows, sized only by the sandbox's budget."""
    return execute(db_path, sql, timeout_s=timeout_s, max_rows=max_rows, max_chars=MAX_RESULT_BYTES)


@lru_cache(maxsize=512)
def _gold_result(db_key: tuple, gold_sql: str, timeout_s: float, max_rows: int) -> QueryResult:
    result = run_for_grading(db_key[0], gold_sql, timeout_s, max_rows)
    if not result.ok:
        raise GoldQueryError(f"gold query failed on {db_key[0]}: {result.error}\n  query: {gold_sql}")
    if result.truncated:
        raise GoldQueryError(
            f"gold query returns more than max_rows={max_rows} rows or more than the sandbox's "
            f"{MAX_RESULT_BYTES >> 20} MiB of rows: {gold_sql}"
        )
    return result


def gold_result(
    db_path: str, gold_sql: str, timeout_s: float = 2.0, max_rows: int = MAX_GRADED_ROWS
) -> QueryResult:
    """The (cached) result of a task's reference query; raises ``GoldQueryError`` when it fails."""
    stat = os.stat(db_path)
    return _gold_result(
        (os.path.abspath(db_path), stat.st_mtime_ns, stat.st_ino), gold_sql, timeout_s, max_rows
    )


def execution_match(
    db_path: str, gold_sql: str, predicted_sql: str, timeout_s: float = 2.0, max_rows: int = MAX_GRADED_ROWS
) -> bool:
    """True when ``predicted_sql`` returns the same result as ``gold_sql`` on ``db_path``.

    Raises ``GoldQueryError`` when the gold query itself fails; a failing prediction is simply not a match.
    """
    gold = gold_result(db_path, gold_sql, timeout_s, max_rows)
    pred = run_for_grading(db_path, predicted_sql, timeout_s, max_rows)
    return pred.ok and results_match(gold, pred, ordered=has_top_level_order_by(gold_sql))
