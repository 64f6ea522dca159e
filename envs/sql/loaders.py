"""Spider- and BIRD-format text-to-SQL data from a local directory, as ``datasets.Dataset`` rows.

Layout: ``<root>/<tables_file>``, ``<root>/<questions_file>``, ``<root>/<db_subdir>/<db_id>/<db_id>.sqlite``.
Rows carry the built-in generator's columns. A malformed row is skipped with a warning that names it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from datasets import Dataset

from envs.sql.prompts import render_schema

logger = logging.getLogger(__name__)

_BIRD_DIFFICULTY = {"simple": "easy", "moderate": "medium", "challenging": "hard"}
_FAMILY_DIFFICULTY = {
    "filter": "easy",
    "aggregate": "easy",
    "order_limit": "easy",
    "group_having": "medium",
    "join2": "medium",
    "join3": "hard",
    "nested": "hard",
    "set_ops": "hard",
}


def sql_family(sql: str) -> str:
    """The generator family whose features ``sql`` shows, checked from the most to the least complex."""
    text = " " + re.sub(r"\s+", " ", sql.lower()) + " "
    if re.search(r"\b(union|intersect|except)\b", text):
        return "set_ops"
    if re.search(r"\(\s*select\b", text):
        return "nested"
    num_joins = len(re.findall(r"\bjoin\b", text))
    if num_joins >= 2:
        return "join3"
    if num_joins == 1:
        return "join2"
    if " group by " in text:
        return "group_having"
    if " order by " in text:
        return "order_limit"
    if re.search(r"\b(count|avg|sum|min|max)\s*\(", text):
        return "aggregate"
    return "filter"


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; check the dataset root and file names")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc


def _db_ids(tables_path: str) -> set[str]:
    tables = _read_json(tables_path)
    if not isinstance(tables, list) or not all(isinstance(t, dict) and "db_id" in t for t in tables):
        raise ValueError(f"{tables_path} must be a JSON list of objects with a 'db_id' each")
    return {t["db_id"] for t in tables}


def _problem(row: Any, sql_key: str, db_ids: set[str]) -> str | None:
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    for key in ("db_id", "question", sql_key):
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"missing or empty {key!r}"
    if row["db_id"] not in db_ids:
        return f"db_id {row['db_id']!r} is not in the tables file"
    return None


def _load(
    root: str, questions_file: str, tables_file: str, db_subdir: str, sql_key: str, source: str
) -> Dataset:
    db_ids = _db_ids(os.path.join(root, tables_file))
    questions_path = os.path.join(root, questions_file)
    rows = _read_json(questions_path)
    if not isinstance(rows, list):
        raise ValueError(f"{questions_path} must be a JSON list of question objects")
    tasks, num_skipped = [], 0
    for index, row in enumerate(rows):
        problem = _problem(row, sql_key, db_ids)
        if problem:
            num_skipped += 1
            logger.warning("skipping row %d of %s: %s", index, questions_path, problem)
            continue
        db_id = row["db_id"]
        db_path = os.path.join(root, db_subdir, db_id, f"{db_id}.sqlite")
        if not os.path.isfile(db_path):
            raise FileNotFoundError(
                f"database file for db_id {db_id!r} not found: {db_path}. Expected "
                f"<root>/{db_subdir}/<db_id>/<db_id>.sqlite; pass db_subdir= if your layout differs"
            )
        family = sql_family(row[sql_key])
        difficulty = _BIRD_DIFFICULTY.get(row.get("difficulty"), _FAMILY_DIFFICULTY[family])
        tasks.append(
            {
                "question": row["question"].strip(),
                "db_id": db_id,
                "db_path": db_path,
                "gold_sql": row[sql_key].strip(),
                "family": family,
                "difficulty": difficulty,
                "schema": render_schema(db_path),
                "evidence": str(row.get("evidence") or ""),
                "source": source,
            }
        )
    if num_skipped:
        logger.warning("skipped %d malformed rows of %d in %s", num_skipped, len(rows), questions_path)
    return Dataset.from_list(tasks)


def load_spider(
    root: str, questions_file: str = "dev.json", tables_file: str = "tables.json", db_subdir: str = "database"
) -> Dataset:
    """Spider-format questions (``db_id``, ``question``, ``query``) with their SQLite databases."""
    return _load(root, questions_file, tables_file, db_subdir, "query", "spider")


def load_bird(
    root: str, questions_file: str = "dev.json", tables_file: str = "tables.json", db_subdir: str = "database"
) -> Dataset:
    """BIRD-format rows (``db_id``, ``question``, ``SQL``, ``evidence``, ``difficulty``) and databases."""
    return _load(root, questions_file, tables_file, db_subdir, "SQL", "bird")
