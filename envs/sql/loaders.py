"""Spider and BIRD from their official releases in a local directory, as train and test ``datasets`` splits.

Spider (``root``: the unzipped ``spider`` folder)::

    train_spider.json, train_others.json (optional), dev.json (optional), tables.json,
    database/<db_id>/<db_id>.sqlite

BIRD (``root``: the folder that holds the unzipped ``train`` and ``dev`` parts)::

    train/train.json, train/train_tables.json, train/train_databases/<db_id>/<db_id>.sqlite
    dev/dev.json, dev/dev_tables.json, dev/dev_databases/<db_id>/<db_id>.sqlite  (optional)

The release's dev questions are the test split: their databases are not among the training ones. Without
them the training questions are split by database (``split_by_database``), so that a held-out score, as on
the dev sets, measures databases the model never trained on. Rows carry the built-in generator's columns; a
malformed row is skipped with a warning that names it.

Learning from answers (``envs.sql.answers``): a question row may give ``answer`` (its expected result rows, a
list of lists, with ``ordered: true`` when their order counts) instead of a query, and ``labelled_fraction``
keeps the gold query of only that share of the training questions (drawn by ``split_seed``), replacing the
rest's by the answer it returns: one folder then gives the regime of a few labelled programs and many checked
answers. A task without a gold query has no demonstration, and no family or difficulty label ("unknown"),
since both are read from the query. The test split keeps its gold queries.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from dataclasses import dataclass
from typing import Any

from datasets import Dataset, DatasetDict

from envs.sql.answers import ANSWER, answer_of_gold, encode_answer
from envs.sql.match import GoldQueryError
from envs.sql.prompts import render_schema

logger = logging.getLogger(__name__)

_BIRD_DIFFICULTY = {"simple": "easy", "moderate": "medium", "challenging": "hard"}
UNKNOWN = "unknown"  # the family and difficulty of a question known only by its answer
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


@dataclass(frozen=True, slots=True)
class _Part:
    """One questions file of a release, the tables file that lists its databases, and where they lie."""

    questions: str
    tables: str
    db_dir: str  # holds <db_id>/<db_id>.sqlite


def spider_tasks(
    root: str, test_fraction: float = 0.1, split_seed: int = 0, labelled_fraction: float = 1.0
) -> DatasetDict:
    """Spider's questions: ``train_spider.json`` and ``train_others.json`` are train, ``dev.json`` is test.

    Without a ``dev.json`` the training questions are split with ``split_by_database(test_fraction,
    split_seed)``; with one, those two arguments are only checked. ``labelled_fraction`` < 1 keeps the gold
    query of that share of the training questions and gives the rest their answers (``hide_gold``).
    """
    _check_root(root, "the unzipped Spider folder (train_spider.json, tables.json, database/)")

    def part(questions_file: str) -> _Part:
        return _Part(
            os.path.join(root, questions_file),
            os.path.join(root, "tables.json"),
            os.path.join(root, "database"),
        )

    train = [part("train_spider.json")] + [
        p for p in [part("train_others.json")] if os.path.isfile(p.questions)
    ]
    return _task_splits(
        train, part("dev.json"), "query", "spider", test_fraction, split_seed, labelled_fraction
    )


def bird_tasks(
    root: str,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    dev_dir: str = "dev",
    labelled_fraction: float = 1.0,
) -> DatasetDict:
    """BIRD's questions (with their ``evidence`` hints): ``train/train.json`` is train, ``<dev_dir>/dev.json``
    is test (``dev_dir``: the unzipped dev part, which recent releases name ``dev_<date>``).

    Without the dev part the training questions are split with ``split_by_database(test_fraction,
    split_seed)``; with it, those two arguments are only checked. ``labelled_fraction``: as in
    ``spider_tasks``.
    """
    _check_root(root, "the folder holding BIRD's unzipped train/ (and dev/) parts")

    def part(name: str, subdir: str) -> _Part:
        directory = os.path.join(root, subdir)
        return _Part(
            os.path.join(directory, f"{name}.json"),
            os.path.join(directory, f"{name}_tables.json"),
            os.path.join(directory, f"{name}_databases"),
        )

    return _task_splits(
        [part("train", "train")],
        part("dev", dev_dir),
        "SQL",
        "bird",
        test_fraction,
        split_seed,
        labelled_fraction,
    )


def split_by_database(
    tasks: list[dict[str, Any]], test_fraction: float, split_seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``tasks`` as (train, test) with no ``db_id`` on both sides, each in the order the rows came.

    The rule: shuffle the sorted db_ids with ``random.Random(split_seed)``, then move whole databases, in that
    order, into test until it holds at least ``test_fraction`` of the rows. The rest is train; a split that
    leaves it empty is refused.
    """
    _check_split_args(test_fraction, split_seed)
    if not tasks:
        raise ValueError("split_by_database got no tasks to split")
    num_rows: dict[str, int] = {}
    for task in tasks:
        num_rows[task["db_id"]] = num_rows.get(task["db_id"], 0) + 1
    order = sorted(num_rows)
    random.Random(split_seed).shuffle(order)
    test_dbs: set[str] = set()
    num_test = 0
    for db_id in order:
        if num_test / len(tasks) >= test_fraction:
            break
        test_dbs.add(db_id)
        num_test += num_rows[db_id]
    if num_test == len(tasks):
        raise ValueError(
            f"test_fraction={test_fraction} moves all {len(order)} database(s) into the test split and "
            "leaves train empty: lower test_fraction (a split by database needs at least 2 databases), or "
            "give the release's dev part as the test split"
        )
    train = [task for task in tasks if task["db_id"] not in test_dbs]
    return train, [task for task in tasks if task["db_id"] in test_dbs]


