"""Schema rendering, chat prompts, SQL extraction from model output, and result observations.

Extraction order (``extract_sql``), from most to least explicit:
1. the last ``<answer>...</answer>`` block (a ```sql fence inside it is unwrapped);
2. the last ```sql fenced block, else the last plain ``` fence whose body starts like SQL;
3. bare SQL: the last line that starts with SELECT or WITH, up to the first semicolon or blank line.
The last candidate wins because models often draft a query, reason about it, and then give the final one.
An opening tag or fence that is never closed runs to the end of the text (generation may stop on the closer).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from envs.sql.sandbox import QueryResult, execute

_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_BARE = re.compile(
    r"^[ \t>*`-]*((?:SELECT|WITH)\b.*?)(?:;|\n[ \t]*\n|\Z)", re.DOTALL | re.IGNORECASE | re.MULTILINE
)
_STARTS_LIKE_SQL = re.compile(r"\s*(SELECT|WITH)\b", re.IGNORECASE)

SINGLE_TURN_INSTRUCTIONS = (
    "You are an expert SQLite assistant. Given a database schema and a question, write one SQLite query that "
    "answers the question. Return only the query inside a ```sql code block."
)


def _clean(sql: str) -> str | None:
    sql = sql.strip().strip("`").strip()
    sql = sql.rstrip(";").strip()
    return sql or None


def _last_fenced(text: str) -> str | None:
    fences = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    for lang, body in reversed(fences):
        if lang == "sql" or (lang == "" and _STARTS_LIKE_SQL.match(body)):
            return _clean(body)
    return None


def extract_sql(text: str) -> str | None:
    """The SQL query a model meant as its answer, or None when there is none (see the module docstring)."""
    answers = _ANSWER.findall(text)
    if answers:
        body = answers[-1]
        return _last_fenced(body) or _clean(body)
    fenced = _last_fenced(text)
    if fenced:
        return fenced
    bare = _BARE.findall(text)
    return _clean(bare[-1]) if bare else None


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


SCHEMA_STYLES = ("ddl", "compact")


def check_schema_style(schema_style: Any) -> None:
    """Refuse a schema style the SQL envs cannot render."""
    if schema_style not in SCHEMA_STYLES:
        raise ValueError(
            f"schema_style={schema_style!r} is not a schema style: use one of {list(SCHEMA_STYLES)}"
        )


def _compact_type(declared: str) -> str:
    """A column's declared type as the kind a query cares about: text, number or date (else as declared)."""
    kind = declared.lower()
    if any(word in kind for word in ("date", "time", "year")):
        return "date"
    if any(word in kind for word in ("char", "text", "clob", "string")):
        return "text"
    if any(word in kind for word in ("int", "real", "num", "float", "double", "dec", "bool", "money")):
        return "number"
    return kind


def _compact_table(db_path: str, name: str) -> str:
    """One line for a table: ``Name(column type [pk] [-> Table.column], ...)``."""
    literal = "'" + name.replace("'", "''") + "'"
    columns = execute(db_path, f"SELECT name, type, pk FROM pragma_table_info({literal})")
    keys = execute(db_path, f'SELECT "from", "table", "to" FROM pragma_foreign_key_list({literal})')
    if not columns.ok or not keys.ok:
        raise ValueError(f"cannot read the columns of {name} in {db_path}: {columns.error or keys.error}")
    references = {source: f"{target}.{column}" if column else target for source, target, column in keys.rows}
    parts = []
    for column, declared, pk in columns.rows:
        part = f"{column} {_compact_type(declared)}".rstrip()
        if pk:
            part += " pk"
        if column in references:
            part += f" -> {references[column]}"
        parts.append(part)
    return f"{name}({', '.join(parts)})"


