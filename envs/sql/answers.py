"""Tasks graded by their answer: the rows a right query returns, stored with the task instead of a gold query.

Learning from denotations: a question may come with a checkable answer but no program that produces it. Such a
task carries ``answer``, a JSON text ``{"columns": k, "rows": [[...], ...], "ordered": bool}``, and an empty
``gold_sql``; a reply matches when its query's result equals those rows under ``envs.sql.match``'s rules
(rows in order only when ``ordered``). It has no demonstration, so a warm start skips it and GRPO alone learns
from it. ``reference(task)`` is what every grader compares with: the gold query's result when the task has
one, else its answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from envs.sql.match import gold_result, has_top_level_order_by
from envs.sql.sandbox import QueryResult

ANSWER = "answer"  # the task key of an answer's JSON text ("" or absent: the task has a gold query)


def _is_cell(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, int | str)


def encode_answer(rows: Sequence[Sequence[Any]], num_columns: int, ordered: bool) -> str:
    """An answer's JSON text; raises ValueError (naming the cell) for rows that are not a table of numbers,
    strings and NULLs with ``num_columns`` cells each (a BLOB or NaN has no faithful JSON form)."""
    if isinstance(num_columns, bool) or not isinstance(num_columns, int) or num_columns < 1:
        raise ValueError(f"an answer needs at least one column, got {num_columns!r}")
    for i, row in enumerate(rows):
        if isinstance(row, str | bytes) or not isinstance(row, Sequence) or len(row) != num_columns:
            raise ValueError(f"answer row {i} is {row!r}: each row must be a list of {num_columns} cell(s)")
        for value in row:
            if not _is_cell(value):
                raise ValueError(f"answer row {i} holds {value!r}: a cell must be a number, a string or null")
    return json.dumps({"columns": num_columns, "rows": [list(row) for row in rows], "ordered": bool(ordered)})


@lru_cache(maxsize=4096)
def answer_result(answer: str) -> tuple[QueryResult, bool]:
    """The result an answer's JSON text stands for, as the sandbox would return it, and whether its row order
    counts."""
    data = json.loads(answer)
    columns = tuple(f"column{i + 1}" for i in range(data["columns"]))
    return QueryResult(True, columns, [tuple(row) for row in data["rows"]]), bool(data["ordered"])


def has_gold_sql(task: Mapping[str, Any]) -> bool:
    """True when the task carries a gold query (it can be demonstrated), False when only its answer."""
    return bool(str(task.get("gold_sql") or "").strip())


def reference(task: Mapping[str, Any], timeout_s: float = 2.0) -> tuple[QueryResult, bool]:
    """What a reply's result must equal, and whether its row order counts: the gold query's (cached) result
    and its top-level ORDER BY, or the task's answer when it has no gold query."""
    if has_gold_sql(task):
        gold_sql = task["gold_sql"]
        return gold_result(task["db_path"], gold_sql, timeout_s), has_top_level_order_by(gold_sql)
    return answer_result(task[ANSWER])


def answer_of_gold(db_path: str, gold_sql: str, timeout_s: float = 2.0) -> str:
    """The answer a gold query gives on its database, as an answer's JSON text (raises ``GoldQueryError``
    when the query fails, ValueError when its result has no JSON form)."""
    result = gold_result(db_path, gold_sql, timeout_s)
    return encode_answer(result.rows, len(result.columns), has_top_level_order_by(gold_sql))
