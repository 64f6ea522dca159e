"""Schema-constrained decoding of SQL replies: every name a query uses must exist where it is used.

A small model writes columns that its database has in another table, or nowhere: after its warm start on real
questions, six in ten of SmolLM2-135M's failed answers named an unknown column or table. PICARD (Scholak et
al., 2021) answered this by parsing each candidate token incrementally and dropping those that cannot lead to
valid SQL; `SchemaNames` does the part of that which concerns names. The engine asks it about each row's
likeliest tokens (`rollout_engine.constraints`) and samples among those it accepts.

What a reply may write, read from the text of its SQL block (```sql ... ```, or the multi-turn env's <sql> and
<answer> tags: `SQL_FENCE`, `SQL_TAGS`) with string literals skipped:
- a word is an SQL keyword or function, a table, a column or an alias the query defined; a word still being
  written is the start of one (or, before the query's FROM, of a short alias such as T1 that FROM defines);
- FROM, JOIN and a comma in the FROM clause are followed by a table of the database (or a subquery);
- in `Q.c`, c is a column of the table Q names. Before FROM binds Q, c must be a column of some table, and the
  alias Q may then be given only to a table that has all such columns;
- after the FROM clause, an unqualified column belongs to one of the query's tables (or an enclosing query's);
  the ones the SELECT list used before it must all have found their table when the FROM clause ends, and the
  first table of a query whose SELECT list used no qualified names must hold one of them.
Only a block that starts with SELECT is checked (not WITH, nor an exploring PRAGMA). Only what the newest
token changes counts (`start`), so a reply that the engine had to let through once (every likely token
vetoed) is not held up for the rest of its length.
"""

from __future__ import annotations

import re
from functools import lru_cache

from envs.sql.query_reader import FUNCTIONS, KEYWORDS, ROWID, QueryReader, word_starts
from envs.sql.sandbox import execute

_LONG_SPACE = re.compile(r"[ \t]{4,}|\s*\n\s*\n")  # Spider writes "a  =  b", now and then with three
# Where a reply's query starts and ends: a fenced block, or the multi-turn env's tags (closings lower-case).
SQL_FENCE = (re.compile(r"```sql[ \t]*\n", re.IGNORECASE), ("```",))
SQL_TAGS = (re.compile(r"<(?:sql|answer)>", re.IGNORECASE), ("</sql>", "</answer>"))
# A block that is checked: it starts with SELECT, or with what may still become it.
_SELECT_START = re.compile(r"\s*(?:select\b|s(?:e(?:l(?:e(?:c(?:t)?)?)?)?)?\Z|\Z)", re.IGNORECASE)
_MAX_SETTLED = 32  # the starts of queries one constraint keeps what reading them left (a group's rows)


@lru_cache(maxsize=256)
def schema_names(db_path: str) -> dict[str, frozenset[str]]:
    """The database's tables and views, lower-case, with their columns, lower-case."""
    tables = execute(db_path, "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
    if not tables.ok:
        raise ValueError(f"cannot read the schema of {db_path}: {tables.error}")
    names = {}
    for (table,) in tables.rows:
        literal = "'" + table.replace("'", "''") + "'"
        columns = execute(db_path, f"SELECT name FROM pragma_table_info({literal})")
        if not columns.ok:
            raise ValueError(f"cannot read the columns of {table} in {db_path}: {columns.error}")
        names[table.lower()] = frozenset(column.lower() for (column,) in columns.rows)
    return names


class SchemaNames:
    """The engine's constraint (`rollout_engine.constraints.Constraint`) on the replies to one database's
    questions. `lead` is the reply's start that the prompt already holds (the env's response prefix);
    `block` is where the query stands in a reply (`SQL_FENCE` or `SQL_TAGS`)."""

    def __init__(self, names: dict[str, frozenset[str]], lead: str = "", block: tuple = SQL_FENCE) -> None:
        self.names = names
        self.lead = lead
        self.opening, self.closings = block
        self.closing_starts = frozenset(c[:i] for c in self.closings for i in range(1, len(c)))
        self.columns = frozenset().union(*names.values()) | ROWID
        self.words = KEYWORDS | FUNCTIONS | self.columns | frozenset(names)
        self.starts = word_starts(self.words)  # every start of a word, for the word still being written
        # every start of each table's columns, by the table's columns
        self.column_starts = {columns: word_starts(columns) for columns in names.values()}
        # What reading the settled starts of recent queries left (`QueryReader.read`), the latest used last.
        self._settled: dict[str, QueryReader] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_settled": {}}  # what was read stays with this process

    def accepts(self, text: str, start: int) -> bool:
        """Whether the reply `text` breaks no rule (module docstring) at or after its character `start`."""
        full = self.lead + text
        opening = self.opening.search(full)
        if opening is None:
            return True
        rest = full[opening.end() :]
        lowered = rest.lower()
        closed = [(i, len(closing)) for closing in self.closings if (i := lowered.find(closing)) >= 0]
        if closed:
            cut, size = min(closed)
            sql, end_at = rest[:cut], cut + size
        else:
            sql, end_at = _unclosed(rest, self.closing_starts), None
        if not _SELECT_START.match(sql):
            return True
        reader = self._resumed(sql)
        settled = reader.read(sql, end_at)
        if settled is not None and settled.text not in self._settled:
            if len(self._settled) >= _MAX_SETTLED:
                del self._settled[next(iter(self._settled))]
            self._settled[settled.text] = settled
        padding = max((run.end() for run in _LONG_SPACE.finditer(sql)), default=-1)  # no way around a veto
        return max(reader.last_fail, padding) <= len(self.lead) + start - opening.end()

    def _resumed(self, sql: str) -> QueryReader:
        """A reader of `sql` that starts where reading a recent start of it left off (a row's own latest
        one, in the engine, which asks about a row's candidates one after another)."""
        for text, reader in reversed(self._settled.items()):
            if sql.startswith(text):
                self._settled[text] = self._settled.pop(text)  # the latest used last
                return reader.copy()
        return QueryReader(self)


def _unclosed(sql: str, closing_starts: frozenset[str]) -> str:
    """The query of a block not closed yet, less an end that may be the start of its closing (one of
    `closing_starts`, lower-case)."""
    for size in range(min(len(sql), max(map(len, closing_starts), default=0)), 0, -1):
        if sql[-size:].lower() in closing_starts:
            return sql[:-size]
    return sql