def hide_gold(tasks: list[dict[str, Any]], labelled_fraction: float, seed: int) -> list[dict[str, Any]]:
    """``tasks`` with the gold query of only ``round(labelled_fraction * len(tasks))`` of them kept (drawn
    with ``random.Random(seed)``); each other task gets the answer its gold query returns instead, and loses
    the query, its family and its difficulty. A task whose gold query fails, or whose result has no JSON form,
    is dropped with a warning naming it. Order is kept."""
    _check_labelled_fraction(labelled_fraction)
    if labelled_fraction == 1:
        return list(tasks)
    order = list(range(len(tasks)))
    random.Random(seed).shuffle(order)
    labelled = set(order[: round(labelled_fraction * len(tasks))])
    kept = []
    for index, task in enumerate(tasks):
        if index in labelled:
            kept.append(task)
            continue
        try:
            answer = answer_of_gold(task["db_path"], task["gold_sql"])
        except (GoldQueryError, ValueError) as exc:
            logger.warning("dropping %r on %s: no answer for it (%s)", task["question"], task["db_id"], exc)
            continue
        kept.append({**task, "gold_sql": "", ANSWER: answer, "family": UNKNOWN, "difficulty": UNKNOWN})
    logger.info(
        "labelled_fraction=%s: %d of %d training questions keep their gold query, %d have their answer",
        labelled_fraction,
        len(labelled),
        len(tasks),
        len(kept) - len(labelled),
    )
    return kept


def _task_splits(
    train_parts: list[_Part],
    dev: _Part,
    sql_key: str,
    source: str,
    test_fraction: float,
    split_seed: int,
    labelled_fraction: float,
) -> DatasetDict:
    _check_split_args(test_fraction, split_seed)
    _check_labelled_fraction(labelled_fraction)
    train = [task for part in train_parts for task in _read_tasks(part, sql_key, source)]
    if not train:
        raise ValueError(
            f"{', '.join(p.questions for p in train_parts)}: no usable questions (see the warnings)"
        )
    if os.path.isfile(dev.questions):
        test = _read_tasks(dev, sql_key, source)
        if not test:
            raise ValueError(f"{dev.questions}: no usable questions (see the warnings) for the test split")
        _check_disjoint(train, test, dev.questions)
    else:
        train, test = split_by_database(train, test_fraction, split_seed)
        logger.info(
            "%s: no %s, so the test split is %d database(s) of the training files, %d of %d questions "
            "(split_by_database, test_fraction=%s, split_seed=%d)",
            source,
            dev.questions,
            len({t["db_id"] for t in test}),
            len(test),
            len(train) + len(test),
            test_fraction,
            split_seed,
        )
    train = hide_gold(train, labelled_fraction, split_seed)
    return DatasetDict(train=Dataset.from_list(train), test=Dataset.from_list(test))


def _check_labelled_fraction(labelled_fraction: Any) -> None:
    if isinstance(labelled_fraction, bool) or not isinstance(labelled_fraction, int | float):
        raise ValueError(f"labelled_fraction={labelled_fraction!r}: use a number in [0, 1]")
    if not 0 <= labelled_fraction <= 1:
        raise ValueError(
            f"labelled_fraction={labelled_fraction!r}: use a number in [0, 1], the share of the training "
            "questions that keep their gold query (1 keeps all)"
        )


