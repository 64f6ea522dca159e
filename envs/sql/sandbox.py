"""Read-only, time-limited execution of untrusted SQL against SQLite files.

Every query runs on a connection opened with a ``mode=ro`` URI, with ``PRAGMA query_only`` set and an
authorizer that allows only reads: writes, ATTACH/DETACH, PRAGMA changes, ``load_extension`` and schema or
trigger changes are denied. A progress handler stops a query once its wall-time deadline has passed.
Connections are cached per thread, so a thread pool can run many rollouts' queries at once (sqlite3 releases
the GIL while a statement runs).
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
# Pragmas that only describe the schema; a model exploring a database may use them.
_READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
_PROGRESS_EVERY_OPS = 10_000
_MAX_VALUE_CHARS = 1_000_000
_CACHED_CONNECTIONS_PER_THREAD = 32


@dataclass(slots=True)
class QueryResult:
    """Outcome of one query. ``truncated`` is True when rows were dropped by the row or character cap."""

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
    """One read-only connection plus the deadline its progress handler enforces."""

    __slots__ = ("conn", "deadline", "timed_out")

    def __init__(self, db_path: str) -> None:
        uri = f"file:{urllib.parse.quote(db_path)}?mode=ro"
        self.conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA query_only = 1")
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_CHARS)
        self.conn.set_authorizer(_authorize)
        self.conn.set_progress_handler(self._past_deadline, _PROGRESS_EVERY_OPS)
        self.deadline = math.inf
        self.timed_out = False

    def _past_deadline(self) -> int:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1
        return 0


_local = threading.local()


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


def _cap_chars(rows: list[tuple], max_chars: int) -> tuple[list[tuple], bool]:
    total = 0
    for i, row in enumerate(rows):
        for value in row:
            if value.__class__ is str or value.__class__ is bytes:
                total += len(value)
        if total > max_chars:
            return rows[:i], True
    return rows, False


def execute(
    db_path: str, sql: str, timeout_s: float = 2.0, max_rows: int = 1000, max_chars: int = 100_000
) -> QueryResult:
    """Run one untrusted statement read-only; errors and timeouts come back as ``QueryResult(ok=False)``."""
    if not isinstance(sql, str) or not sql.strip():
        return QueryResult(ok=False, error="empty query: expected one SQL statement as a non-empty string")
    try:
        sandbox = _connection(db_path)
    except (OSError, sqlite3.Error) as exc:
        return QueryResult(ok=False, error=f"cannot open database {db_path!r}: {exc}")
    sandbox.timed_out = False
    sandbox.deadline = time.monotonic() + timeout_s
    cursor = sandbox.conn.cursor()
    try:
        cursor.execute(sql)
        if cursor.description is None:
            return QueryResult(ok=False, error="no statement to execute: expected one SELECT query")
        rows = cursor.fetchmany(max_rows + 1)
        columns = tuple(d[0] for d in cursor.description)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
        if sandbox.timed_out:
            return QueryResult(ok=False, error=f"query exceeded the time limit of {timeout_s:g}s")
        return QueryResult(ok=False, error=f"{type(exc).__name__}: {exc}")
    finally:
        sandbox.deadline = math.inf
        cursor.close()
    truncated = len(rows) > max_rows
    if truncated:
        del rows[max_rows:]
    # repr() over-counts the characters but runs in C; count exactly only when it exceeds the cap.
    if rows and len(repr(rows)) > max_chars:
        rows, cut = _cap_chars(rows, max_chars)
        truncated = truncated or cut
    return QueryResult(ok=True, columns=columns, rows=rows, truncated=truncated)


class SqlExecutor:
    """A thread pool that runs sandboxed queries concurrently without blocking the caller."""

    def __init__(self, num_threads: int = 4) -> None:
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="sql-sandbox")

    def submit(self, db_path: str, sql: str, **limits) -> Future[QueryResult]:
        """Queue one query; the future resolves to its ``QueryResult``."""
        return self._pool.submit(execute, db_path, sql, **limits)

    def map(self, queries: Iterable[tuple[str, str]], **limits) -> list[QueryResult]:
        """Run ``(db_path, sql)`` pairs concurrently; results keep the input order."""
        futures = [self.submit(db_path, sql, **limits) for db_path, sql in queries]
        return [f.result() for f in futures]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
