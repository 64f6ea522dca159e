"""Read-only, time- and memory-bounded execution of untrusted SQL against SQLite files.

What holds whatever the SQL:

- **No writes, no files.** Each query runs on a connection opened with a ``mode=ro`` URI, with
  ``PRAGMA query_only`` set and an authorizer that allows only reads: writes, ATTACH/DETACH, PRAGMA changes,
  ``load_extension`` and schema or trigger changes are denied. The read-only table-valued functions
  ``json_each``, ``json_tree`` and ``pragma_table_info`` (and the other schema pragmas) work: the connection
  declares them once before the authorizer is set, and every other virtual table stays denied. Large sorts
  may spill into SQLite's own temporary files, which are deleted as they are opened.
- **Time.** A watchdog thread interrupts a query at its deadline. SQLite notices an interrupt between two VM
  operations, not inside one, so the longest single operation is bounded as well: a value holds at most
  ``MAX_VALUE_BYTES`` and a LIKE/GLOB pattern ``MAX_PATTERN_BYTES``, which keeps the quadratic built-ins
  (``trim`` with a long character set, LIKE, GLOB, ``instr``, ``replace``) to about 0.3 s of CPU each.
  A longer value, stored or computed, fails the query with "string or blob too big".
- **Memory.** Rows are fetched one by one and counted (``sys.getsizeof``) against ``MAX_RESULT_BYTES``,
  whatever the caller's ``max_chars``; a result set has at most ``MAX_RESULT_COLUMNS`` columns, so one row
  stays small too; and at most ``MAX_RUNNING_QUERIES`` queries run at once in the process (the rest wait
  for a slot before their clock starts), which bounds what all threads hold together.

Bad limits (a NaN or infinite timeout, a negative row cap) raise ``ValueError`` at once; everything the
SQL does comes back as a ``QueryResult``. Connections are cached per thread, so a thread pool can run many
rollouts' queries at once (sqlite3 releases the GIL while a statement runs).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from numbers import Integral, Real

MAX_VALUE_BYTES = 32_768
MAX_PATTERN_BYTES = 1_000
MAX_RESULT_COLUMNS = 256
MAX_RESULT_BYTES = 16 << 20
MAX_RUNNING_QUERIES = 8

_TIMEOUT_S, _MAX_ROWS, _MAX_CHARS = 2.0, 1000, 100_000
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# Pragmas that only describe the schema; a model exploring a database may use them.
_READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
# Declaring an eponymous virtual table looks to the authorizer like a write to sqlite_master, so the
# read-only ones are declared before the authorizer is set; this also loads the schema.
_DECLARE_READ_ONLY_TABLES = (
    "SELECT * FROM json_each('[]')",
    "SELECT * FROM json_tree('[]')",
    *(f"SELECT * FROM pragma_{name}('')" for name in sorted(_READ_ONLY_PRAGMAS)),
)
# Set after the schema is loaded, so tables wider than MAX_RESULT_COLUMNS can still be read.
_LIMITS = {
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
    sqlite3.SQLITE_LIMIT_LENGTH: MAX_VALUE_BYTES,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: MAX_PATTERN_BYTES,
    sqlite3.SQLITE_LIMIT_COLUMN: MAX_RESULT_COLUMNS,
}
_REINTERRUPT_S = 0.05
_CACHED_CONNECTIONS_PER_THREAD = 32


@dataclass(slots=True)
class QueryResult:
    """Outcome of one query. ``truncated``: rows were dropped by the row, character or byte cap."""

    ok: bool
    columns: tuple[str, ...] = ()
    rows: list[tuple] = field(default_factory=list)
    error: str | None = None
    truncated: bool = False


def _authorize(
    action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None
) -> int:
    if action in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_FUNCTION:
        return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_ONLY_PRAGMAS:
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


class _SandboxConnection:
    """One read-only connection, and which query on it (if any) the watchdog may interrupt."""

    __slots__ = ("conn", "lock", "query_id", "timed_out")

    def __init__(self, db_path: str) -> None:
        uri = f"file:{urllib.parse.quote(db_path)}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA query_only = 1")
        for sql in _DECLARE_READ_ONLY_TABLES:
            with contextlib.suppress(sqlite3.OperationalError):  # an SQLite built without JSON
                self.conn.execute(sql).fetchall()
        for limit, value in _LIMITS.items():
            self.conn.setlimit(limit, value)
        self.conn.set_authorizer(_authorize)
        self.lock = threading.Lock()
        self.query_id: int | None = None
        self.timed_out = False

    def start(self, query_id: int) -> None:
        with self.lock:
            self.query_id, self.timed_out = query_id, False

    def finish(self) -> None:
        with self.lock:
            self.query_id = None

    def interrupt(self, query_id: int) -> bool:
        """Interrupt ``query_id`` if it is still running; False once it has finished."""
        with self.lock:
            if self.query_id != query_id:
                return False
            self.timed_out = True
            self.conn.interrupt()
            return True


class _Watchdog:
    """One daemon thread that interrupts each query once its deadline has passed."""

    def __init__(self) -> None:
        self._wakeup = threading.Condition()
        self._due: list[tuple[float, int, _SandboxConnection]] = []  # a heap of (deadline, query id, conn)
        self._thread: threading.Thread | None = None

    def watch(self, sandbox: _SandboxConnection, query_id: int, deadline: float) -> None:
        with self._wakeup:
            heapq.heappush(self._due, (deadline, query_id, sandbox))
            if self._thread is None or not self._thread.is_alive():  # not started yet, or lost in a fork
                self._thread = threading.Thread(target=self._run, name="sql-watchdog", daemon=True)
                self._thread.start()
            if self._due[0][1] == query_id:
                self._wakeup.notify()

    def _next_due(self) -> tuple[float, int, _SandboxConnection]:
        with self._wakeup:
            while not self._due or self._due[0][0] > time.monotonic():
                self._wakeup.wait(self._due[0][0] - time.monotonic() if self._due else None)
            return heapq.heappop(self._due)

    def _run(self) -> None:
        while True:
            _, query_id, sandbox = self._next_due()
            if sandbox.interrupt(query_id):
                # SQLite clears an interrupt that lands before a statement's first step: repeat until it ends.
                self.watch(sandbox, query_id, time.monotonic() + _REINTERRUPT_S)


_local = threading.local()
_watchdog = _Watchdog()
_query_ids = itertools.count()
_running_queries = threading.BoundedSemaphore(MAX_RUNNING_QUERIES)


def _connection(db_path: str) -> _SandboxConnection:
    """This thread's cached connection; keyed by inode and mtime so a rebuilt file is reopened."""
    stat = os.stat(db_path)
    key = (db_path, stat.st_ino, stat.st_mtime_ns)
    cache: OrderedDict = getattr(_local, "connections", None)
    if cache is None:
        cache = _local.connections = OrderedDict()
    sandbox = cache.get(key)
    if sandbox is None:
        sandbox = cache[key] = _SandboxConnection(os.path.abspath(db_path))
        if len(cache) > _CACHED_CONNECTIONS_PER_THREAD:
            cache.popitem(last=False)[1].conn.close()
    else:
        cache.move_to_end(key)
    return sandbox