def _check_root(root: Any, expected: str) -> None:
    if not isinstance(root, str | os.PathLike) or not os.path.isdir(root):
        raise FileNotFoundError(f"the dataset root {root!r} is not a directory: pass {expected}")


def _check_split_args(test_fraction: Any, split_seed: Any) -> None:
    if (
        isinstance(test_fraction, bool)
        or not isinstance(test_fraction, int | float)
        or not 0 < test_fraction < 1
    ):
        raise ValueError(
            f"test_fraction={test_fraction!r}: use a number strictly between 0 and 1, the least share of the "
            "questions whose databases go to the test split (e.g. 0.1)"
        )
    if isinstance(split_seed, bool) or not isinstance(split_seed, int):
        raise ValueError(f"split_seed={split_seed!r}: use an integer (the same seed gives the same split)")


def _check_disjoint(train: list[dict[str, Any]], test: list[dict[str, Any]], dev_questions: str) -> None:
    shared = sorted({t["db_id"] for t in train} & {t["db_id"] for t in test})
    if shared:
        raise ValueError(
            f"{dev_questions} asks about {len(shared)} database(s) the training questions use too "
            f"({', '.join(map(repr, shared[:5]))}); a held-out score must come from unseen databases: drop "
            "those rows, or remove the dev file to split the training questions by database"
        )


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
    keys = ("db_id", "question") if ANSWER in row and sql_key not in row else ("db_id", "question", sql_key)
    for key in keys:
        if not isinstance(row.get(key), str) or not row[key].strip():
            return f"missing or empty {key!r}"
    if row["db_id"] not in db_ids:
        return f"db_id {row['db_id']!r} is not in the tables file"
    return None


def _row_answer(row: dict[str, Any]) -> str:
    """The answer's JSON text of a row that gives ``answer`` (its result rows) instead of a query."""
    rows = row[ANSWER]
    if not isinstance(rows, list) or not rows or not isinstance(rows[0], list):
        raise ValueError(
            f"'answer' must be a non-empty list of rows (lists of cells), got {rows!r}: an empty answer "
            "would match any query that returns nothing"
        )
    return encode_answer(rows, len(rows[0]), row.get("ordered", False) is True)


def _read_tasks(part: _Part, sql_key: str, source: str) -> list[dict[str, Any]]:
    """The task rows of one questions file; a malformed row is skipped with a warning naming it."""
    db_ids = _db_ids(part.tables)
    rows = _read_json(part.questions)
    if not isinstance(rows, list):
        raise ValueError(f"{part.questions} must be a JSON list of question objects")
    tasks, num_skipped = [], 0
    for index, row in enumerate(rows):
        problem = _problem(row, sql_key, db_ids)
        if problem:
            num_skipped += 1
            logger.warning("skipping row %d of %s: %s", index, part.questions, problem)
            continue
        db_id = row["db_id"]
        db_path = os.path.join(part.db_dir, db_id, f"{db_id}.sqlite")
        if not os.path.isfile(db_path):
            raise FileNotFoundError(
                f"database file for db_id {db_id!r} not found: {db_path}. Expected "
                f"{part.db_dir}/<db_id>/<db_id>.sqlite: check the dataset root, and unzip the release's "
                "database archive there if it came zipped"
            )
        gold_sql, answer, family = row.get(sql_key, "").strip(), "", UNKNOWN
        default_difficulty = UNKNOWN
        if gold_sql:
            family = sql_family(gold_sql)
            default_difficulty = _FAMILY_DIFFICULTY[family]
        else:
            try:
                answer = _row_answer(row)
            except ValueError as exc:
                num_skipped += 1
                logger.warning("skipping row %d of %s: %s", index, part.questions, exc)
                continue
        tasks.append(
            {
                "question": row["question"].strip(),
                "db_id": db_id,
                "db_path": db_path,
                "gold_sql": gold_sql,
                ANSWER: answer,
                "family": family,
                "difficulty": _BIRD_DIFFICULTY.get(row.get("difficulty"), default_difficulty),
                "schema": render_schema(db_path),
                "evidence": str(row.get("evidence") or ""),
                "source": source,
            }
        )
    if num_skipped:
        logger.warning("skipped %d malformed rows of %d in %s", num_skipped, len(rows), part.questions)
    return tasks
