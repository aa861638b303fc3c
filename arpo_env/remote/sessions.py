"""The server's sessions: one environment each, made, stepped, forked, snapshotted, restored and closed by id.

A session's env is a local `arpo_env.ToolEnv` with its own tools (its own sandbox process): sessions share nothing
but the process. Ids are random and unguessable. The pool is capped; a session unused for ``idle_s`` is closed and
its sandbox reaped; `close_all` ends every session (the server's shutdown).
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import gymnasium as gym

CLIENT_KWARGS = frozenset({"dataset", "tasks", "max_tool_calls", "max_turns", "max_chars", "strict_think",
                           "tool_bonus", "tools"})
"""The environment arguments a client may give: they choose tasks and budgets. Those that name the server's files or
backends (``data_dir``, ``sandbox_options``, ``search_options``…) are the server's to set (``--env_kwargs``)."""


class SessionError(Exception):
    """A request the pool refuses; `status` is the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    id: str
    env_id: str
    env: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)
    steps: int = 0
    episode_id: str | None = None


class SessionPool:
    """The sessions of one server.

    Args:
        env_ids: The ids served, each with the keyword arguments the server gives it (``--env_kwargs``).
        max_sessions: Sessions open at once; one more is refused (429).
        idle_s: A session unused this long is closed.
    """

    def __init__(self, env_ids: Mapping[str, Mapping[str, Any]], max_sessions: int = 64, idle_s: float = 600.0) -> None:
        self.env_ids = {k: dict(v) for k, v in env_ids.items()}
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._sessions: dict[str, Session] = {}
        self._reserved = 0
        self.made = 0
        """Sessions made since the server started."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    # Making ---------------------------------------------------------------------------------------------------------
    def create(self, env_id: str | None, kwargs: Mapping[str, Any] | None = None) -> Session:
        env_id, merged = self._arguments(env_id, kwargs)
        self._reserve()
        try:
            env = gym.make(env_id, **merged).unwrapped
        except BaseException as exc:
            self._unreserve()
            if isinstance(exc, (TypeError, ValueError, gym.error.Error)):
                raise SessionError(400, f"{env_id}: {' '.join(str(exc).split())}") from None
            raise
        return self._add(Session(secrets.token_urlsafe(18), env_id, env))

    def fork(self, session_id: str) -> Session:
        parent = self.get(session_id)
        self._reserve()
        try:
            with parent.lock:
                child = parent.env.fork()
        except BaseException as exc:
            self._unreserve()
            raise _refused(exc) from None
        return self._add(Session(secrets.token_urlsafe(18), parent.env_id, child,
                                 steps=parent.steps, episode_id=parent.episode_id))

    def restore(self, env_id: str | None, kwargs: Mapping[str, Any] | None, snapshot: dict[str, Any]) -> Session:
        session = self.create(env_id, kwargs)
        try:
            with session.lock:
                session.env.restore(snapshot)
        except BaseException as exc:
            self.close(session.id)
            raise _refused(exc) from None
        return session

    # Using ----------------------------------------------------------------------------------------------------------
    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise SessionError(404, "no such session: it was closed, timed out after being idle, or never existed")
        session.last_used = time.monotonic()
        return session

    def run(self, session_id: str, what: str, *args: Any, **kwargs: Any) -> Any:
        """Call the session env's method `what`, one call at a time per session; the env's refusals are 4xx."""
        session = self.get(session_id)
        with session.lock:
            try:
                return getattr(session.env, what)(*args, **kwargs)
            except BaseException as exc:
                raise _refused(exc) from None
            finally:
                session.last_used = time.monotonic()

    # Ending ---------------------------------------------------------------------------------------------------------
    def close(self, session_id: str) -> bool:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        with session.lock:
            session.env.close()
        return True

    def reap_idle(self) -> list[str]:
        """Close the sessions unused for ``idle_s`` (a client that vanished mid-episode); their ids."""
        now = time.monotonic()
        with self._lock:
            idle = [s.id for s in self._sessions.values() if now - s.last_used > self.idle_s and not s.lock.locked()]
        return [sid for sid in idle if self.close(sid)]

    def close_all(self) -> None:
        with self._lock:
            ids = list(self._sessions)
        for sid in ids:
            self.close(sid)

    # Inside ---------------------------------------------------------------------------------------------------------
    def _arguments(self, env_id: str | None, kwargs: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        env_id = env_id or next(iter(self.env_ids))
        if env_id not in self.env_ids:
            raise SessionError(404, f"this server does not serve {env_id}; it serves {', '.join(self.env_ids)}")
        kwargs = dict(kwargs or {})
        refused = sorted(set(kwargs) - CLIENT_KWARGS)
        if refused:
            raise SessionError(403, f"{', '.join(refused)}: the server sets these (arpo serve --env_kwargs); a client "
                                    f"may give {', '.join(sorted(CLIENT_KWARGS))}")
        dataset = kwargs.get("dataset")
        if isinstance(dataset, str) and ("/" in dataset or "\\" in dataset or dataset.startswith(".")):
            raise SessionError(403, "dataset names a file: a client names a dataset, the server's files are its own")
        tools = kwargs.get("tools")
        if tools is not None and not (isinstance(tools, str) or (
                isinstance(tools, list) and all(isinstance(t, str) for t in tools))):
            raise SessionError(400, "tools are built-in tools' names over the wire")
        return env_id, {**self.env_ids[env_id], **kwargs}

    def _reserve(self) -> None:
        with self._lock:
            if len(self._sessions) + self._reserved >= self.max_sessions:
                raise SessionError(429, f"the server holds {self.max_sessions} sessions, its cap: close one, or try "
                                        "again later")
            self._reserved += 1

    def _unreserve(self) -> None:
        with self._lock:
            self._reserved -= 1

    def _add(self, session: Session) -> Session:
        with self._lock:
            self._reserved -= 1
            self._sessions[session.id] = session
            self.made += 1
        return session


def _refused(exc: BaseException) -> BaseException:
    """An env's refusal as the HTTP status that says whose mistake it is: a step before reset, or after the episode
    ended, 409; a bad argument or snapshot 400; anything else is the server's (500)."""
    if isinstance(exc, SessionError):
        return exc
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (gym.error.ResetNeeded, gym.error.ClosedEnvironmentError)):
        return SessionError(409, message)
    if isinstance(exc, (ValueError, TypeError, IndexError, KeyError)):
        return SessionError(400, message)
    if isinstance(exc, RuntimeError):  # a stateful MCP server that refuses to fork, say
        return SessionError(409, message)
    return exc
