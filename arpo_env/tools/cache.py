"""A tool-result cache in SQLite, shared by every backend, thread and process (WAL mode).

Keys are built from the backend, the operation (search, browse), the query or url, and the parameters that change
the result (top-k, size caps). Values are JSON. Only successful results are stored: a failure is retried next time.
The default file is ``$ARPO_CACHE_DIR/tool_cache.sqlite`` (``~/.cache/arpo`` when unset).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


def default_cache_path() -> Path:
    base = os.environ.get("ARPO_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "arpo")
    return Path(base) / "tool_cache.sqlite"


class ToolCache:
    """``get``/``put`` of JSON values by key parts; counts its own hits and misses."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else default_cache_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.hits = 0
        self.misses = 0
        self._local = threading.local()
        with self._connection() as db:
            db.execute("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, "
                       "created REAL NOT NULL)")

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
        row = self._connection().execute("SELECT value FROM results WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: Any) -> None:
        self._connection().execute("INSERT OR REPLACE INTO results (key, value, created) VALUES (?, ?, ?)",
                                   (key, json.dumps(value), time.time()))

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
