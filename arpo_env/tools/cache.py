"""A tool-result cache in SQLite, shared by every backend, thread and process (WAL mode).

Keys are built from the backend, the operation (search, browse), the query or url, and the parameters that change
the result (top-k, size caps). Values are JSON. Only successful results are stored: a failure is retried next time.
The default file is ``$ARPO_CACHE_DIR/tool_cache.sqlite`` (``~/.cache/arpo`` when unset). Its values are kept to
``max_mb`` megabytes (``$ARPO_TOOL_CACHE_MB``, else `DEFAULT_MAX_MB`): past that, the oldest go first, down to 90% of
it; its size is checked every `CHECK_EVERY` puts through one `ToolCache` and when one is opened.

The cache only saves time: a file that cannot be used (not a database, a folder that cannot be written, a disk that
is full, a lock held too long) costs a warning, once, and the tools run as if the value were not cached; it never
fails a tool call or the making of an environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any

DEFAULT_MAX_MB = 2048.0
"""How many megabytes of values the cache keeps by default (``ARPO_TOOL_CACHE_MB`` sets another bound)."""
CHECK_EVERY = 256
"""Every so many puts through one `ToolCache`, the size of the cache is checked against its bound."""


def default_cache_path() -> Path:
    base = os.environ.get("ARPO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arpo")
    return Path(base) / "tool_cache.sqlite"


class ToolCache:
    """``get``/``put`` of JSON values by key parts; counts its own hits and misses."""

    def __init__(self, path: str | os.PathLike | None = None, max_mb: float | None = None) -> None:
        self.path = Path(path) if path else default_cache_path()
        if max_mb is None:
            bound = os.environ.get("ARPO_TOOL_CACHE_MB", "")
            try:
                max_mb = float(bound) if bound.strip() else DEFAULT_MAX_MB
                if not 0 < max_mb < float("inf"):
                    raise ValueError
            except ValueError:  # the cache never fails the making of an environment
                warnings.warn(f"ARPO_TOOL_CACHE_MB must be a positive number of megabytes, not {bound!r}; the tool "
                              f"cache keeps {DEFAULT_MAX_MB:g} MB", RuntimeWarning, stacklevel=2)
                max_mb = DEFAULT_MAX_MB
        if not (isinstance(max_mb, (int, float)) and not isinstance(max_mb, bool) and max_mb > 0
                and max_mb != float("inf")):
            raise ValueError(f"the tool cache's max_mb must be a positive number of megabytes, not {max_mb!r}")
        self.max_bytes = int(max_mb * 1e6)
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        """How many values this object removed to keep the cache within its bound."""
        self.disabled: str | None = None
        """Why the cache is not used (it could not be opened), or None."""
        self._warned = False
        self._local = threading.local()
        self._puts = 0
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connection() as db:
                db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                           "created REAL NOT NULL, size INTEGER)")
                columns = {row[1] for row in db.execute("PRAGMA table_info(results)")}
                if "size" not in columns:  # a cache written before the bound: its values are measured, once
                    try:
                        db.execute("ALTER TABLE results ADD COLUMN size INTEGER")
                    except sqlite3.OperationalError as exc:  # another process added it first
                        if "duplicate column" not in str(exc):
                            raise
                    db.execute("UPDATE results SET size = length(CAST(value AS BLOB)) WHERE size IS NULL")
                # an index that covers the bound's scans (the values themselves are not read)
                db.execute("CREATE INDEX IF NOT EXISTS results_age ON results (created, size)")
            self._bound()
        except (OSError, sqlite3.Error) as exc:
            self.disabled = f"{type(exc).__name__}: {exc}"
            self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            message = (f"the tool cache {self.path} cannot be used ({type(exc).__name__}: {exc}); tools run without "
                       "it. Delete the file, or set ARPO_CACHE_DIR to a folder that can be written.")
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _connection(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None or getattr(self._local, "pid", None) != os.getpid():
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db, self._local.pid = db, os.getpid()
        return db

    @staticmethod
    def key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    def get(self, key: str) -> Any | None:
        row = None
        if self.disabled is None:
            try:
                row = self._connection().execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error as exc:  # a miss
                self._warn(exc)
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        if self.disabled is not None:
            return
        text = json.dumps(value)
        try:
            self._connection().execute("INSERT OR REPLACE INTO results (key, value, created, size) VALUES (?, ?, ?, ?)",
                                       (key, text, time.time(), len(text.encode("utf-8", "surrogatepass"))))
            with self._lock:
                self._puts += 1
                check = self._puts % CHECK_EVERY == 0
            if check:
                self._bound()
        except sqlite3.Error as exc:  # not stored: the next call runs the tool again
            self._warn(exc)

    def size_bytes(self) -> int:
        """The bytes of the values the cache holds (their JSON as UTF-8)."""
        return int(self._connection().execute("SELECT COALESCE(SUM(size), 0) FROM results").fetchone()[0])

    def _bound(self) -> None:
        """Remove the oldest values while the cache holds more than its bound, down to 90% of it."""
        total = self.size_bytes()
        if total <= self.max_bytes:
            return
        db, target = self._connection(), int(self.max_bytes * 0.9)
        while total > target:
            oldest = db.execute("SELECT key, COALESCE(size, 0) FROM results ORDER BY created LIMIT 512").fetchall()
            if not oldest:
                break
            chosen = []
            for key, size in oldest:
                if total <= target:
                    break
                chosen.append((key,))
                total -= size
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany("DELETE FROM results WHERE key = ?", chosen)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            self.evicted += len(chosen)

    def stats(self) -> dict[str, int]:
        return {"cache_hits": self.hits, "cache_misses": self.misses}

    def __repr__(self) -> str:
        return f"ToolCache({str(self.path)!r}, hits={self.hits}, misses={self.misses})"


def resolve_cache(cache: "ToolCache | str | os.PathLike | bool | None") -> ToolCache | None:
    """`cache` as given to a tool: a ToolCache, a path, True/None (the default file), or False (no cache)."""
    if cache is False:
        return None
    if isinstance(cache, ToolCache):
        return cache
    return ToolCache(None if cache in (None, True) else cache)  # type: ignore[arg-type]
