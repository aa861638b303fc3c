"""A tool-result cache in SQLite, shared by every backend, thread and process (WAL mode).

Keys are built from the backend, the operation (search, browse), the query or url, and the parameters that change
the result (top-k, size caps). Values are JSON. Only successful results are stored: a failure is retried next time.
The default file is ``$ARPO_CACHE_DIR/tool_cache.sqlite`` (``~/.cache/arpo`` when unset).

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


def default_cache_path() -> Path:
    base = os.environ.get("ARPO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arpo")
    return Path(base) / "tool_cache.sqlite"


class ToolCache:
    """``get``/``put`` of JSON values by key parts; counts its own hits and misses."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else default_cache_path()
        self.hits = 0
        self.misses = 0
        self.disabled: str | None = None
        """Why the cache is not used (it could not be opened), or None."""
        self._warned = False
        self._local = threading.local()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connection() as db:
                db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                           "created REAL NOT NULL)")
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
        try:
            self._connection().execute("INSERT OR REPLACE INTO results (key, value, created) VALUES (?, ?, ?)",
                                       (key, json.dumps(value), time.time()))
        except sqlite3.Error as exc:  # not stored: the next call runs the tool again
            self._warn(exc)

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