@lru_cache(maxsize=256)
def render_schema(db_path: str, sample_rows: int = 0, style: str = "ddl") -> str:
    """Every table of the database, each optionally followed by a few sample rows in a comment.

    ``ddl``: its CREATE TABLE statement as the database holds it. ``compact``: one line a table, each column
    with its kind (text, number, date), ``pk`` on primary-key columns and ``-> Table.column`` on foreign keys;
    about 2.5x fewer tokens than Spider's CREATE statements, whose padding and constraint clauses repeat what
    the line says once.
    """
    tables = execute(
        db_path,
        "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY rowid",
    )
    if not tables.ok:
        raise ValueError(f"cannot read the schema of {db_path}: {tables.error}")
    parts = []
    for name, ddl in tables.rows:
        parts.append(ddl.strip() + ";" if style == "ddl" else _compact_table(db_path, name))
        if sample_rows > 0:
            sample = execute(db_path, f"SELECT * FROM {_quote_identifier(name)} LIMIT {int(sample_rows)}")
            if sample.ok and sample.rows:
                lines = [" | ".join(sample.columns)] + [" | ".join(map(str, row)) for row in sample.rows]
                parts.append(f"/* {len(sample.rows)} sample rows from {name}:\n" + "\n".join(lines) + "\n*/")
    return ("\n\n" if style == "ddl" else "\n").join(parts)


def sql_messages(schema: str, question: str, instructions: str, evidence: str = "") -> list[dict[str, str]]:
    """An episode's first chat messages: instructions as system turn, schema and question as user turn."""
    user = f"Database schema:\n{schema}\n\n"
    if evidence:
        user += f"Hint: {evidence}\n\n"
    user += f"Question: {question}"
    return [{"role": "system", "content": instructions}, {"role": "user", "content": user}]


def format_result(result: QueryResult, max_rows: int = 10, max_chars: int = 1000) -> str:
    """Render a query result (or its error) as compact text for an observation."""
    if not result.ok:
        return f"Error: {result.error}"
    if not result.rows:
        return "(no rows) columns: " + ", ".join(result.columns)
    lines = [" | ".join(result.columns)] + [" | ".join(map(str, row)) for row in result.rows[:max_rows]]
    text = "\n".join(lines)
    hidden = len(result.rows) - max_rows
    if len(text) > max_chars:
        text = text[:max_chars] + " ..."
    if hidden > 0 or result.truncated:
        text += f"\n... ({'more than ' if result.truncated else ''}{len(result.rows)} rows in total)"
    return text


_REQUIRED_TASK_KEYS = ("question", "db_path")


def check_sql_task(task: Mapping[str, Any]) -> None:
    """Refuse a row an SQL env cannot play: ``question`` or ``db_path`` missing or not a non-empty string,
    no database file, or neither a ``gold_sql`` nor an ``answer`` (``envs.sql.answers``) to grade against.

    A row's ``schema`` only describes the database; grading runs queries against ``db_path``, so without
    the file every completion would score as failed SQL.
    """
    missing = [key for key in _REQUIRED_TASK_KEYS if key not in task]
    if missing:
        raise ValueError(
            f"task row lacks {missing}; SQL tasks need the keys {list(_REQUIRED_TASK_KEYS)} and a 'gold_sql' "
            "or an 'answer'"
        )
    for key in _REQUIRED_TASK_KEYS:
        if not isinstance(task[key], str) or not task[key].strip():
            raise ValueError(f"the task's {key!r} is {task[key]!r}; it must be a non-empty string")
    if not any(isinstance(task.get(key), str) and task[key].strip() for key in ("gold_sql", "answer")):
        raise ValueError(
            f"the task {task['question']!r} has neither a 'gold_sql' nor an 'answer' (each must be a "
            "non-empty string): give the gold query, or the expected result rows as "
            "envs.sql.answers.encode_answer writes them"
        )
    if not os.path.isfile(task["db_path"]):
        raise ValueError(
            f"the task's database db_path={task['db_path']!r} does not exist; queries are graded by running "
            "them on it (a 'schema' alone is not enough): fix the path, or regenerate the tasks"
        )


def task_messages(
    task: Mapping[str, Any], instructions: str, sample_rows: int = 0, schema_style: str = "ddl"
) -> list[dict[str, str]]:
    """Chat messages for a task row (checked by ``check_sql_task``). Its ``schema`` text serves the ``ddl``
    style without sample rows; otherwise the schema is rendered from the database in ``schema_style``."""
    check_sql_task(task)
    schema = task.get("schema") if sample_rows == 0 and schema_style == "ddl" else None
    if not schema:
        schema = render_schema(task["db_path"], sample_rows, schema_style)
    return sql_messages(schema, task["question"], instructions, task.get("evidence") or "")
