"""A ``limits`` storage in one SQLite file (WAL mode), shared by every process and thread of one host.

``limits`` keeps its in-memory storage per process and needs a server (Redis, Memcached, MongoDB) for
anything shared; no well-kept library offers a cross-process moving window on a local file. This
storage is that missing piece, kept to what :class:`limits.strategies.MovingWindowRateLimiter` calls
(``acquire_entry``, ``get_moving_window``) plus the counters the ``Storage`` base requires, and the
shared cooldown deadline of :mod:`.limiter`. Every check-then-write runs in one ``BEGIN IMMEDIATE``
transaction, which SQLite serialises across processes, so two processes can never both take the
last slot of a window.

A start of weight ``amount`` is one row (``ts``, ``amount``), not ``amount`` rows: a token charge of
a thousand units costs one insert. Rows older than their window are deleted as they are passed.
"""

from __future__ import annotations

import functools
import math
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from limits.storage import MovingWindowSupport, Storage

from airflow_provider_datagen.exceptions import DatagenError

if TYPE_CHECKING:
    from collections.abc import Callable

_F = TypeVar("_F", bound="Callable[..., Any]")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS window_entries (key TEXT NOT NULL, ts REAL NOT NULL, expires REAL NOT NULL, "
    "amount INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS window_entries_key_ts ON window_entries (key, ts)",
    "CREATE INDEX IF NOT EXISTS window_entries_expires ON window_entries (expires)",
    "CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value INTEGER NOT NULL, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS cooldowns (key TEXT PRIMARY KEY, until REAL NOT NULL)",
)
#: Seconds a process waits for another one's transaction before SQLite gives up ("database is locked").
_BUSY_TIMEOUT = 30.0


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode (persistent: done once per file).

    Switching modes needs the file to itself and SQLite answers "database is locked" at once, busy
    timeout or not, when processes open a new file together: the first switch wins, the others
    retry until they read ``wal``.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _translated(method: _F) -> _F:
    """``method`` with a damaged file's ``sqlite3.DatabaseError`` as a :class:`DatagenError` naming the file.

    "file is not a database" or "database disk image is malformed" name no file; the file holds
    nothing but rate-limit windows and cooldowns, so deleting it is the fix. A busy or locked file
    (``OperationalError``) is another matter and keeps its own error.
    """

    @functools.wraps(method)
    def call(self: SQLiteStorage, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            # the handle of a damaged file is useless: the next call, after the fix, opens a new one
            self.close()
            raise DatagenError(
                f"the rate limit storage {self.path!r} is not a readable SQLite database ({exc}); "
                "delete that file (it only holds rate-limit windows and cooldowns, which start afresh) "
                "and run again"
            ) from exc

    return call  # type: ignore[return-value]


class SQLiteStorage(Storage, MovingWindowSupport):
    """
    Moving-window rate limit storage in the SQLite file ``path``; safe across processes and threads.

    :param path: the database file (created with its directory); must be on a local filesystem, as
        SQLite's WAL mode needs shared memory between the processes.
    :param clock: the wall clock (seconds since the epoch); injectable for tests.
    """

    STORAGE_SCHEME = None

    def __init__(self, path: str, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(None)
        self.path = path
        self.clock = clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return sqlite3.Error

    # -- connection ------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # A forked child must not share its parent's SQLite handle: it opens its own.
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        try:
            # WAL lets readers and the single writer proceed together; rate-limit rows need no fsync per write.
            _enable_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            with _transaction(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
        except BaseException:
            conn.close()  # a damaged file: no handle is kept
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this process's connection (the file and its rows stay)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    # -- moving window ---------------------------------------------------------------------------------

    @_translated
    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """Record a start of weight ``amount`` unless the window's weight would then exceed ``limit``."""
        if amount > limit:
            return False
        with self._lock:
            conn = self._connect()
            with _transaction(conn):
                now = self.clock()
                conn.execute("DELETE FROM window_entries WHERE expires < ?", (now,))
                (used,) = conn.execute(
                    "SELECT COALESCE(SUM(amount), 0) FROM window_entries WHERE key = ? AND ts >= ?",
                    (key, now - expiry),
                ).fetchone()
                if used + amount > limit:
                    return False
                conn.execute(
                    "INSERT INTO window_entries (key, ts, expires, amount) VALUES (?, ?, ?, ?)",
                    (key, now, now + expiry, amount),
                )
                return True

    @_translated
    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        """(the oldest start still in the window, the window's weight); (now, 0) for an empty window."""
        with self._lock:
            conn = self._connect()
            now = self.clock()
            oldest, used = conn.execute(
                "SELECT MIN(ts), COALESCE(SUM(amount), 0) FROM window_entries WHERE key = ? AND ts >= ?",
                (key, now - expiry),
            ).fetchone()
        return (now, 0) if oldest is None else (float(oldest), int(used))

    # -- counters (the fixed-window part of the Storage interface) -------------------------------------

    @_translated
    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        with self._lock:
            conn = self._connect()
            with _transaction(conn):
                now = self.clock()
                conn.execute("DELETE FROM counters WHERE key = ? AND expires <= ?", (key, now))
                conn.execute(
                    "INSERT INTO counters (key, value, expires) VALUES (?, ?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = value + excluded.value",
                    (key, amount, now + expiry),
                )
                (value,) = conn.execute("SELECT value FROM counters WHERE key = ?", (key,)).fetchone()
        return int(value)

    @_translated
    def get(self, key: str) -> int:
        with self._lock:
            row = (
                self._connect()
                .execute("SELECT value FROM counters WHERE key = ? AND expires > ?", (key, self.clock()))
                .fetchone()
            )
        return int(row[0]) if row else 0

    @_translated
    def get_expiry(self, key: str) -> float:
        with self._lock:
            row = (
                self._connect()
                .execute("SELECT expires FROM counters WHERE key = ? AND expires > ?", (key, self.clock()))
                .fetchone()
            )
        return float(row[0]) if row else self.clock()

    @_translated
    def check(self) -> bool:
        with self._lock:
            self._connect().execute("SELECT 1").fetchone()
        return True

    @_translated
    def reset(self) -> int | None:
        with self._lock:
            conn = self._connect()
            with _transaction(conn):
                keys = {row[0] for row in conn.execute("SELECT key FROM window_entries")}
                keys |= {row[0] for row in conn.execute("SELECT key FROM counters")}
                for table in ("window_entries", "counters", "cooldowns"):
                    conn.execute(f"DELETE FROM {table}")
        return len(keys)

    @_translated
    def clear(self, key: str) -> None:
        with self._lock:
            conn = self._connect()
            with _transaction(conn):
                conn.execute("DELETE FROM window_entries WHERE key = ?", (key,))
                conn.execute("DELETE FROM counters WHERE key = ?", (key,))

    # -- the shared cooldown deadline ------------------------------------------------------------------

    @_translated
    def block_until(self, key: str, until: float, latest: float = math.inf) -> float:
        """Raise ``key``'s shared "blocked until" deadline to ``until`` (never lower it); the deadline.

        A stored deadline after ``latest`` (beyond the ceiling: an older version had none) is
        replaced, not kept.
        """
        with self._lock:
            conn = self._connect()
            with _transaction(conn):
                conn.execute(
                    "INSERT INTO cooldowns (key, until) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET until = "
                    "CASE WHEN until > ? THEN excluded.until ELSE MAX(until, excluded.until) END",
                    (key, until, latest),
                )
                (deadline,) = conn.execute("SELECT until FROM cooldowns WHERE key = ?", (key,)).fetchone()
        return float(deadline)

    @_translated
    def blocked_until(self, key: str, latest: float = math.inf) -> float:
        """``key``'s shared deadline (0.0 when none was set, or it is after ``latest``: beyond the ceiling)."""
        with self._lock:
            row = self._connect().execute("SELECT until FROM cooldowns WHERE key = ?", (key,)).fetchone()
        until = float(row[0]) if row and row[0] is not None else 0.0
        return until if math.isfinite(until) and until <= latest else 0.0


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error): the write lock is taken before reading."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")