def _check_limits(
    timeout_s: float = _TIMEOUT_S, max_rows: int = _MAX_ROWS, max_chars: int = _MAX_CHARS
) -> None:
    """Refuse limits that would hang or mean nothing (a NaN timeout waits forever, -1 rows is no cap)."""
    if not isinstance(timeout_s, Real) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    for name, value in (("max_rows", max_rows), ("max_chars", max_chars)):
        if not isinstance(value, Integral) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def _fetch(cursor: sqlite3.Cursor, max_rows: int, max_chars: int) -> tuple[list[tuple], bool]:
    """Rows up to the row, character and byte caps, counted as they arrive; True when some were left out."""
    rows: list[tuple] = []
    num_chars = num_bytes = 0
    for row in cursor:
        if len(rows) == max_rows:
            return rows, True
        num_chars += sum(len(v) for v in row if v.__class__ is str or v.__class__ is bytes)
        num_bytes += sys.getsizeof(row) + sum(map(sys.getsizeof, row))
        if num_chars > max_chars or num_bytes > MAX_RESULT_BYTES:
            return rows, True
        rows.append(row)
    return rows, False


def _describe(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "MemoryError: the query ran out of memory"
    if "too big" in str(exc):
        return f"{type(exc).__name__}: {exc} (the sandbox holds values of at most {MAX_VALUE_BYTES} bytes)"
    return f"{type(exc).__name__}: {exc}"


def _run(
    sandbox: _SandboxConnection, sql: str, timeout_s: float, max_rows: int, max_chars: int
) -> QueryResult:
    query_id = next(_query_ids)
    sandbox.start(query_id)
    _watchdog.watch(sandbox, query_id, time.monotonic() + timeout_s)
    cursor = sandbox.conn.cursor()
    try:
        cursor.execute(sql)
        if cursor.description is None:
            return QueryResult(ok=False, error="no statement to execute: expected one SELECT query")
        columns = tuple(d[0] for d in cursor.description)
        rows, truncated = _fetch(cursor, max_rows, max_chars)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
        if sandbox.timed_out:
            return QueryResult(ok=False, error=f"query exceeded the time limit of {timeout_s:g}s")
        return QueryResult(ok=False, error=_describe(exc))
    finally:
        cursor.close()
        sandbox.finish()
    return QueryResult(ok=True, columns=columns, rows=rows, truncated=truncated)


def execute(
    db_path: str,
    sql: str,
    timeout_s: float = _TIMEOUT_S,
    max_rows: int = _MAX_ROWS,
    max_chars: int = _MAX_CHARS,
) -> QueryResult:
    """Run one untrusted statement read-only; errors and timeouts come back as ``QueryResult(ok=False)``.

    ``max_chars`` caps the characters of the text and blob values returned; the sandbox's own
    ``MAX_RESULT_BYTES`` applies as well. ``timeout_s`` starts once the query has a slot to run in.
    """
    _check_limits(timeout_s, max_rows, max_chars)
    if not isinstance(sql, str) or not sql.strip():
        return QueryResult(ok=False, error="empty query: expected one SQL statement as a non-empty string")
    try:
        sandbox = _connection(db_path)
    except (OSError, sqlite3.Error) as exc:
        return QueryResult(ok=False, error=f"cannot open database {db_path!r}: {exc}")
    with _running_queries:
        return _run(sandbox, sql, timeout_s, max_rows, max_chars)
