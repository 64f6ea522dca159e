"""The reading of one SQL query behind the schema constraint (`envs.sql.schema_constraint`): its lexemes in
order, the scopes of its FROM clauses and subqueries, and the furthest character where a name breaks a rule.
The rules themselves are the constraint's module docstring.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envs.sql.schema_constraint import SchemaNames

# The words of SQLite's SELECT statement (types come after CAST's AS, where any word may stand).
KEYWORDS = frozenset(
    """all and as asc between by case cast collate cross current_date current_time current_timestamp desc
    distinct else end escape except exists filter from full glob group groups having in inner intersect is
    isnull join left like limit match natural not notnull null nulls offset on or order outer over partition
    range regexp right rows select then union using when where window with""".split()
)
# Function names: a word that is one only is written before its "(".
FUNCTIONS = frozenset(
    """abs avg changes char coalesce concat count date datetime format glob group_concat hex ifnull iif instr
    julianday length like likelihood lower ltrim max min nullif printf quote random replace round rtrim sign
    strftime substr substring sum time total trim typeof unicode unixepoch upper zeroblob ceil ceiling floor
    ln log log10 exp power pow sqrt mod pi rank row_number dense_rank""".split()
)
ROWID = frozenset(["rowid", "oid", "_rowid_"])
# Words that end a query's FROM clause: every name its SELECT list used must have its table by then.
_CLAUSES = frozenset(["where", "group", "having", "order", "limit", "union", "intersect", "except", "window"])
# An alias a query may use before its FROM defines it: a letter or two and a number (T1, s2, a).
_ALIAS_LIKE = re.compile(r"[a-z]{1,2}\d*")
_LEXEME = re.compile(
    r"""(?P<string>'(?:[^']|'')*'?|"(?:[^"]|"")*"?)
    |(?P<quoted>`[^`]*`?|\[[^\]]*\]?)
    |(?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
    |(?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    |(?P<punct>\S)""",
    re.VERBOSE,
)
_PUNCT = frozenset("(),.*=<>!+-/%|;~&")  # what SQLite's grammar has between names (a quote opens a string)
_ANY = None  # the columns of a subquery in FROM: not checked
_LOOKAHEAD = 3  # the most characters _LEXEME reads past a lexeme's end ("1" of "1e+5" waits on "e+5")


def word_starts(words: frozenset[str]) -> frozenset[str]:
    """Every start of each of `words`, the empty one included (a quoted name just opened)."""
    return frozenset(word[:i] for word in words for i in range(len(word) + 1))


_STATIC_STARTS = word_starts(KEYWORDS | FUNCTIONS | ROWID)


@dataclass(eq=False)
class _Query:
    """One SELECT (the reply's, or a subquery) as it is read."""

    depth: int  # the parenthesis depth its SELECT stands at
    clause: str = "select"
    tables: dict[str, frozenset[str] | None] = field(default_factory=dict)  # alias (or table) -> columns
    num_tables: int = 0
    pending: list[str] = field(default_factory=list)  # unqualified columns of the SELECT list
    pending_qualified: dict[str, set[str]] = field(default_factory=dict)  # qualifier -> its columns there
    expects: str = ""  # "table": FROM wants a table; "alias": a table was named and may get an alias
    last_name: str | None = None  # the table just named in FROM, and its columns
    last_columns: frozenset[str] | None = None

    @property
    def before_from(self) -> bool:
        return self.clause == "select"

    def copy(self) -> _Query:
        return _Query(
            self.depth,
            self.clause,
            dict(self.tables),
            self.num_tables,
            list(self.pending),
            {qualifier: set(columns) for qualifier, columns in self.pending_qualified.items()},
            self.expects,
            self.last_name,
            self.last_columns,
        )


class QueryReader:
    """Reads a query's lexemes in order and notes the furthest character where a violation shows.

    A lexeme followed by _LOOKAHEAD characters more is settled: no text written after them changes it (the
    lexer looks at most that far past a lexeme, for a number's exponent), and a lexeme is read with the one
    after it, so what reading a query's settled lexemes but its last leaves depends on its text that far only.
    `read` hands that state back, and the next text that starts the same way resumes from it."""

    def __init__(self, schema: SchemaNames) -> None:
        self.schema = schema
        self.names, self.columns, self.words = schema.names, schema.columns, schema.words
        self.queries = [_Query(depth=0)]
        self.defined: set[str] = set()  # aliases of tables and of result columns, once given
        self.depth = 0
        self.after_as = False
        self.last_fail = -1  # the most characters a text has when a violation read so far shows
        self.text = ""  # the text what was read depends on
        self.pos = 0  # where the lexemes not read yet start
        self.behind: list[tuple[str, str, int, str]] = []  # the last two lexemes read, looked back at

    def copy(self) -> QueryReader:
        reader = QueryReader.__new__(QueryReader)
        reader.__dict__.update(self.__dict__)
        reader.queries = [query.copy() for query in self.queries]
        reader.defined = set(self.defined)
        return reader

    @property
    def query(self) -> _Query:
        return self.queries[-1]

    def fail(self, at: int) -> None:
        """A violation that shows once the text has `at` characters (a word's shows with the character after
        it, which completes it; the end of the query's, and its last word's, with its closing)."""
        if at > self.last_fail:
            self.last_fail = at

    def read(self, sql: str, end_at: int | None) -> QueryReader | None:
        """Read the query `sql` from where this reader left off; `end_at`: where its closing ends, None while
        the block is open. Returns the reader's state after the newly settled lexemes, its `text` the start of
        `sql` they depend on, or None when no lexeme settled."""
        complete = end_at is not None
        read = len(self.behind)
        lexemes = self.behind + [
            (m.lastgroup, m.group(), m.end(), m.group().strip("`[]").lower())
            for m in _LEXEME.finditer(sql, self.pos)
        ]
        last = len(lexemes) - 2  # the last lexeme that may settle: it and the one after it are whole
        while last >= read and lexemes[last + 1][2] + _LOOKAHEAD > len(sql):
            last -= 1
        settled = None
        for i in range(read, len(lexemes)):
            kind, text, end, name = lexemes[i]
            if kind == "punct":
                self.punct(text, end)
            elif kind in ("word", "quoted"):
                # A name is whole at the character after it, where what is wrong with it shows; the last one
                # may still grow, unless the query ended. A function's name waits for its "(" past a space.
                following = lexemes[i + 1] if i + 1 < len(lexemes) else None
                partial = end == len(sql) and not complete
                at = end if partial else (end_at if end == len(sql) else end + 1)
                if name in FUNCTIONS and sql[end : end + 1].isspace():
                    partial = following is None and not complete
                    at = len(sql) if partial else (following[2] if following else end_at)
                if i >= 2 and lexemes[i - 1][1] == "." and lexemes[i - 2][0] in ("word", "quoted"):
                    self.column_of(lexemes[i - 2][3], name, at, partial)
                elif following and following[1] == ".":
                    self.qualifier(name, following[2])
                else:
                    self.word(name, at, partial, call=bool(following) and following[1] == "(")
            if i == last:
                settled = self.copy()
                settled.text = sql[: lexemes[i + 1][2] + _LOOKAHEAD]
                settled.pos, settled.behind = end, lexemes[max(0, i - 1) : i + 1]
        if complete:
            while len(self.queries) > 1:
                self.close_from(self.query, end_at)
                self.queries.pop()
            self.close_from(self.query, end_at)
        return settled

    # scopes

    def visible(self, name: str) -> tuple[bool, frozenset[str] | None]:
        """Whether the FROM of this query or of one around it binds `name`, and to which columns."""
        for query in reversed(self.queries):
            if name in query.tables:
                return True, query.tables[name]
        return False, None

    def in_scope(self, column: str) -> bool:
        if column in self.defined or column in ROWID:
            return True
        return any(
            columns is _ANY or column in columns for q in self.queries for columns in q.tables.values()
        )

    def bind_named_table(self, query: _Query) -> None:
        """A table named in FROM without an alias is known by its own name."""
        if query.expects == "alias":
            if query.last_name is not None:
                query.tables[query.last_name] = query.last_columns
            query.expects = ""

    def close_from(self, query: _Query, at: int) -> None:
        """The FROM clause has ended: every name the SELECT list used must have its table."""
        self.bind_named_table(query)
        if query.before_from:
            return
        for qualifier, columns in query.pending_qualified.items():
            bound, table = self.visible(qualifier)
            if not bound or (table is not _ANY and not columns <= table):
                self.fail(at)
        if any(not self.in_scope(column) for column in query.pending):
            self.fail(at)
        query.pending_qualified.clear()
        query.pending.clear()

    # lexemes

    def punct(self, char: str, end: int) -> None:
        self.after_as = False
        query = self.query
        if char not in _PUNCT:
            self.fail(end)
        elif char == "(":
            self.depth += 1
        elif char == ")":
            if len(self.queries) > 1 and query.depth == self.depth:
                self.close_from(query, end)
                self.queries.pop()
                outer = self.query
                if outer.expects == "table":  # a subquery in FROM, which an alias may follow
                    outer.last_name, outer.last_columns, outer.expects = None, _ANY, "alias"
            self.depth = max(0, self.depth - 1)
        elif char == "," and query.clause == "from" and self.depth == query.depth:
            self.bind_named_table(query)
            query.expects = "table"

    def word(self, name: str, at: int, partial: bool, call: bool = False) -> None:
        query = self.query
        if name == "select":
            if query.expects == "table" or self.depth > query.depth:
                self.queries.append(_Query(depth=self.depth))
            else:  # the first SELECT, or the next one of a compound query
                self.close_from(query, at)
                self.queries[-1] = _Query(depth=query.depth)
            return
        if self.after_as:
            if not partial:
                self.after_as = False
                self.alias(name, at) if query.expects == "alias" else self.defined.add(name)
            return
        if query.expects == "table":
            self.table(name, at, partial)
            return
        if query.expects == "alias" and name not in KEYWORDS:  # an alias without AS: T1, not ORDERBY
            if not any(word.startswith(name) for word in KEYWORDS) and not _ALIAS_LIKE.fullmatch(name):
                self.fail(at)
            elif not partial:
                self.alias(name, at)
            return
        if name == "as":
            self.after_as = True
            return
        if partial:
            if not self.may_become(query, name):
                if not (query.before_from and _ALIAS_LIKE.fullmatch(name)):
                    self.fail(at)
            return
        self.keyword_or_column(query, name, at, call)

    def may_become(self, query: _Query, start: str) -> bool:
        """Whether `start` begins a word the query may write where a column could stand: before its FROM any
        name of the database, after it the columns in scope and the names FROM bound."""
        if any(word.startswith(start) for word in self.defined):
            return True
        bound = [(alias, columns) for q in self.queries for alias, columns in q.tables.items()]
        if query.before_from or any(columns is _ANY for _, columns in bound):
            return start in self.schema.starts
        if start in _STATIC_STARTS or any(alias.startswith(start) for alias, _ in bound):
            return True
        known = self.schema.column_starts
        return any(start in known[columns] for _, columns in bound)

    def keyword_or_column(self, query: _Query, name: str, at: int, call: bool) -> None:
        if name in ("from", "join"):
            self.bind_named_table(query)
            query.clause, query.expects = "from", "table"
        elif name in ("on", "using"):
            self.bind_named_table(query)
        elif name in _CLAUSES:
            self.close_from(query, at)
            query.clause = name
        elif name in KEYWORDS or name in self.defined or (call and name in FUNCTIONS):
            self.bind_named_table(query)
        elif name not in self.columns:
            self.fail(at)
        elif query.before_from:
            query.pending.append(name)
        elif not self.in_scope(name):
            self.fail(at)

    def table(self, name: str, at: int, partial: bool) -> None:
        query = self.query
        fitting = self.fitting_tables(query)
        if partial:
            subquery = self.depth > query.depth and "select".startswith(name)
            if not subquery and not any(table.startswith(name) for table in fitting):
                self.fail(at)
            return
        columns = self.names.get(name, _ANY)
        if name not in fitting:
            self.fail(at)
        query.num_tables += 1
        query.last_name, query.last_columns, query.expects = name, columns, "alias"

    def fitting_tables(self, query: _Query) -> list[str]:
        """The tables FROM may name next. A query's first table must hold the columns its SELECT list named
        without a qualifier, when it named no qualified ones: all of them where a table does, else one."""
        if query.num_tables or not query.pending or query.pending_qualified:
            return list(self.names)
        wanted = set(query.pending)
        holding_all = [table for table, columns in self.names.items() if wanted <= columns]
        return holding_all or [
            table for table, columns in self.names.items() if not wanted.isdisjoint(columns)
        ]

    def alias(self, name: str, at: int) -> None:
        query = self.query
        wanted = query.pending_qualified.get(name, set())
        if query.last_columns is not _ANY and not wanted <= query.last_columns:
            self.fail(at)
        query.tables[name] = query.last_columns
        query.expects = ""
        self.defined.add(name)

    def qualifier(self, name: str, dot_end: int) -> None:
        if self.visible(name)[0]:
            return
        if not self.query.before_from or not (name in self.names or _ALIAS_LIKE.fullmatch(name)):
            self.fail(dot_end)

    def column_of(self, qualifier: str, name: str, at: int, partial: bool) -> None:
        query = self.query
        bound, columns = self.visible(qualifier)
        if bound and columns is _ANY:
            return
        if not bound and not query.before_from:
            return  # the qualifier itself was the violation
        known = columns if bound else self.names.get(qualifier, self.columns)
        if partial:
            if not any(column.startswith(name) for column in known | ROWID):
                self.fail(at)
        elif name not in known and name not in ROWID:
            self.fail(at)
        elif not bound:
            query.pending_qualified.setdefault(qualifier, set()).add(name)
