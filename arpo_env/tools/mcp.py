"""An MCP server's tools as tools of an arpo environment, through the official ``mcp`` SDK (2.x; ``pip install
'arpo[mcp]'``).

    from arpo_env.tools.mcp import MCPTools

    calculator = MCPTools(["python", "calculator_server.py"], stateless=True)    # started by a command (stdio)
    crm = MCPTools(url="http://127.0.0.1:8000/mcp", headers={"Authorization": "Bearer …"})   # streamable HTTP
    env = gym.make("ARPO-Math-v0", tools=["python", calculator])

The server's tools are listed when the environment is made and offered to the model under their own names, each as a
tag (`arpo_env.tags`). A call has a time limit (``timeout_s``) and its reply a size limit (``max_output_chars``); a
server that hangs, exits, floods its output or answers what is not MCP is an error the model reads in its
``<result>``, and the server is started again (or reconnected) at the next call.

**Forking.** ARPO forks an episode at its tool steps, so each MCP server says how its state forks:

| ``MCPTools(...)`` | one episode | a fork |
|---|---|---|
| ``stateless=True`` | one server shared by every env of the process | shares it: free |
| ``fork="refuse"`` (default) | a server of its own | refused with an error |
| ``fork="replay"`` | a server of its own | a new server, which replays the episode's calls first |

The default refuses: replaying calls that act on the world (a row inserted in a shared database, a message sent) would
do them twice. A server whose calls do not change anything says ``stateless=True``; one whose state lives in the
server process, and whose calls are safe to repeat in a new one, says ``fork="replay"``. Over HTTP, "a server of its
own" is an MCP session of its own. A snapshot is the list of calls, and restoring one replays them.

The SDK's client is asynchronous; one thread of the process runs its event loop for every server, and an env's step
waits there for its call. Closing an env closes what it started (`close` kills a stdio server's process tree, as
the SDK does); the shared server of a stateless source stops when the last env using it closes.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import copy
import logging
import os
import shlex
import sys
import threading
import time
from typing import Any, Mapping, Sequence

from arpo_env import tags
from arpo_env.tools.protocol import ToolOutput, ToolSpec, elide, limit_problem

__all__ = ["MCPError", "MCPTools"]

_FORK_MODES = ("refuse", "replay")


class MCPError(RuntimeError):
    """An MCP server that cannot be started, reached or listed, when an environment is made; or a fork an MCP
    server refuses."""


class MCPTools:
    """The tools of one MCP server (see the module docstring).

    Args:
        command: The command that starts the server over stdio: a list (``["python", "server.py"]``) or one string,
            split as a shell would. Give this or `url`.
        url: The address of a server over streamable HTTP (``http://127.0.0.1:8000/mcp``).
        env: Environment variables for a stdio server, added to the SDK's safe defaults.
        cwd: The working directory of a stdio server.
        headers: HTTP headers for a URL server (an ``Authorization`` token, say).
        stateless: The server's calls do not depend on one another: one server is shared by every episode and fork.
        fork: For a stateful server, what a fork of an episode does: ``"refuse"`` (the default) or ``"replay"``.
        include: Only these of the server's tools (by name); default all.
        prefix: Put before each tool's name (``"crm."``), when two servers have tools of one name, or one is called
            like a built-in tool.
        timeout_s: How long a call may take before it is an error and the server is restarted.
        start_timeout_s: How long starting (or reaching) the server and listing its tools may take.
        max_output_chars: Longer replies are cut to this many characters, with a note saying how many went.
        stderr: Where a stdio server's standard error goes: a file's path (appended to), or None to drop it.
    """

    def __init__(self, command: str | Sequence[str] | None = None, *, url: str | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 headers: Mapping[str, str] | None = None, stateless: bool = False, fork: str = "refuse",
                 include: Sequence[str] | None = None, prefix: str = "", timeout_s: float = 30.0,
                 start_timeout_s: float = 60.0, max_output_chars: int = 8000,
                 stderr: str | os.PathLike | None = None) -> None:
        import importlib.util

        if importlib.util.find_spec("mcp") is None:
            raise ModuleNotFoundError("MCPTools needs the 'mcp' extra (mcp is not installed): pip install 'arpo[mcp]'",
                                      name="mcp")
        if (command is None) == (url is None):
            raise ValueError("MCPTools: give the command that starts the server (stdio) or its url (HTTP), one of them")
        if isinstance(command, str):
            command = shlex.split(command)
        if command is not None and not (command and all(isinstance(c, (str, os.PathLike)) for c in command)):
            raise ValueError(f"MCPTools: the command is a program and its arguments, not {command!r}")
        if fork not in _FORK_MODES:
            raise ValueError(f"MCPTools: fork is 'refuse' or 'replay', not {fork!r}")
        if stateless not in (True, False):
            raise ValueError(f"MCPTools: stateless is true or false, not {stateless!r}")
        problems = [p for p in (limit_problem("timeout_s", timeout_s, None), limit_problem(
            "start_timeout_s", start_timeout_s, None), limit_problem("max_output_chars", max_output_chars, 100))
            if p]
        if problems:
            raise ValueError("MCPTools: " + "; ".join(problems))
        self.command = [os.fspath(c) for c in command] if command is not None else None
        self.url = url
        self.env = dict(env or {})
        self.cwd = os.fspath(cwd) if cwd is not None else None
        self.headers = dict(headers or {})
        self.stateless = stateless
        self.fork_mode = fork
        self.include = list(include) if include is not None else None
        self.prefix = prefix
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.max_output_chars = int(max_output_chars)
        self.stderr = os.fspath(stderr) if stderr is not None else None
        self._specs: tuple[ToolSpec, ...] | None = None
        self._names: dict[str, str] = {}  # tag -> the server's name of the tool
        self._shared: _Connection | None = None
        self._users = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        where = shlex.join(self.command) if self.command else self.url
        return f"MCPTools({where!r}{', stateless' if self.stateless else f', fork={self.fork_mode!r}'})"

    def __getstate__(self) -> dict[str, Any]:
        """What pickles: the configuration and the listing, not the connection (an env pickles with its arguments)."""
        state = dict(self.__dict__)
        state.update(_shared=None, _users=0, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ToolsetSource ----------------------------------------------------------------------------------------------------
    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The server's tools, listed once (at the first use: the environment's making) and kept."""
        if self._specs is None:
            connection = self._connect_or_raise()
            try:
                listed = connection.list_tools(self.start_timeout_s)
            except Exception as exc:
                connection.close()
                raise MCPError(f"{self}: listing its tools failed: {_reason(exc)}") from None
            try:
                self._specs = self._read_listing(listed)
            except BaseException:
                connection.close()
                raise
            if self.stateless:
                with self._lock:
                    if self._shared is None:
                        self._shared = connection  # kept for the first episode
                        return self._specs
            connection.close()
        return self._specs

    def make(self) -> "MCPSession":
        """The toolset of one episode."""
        self.specs  # noqa: B018 - listed before the first episode
        if self.stateless:
            with self._lock:
                self._users += 1
        return MCPSession(self)

    def close(self) -> None:
        """Stop the shared server of a stateless source now (the last env closing it does so too)."""
        with self._lock:
            connection, self._shared = self._shared, None
        if connection is not None:
            connection.close()

    # Inside ---------------------------------------------------------------------------------------------------------
    def _read_listing(self, listed: Sequence[Any]) -> tuple[ToolSpec, ...]:
        specs: list[ToolSpec] = []
        names = [t.name for t in listed]
        if self.include is not None:
            missing = [n for n in self.include if n not in names]
            if missing:
                raise MCPError(f"{self}: include names tools the server does not have: {', '.join(missing)} (it has "
                               f"{', '.join(names) or 'none'})")
        for entry in listed:
            if self.include is not None and entry.name not in self.include:
                continue
            tag = self.prefix + entry.name
            try:
                tags.check_tool_name(tag)
            except ValueError as exc:
                raise MCPError(f"{self}: its tool {entry.name!r}: {exc}; give prefix= or include=") from None
            schema = dict(entry.input_schema or {"type": "object", "properties": {}})
            schema.pop("title", None)
            self._names[tag] = entry.name
            specs.append(ToolSpec(tag, " ".join((entry.description or "").split()), schema))
        return tuple(specs)

    def _connect_or_raise(self) -> "_Connection":
        try:
            return _Connection.open(self)
        except Exception as exc:
            raise MCPError(f"{self}: could not start or reach the server: {_reason(exc)}") from None

    def _acquire_shared(self) -> "_Connection":
        with self._lock:
            if self._shared is None or not self._shared.alive:
                stale, self._shared = self._shared, None
                if stale is not None:
                    stale.close()
                self._shared = _Connection.open(self)
            return self._shared

    def _drop_shared(self, connection: "_Connection") -> None:
        """A shared connection that failed: closed, and made anew at the next call."""
        with self._lock:
            if self._shared is connection:
                self._shared = None
        connection.close()

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
            connection = self._shared if last else None
            if last:
                self._shared, self._users = None, 0
        if connection is not None:
            connection.close()


class MCPSession:
    """The MCP tools of one episode: a `arpo_env.tools.protocol.Toolset` (see `MCPTools`)."""

    def __init__(self, source: MCPTools, calls: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        self.source = source
        self.specs = source.specs
        self.calls: list[tuple[str, dict[str, Any]]] = list(calls or [])
        """The calls of the episode that were answered, in order: what a replay repeats."""
        self._connection: _Connection | None = None
        self._replayed = 0
        self._closed = False

    def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        source = self.source
        server_name = source._names.get(name, name)
        try:
            connection = self._connection_for_call()
        except Exception as exc:  # noqa: BLE001 - a server that does not start is the model's observation too
            return ToolOutput(f"error: the MCP server of <{name}> could not be started: {_reason(exc)}", failed=True,
                              error=_reason(exc))
        start = time.perf_counter()
        try:
            result = connection.call(server_name, arguments, source.timeout_s)
        except concurrent.futures.TimeoutError:
            self._lose(connection)
            return ToolOutput(f"error: <{name}> did not answer within {source.timeout_s:g} s; the server was stopped "
                              f"and starts again at the next call{self._state_note()}", failed=True,
                              error="timeout", latency_s=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - the server exited, wrote garbage or broke the protocol
            self._lose(connection)
            return ToolOutput(f"error: the MCP server failed during <{name}>: {_reason(exc)}; it starts again at the "
                              f"next call{self._state_note()}", failed=True, error=_reason(exc),
                              latency_s=time.perf_counter() - start)
        text, failed = _result_text(result)
        text, dropped = elide(text, source.max_output_chars)
        if not failed and not source.stateless:
            self.calls.append((server_name, copy.deepcopy(arguments)))
            self._replayed = len(self.calls)
        return ToolOutput(text, failed=failed, error=text[:200] if failed else None,
                          latency_s=time.perf_counter() - start,
                          extra={"truncated_chars": dropped} if dropped else {})

    def fork(self) -> "MCPSession":
        source = self.source
        if source.stateless:
            with source._lock:
                source._users += 1
            return MCPSession(source)
        if source.fork_mode == "refuse":
            raise MCPError(f"{source} keeps state between calls, and its forks are refused (fork='refuse', the "
                           "default): give MCPTools(..., stateless=True) if its calls do not depend on one another, "
                           "or fork='replay' to start a new server for the fork and replay the episode's calls")
        return MCPSession(source, self.calls)

    def snapshot(self) -> dict[str, Any] | None:
        if self.source.stateless:
            return None
        if self.source.fork_mode == "refuse":
            self.fork()  # raises, saying why
        return {"calls": [[name, copy.deepcopy(arguments)] for name, arguments in self.calls]}

    def restore(self, snapshot: Any) -> None:
        if self.source.stateless:
            return
        if self.source.fork_mode == "refuse":
            self.fork()
        calls = (snapshot or {}).get("calls", []) if isinstance(snapshot, (dict, type(None))) else None
        if not (isinstance(calls, list) and all(isinstance(c, (list, tuple)) and len(c) == 2 and isinstance(c[0], str)
                                                and isinstance(c[1], dict) for c in calls)):
            raise ValueError(f"an MCP snapshot is {{'calls': [[tool, arguments], …]}}, not {str(snapshot)[:100]}")
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self.calls = [(name, dict(arguments)) for name, arguments in calls]
        self._replayed = 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.source.stateless:
            self.source._release()
        elif self._connection is not None:
            self._connection.close()
            self._connection = None

    # Inside ---------------------------------------------------------------------------------------------------------
    def _connection_for_call(self) -> "_Connection":
        if self.source.stateless:
            return self.source._acquire_shared()
        if self._connection is None or not self._connection.alive:
            if self._connection is not None:
                self._connection.close()
            self._connection = _Connection.open(self.source)
            self._replayed = 0
        while self._replayed < len(self.calls):  # a fork, a restored snapshot or a restarted server catches up
            name, arguments = self.calls[self._replayed]
            result = self._connection.call(name, arguments, self.source.timeout_s)
            if getattr(result, "is_error", False):
                raise MCPError(f"replaying the call {name}({arguments}) failed: {_result_text(result)[0][:200]}")
            self._replayed += 1
        return self._connection

    def _lose(self, connection: "_Connection") -> None:
        if self.source.stateless:
            self.source._drop_shared(connection)
        else:
            connection.close()
            if self._connection is connection:
                self._connection = None
            if self.source.fork_mode == "refuse":
                self.calls = []  # nothing replays them: the new server starts empty

    def _state_note(self) -> str:
        if self.source.stateless:
            return ""
        if self.source.fork_mode == "replay":
            return " (after replaying this episode's earlier calls)"
        return " (empty: the state of this episode's earlier calls is lost)"


class _Connection:
    """One live client session with a server, held by a task of the MCP event loop."""

    def __init__(self, source: MCPTools) -> None:
        self.source = source
        self.client: Any = None
        self.alive = False
        self._stop: asyncio.Event | None = None
        self._task: concurrent.futures.Future | None = None
        self._errlog: Any = None

    @classmethod
    def open(cls, source: MCPTools) -> "_Connection":
        connection = cls(source)
        ready: concurrent.futures.Future = concurrent.futures.Future()
        connection._task = _loop().submit(connection._hold(ready))
        try:
            ready.result(timeout=source.start_timeout_s)
        except concurrent.futures.TimeoutError:
            connection.close()
            raise TimeoutError(f"no answer within {source.start_timeout_s:g} s") from None
        except BaseException:
            connection.close()
            raise
        _OPEN.add(connection)
        return connection

    async def _hold(self, ready: concurrent.futures.Future) -> None:
        from mcp import Client

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(Client(self._transport(stack), cache=None))
                self.client, self.alive = client, True
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits to start
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        finally:
            self.alive = False
            if self._errlog is not None:
                self._errlog.close()

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        source = self.source
        if source.command is not None:
            from mcp.client.stdio import StdioServerParameters, stdio_client

            self._errlog = open(source.stderr or os.devnull, "a")
            params = StdioServerParameters(command=source.command[0], args=source.command[1:],
                                           env=source.env or None, cwd=source.cwd)
            return stdio_client(params, errlog=self._errlog)
        from mcp.client.streamable_http import streamable_http_client

        if not source.headers:
            return streamable_http_client(source.url)
        from mcp.shared._httpx_utils import create_mcp_http_client

        return streamable_http_client(source.url, http_client=create_mcp_http_client(headers=source.headers))

    def list_tools(self, timeout: float) -> list[Any]:
        async def everything() -> list[Any]:
            tools, cursor = [], None
            while True:
                page = await self.client.list_tools(cursor=cursor)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return _loop().submit(asyncio.wait_for(everything(), timeout)).result(timeout + 5)

    def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if not self.alive:
            raise ConnectionError("the connection to the server is closed")
        future = _loop().submit(self.client.call_tool(name, arguments, read_timeout_seconds=timeout))
        try:
            return future.result(timeout + 2)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        except Exception as exc:
            if "timed out" in str(exc):
                raise concurrent.futures.TimeoutError() from exc
            raise

    def close(self) -> None:
        """Ends the session and waits (boundedly) for the SDK to stop the server's process tree."""
        _OPEN.discard(self)
        if self._task is None:
            return
        loop = _loop()
        if self._stop is not None:
            loop.loop.call_soon_threadsafe(self._stop.set)
        with contextlib.suppress(Exception):
            self._task.result(timeout=15)
        self._task = None


def _result_text(result: Any) -> tuple[str, bool]:
    """What the model reads of a ``tools/call`` result: its text parts, a line for each part of another kind, the
    structured content when there is no text; and whether the server marked it an error."""
    parts = []
    for part in getattr(result, "content", None) or []:
        kind = getattr(part, "type", "")
        if kind == "text":
            parts.append(tags.unicode_text(part.text))
        elif kind == "resource" and hasattr(getattr(part, "resource", None), "text"):
            parts.append(part.resource.text)
        else:
            parts.append(f"[{kind or 'content'} {getattr(part, 'mime_type', '') or ''}]".replace(" ]", "]"))
    if not parts and getattr(result, "structured_content", None) is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts) or "(no output)"
    failed = bool(getattr(result, "is_error", False))
    return (f"error: {text}" if failed and not text.startswith("error") else text), failed


def _reason(exc: BaseException) -> str:
    """An exception in one line; the SDK raises exception groups whose message says nothing."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _EventLoop:
    """The thread that runs the MCP SDK's event loop for every server of the process."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="arpo-mcp", daemon=True)
        self.thread.start()

    def submit(self, coroutine: Any) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


_LOOP: _EventLoop | None = None
_LOOP_LOCK = threading.Lock()
_OPEN: set[_Connection] = set()


def _loop() -> _EventLoop:
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or not _LOOP.thread.is_alive():
            _LOOP = _EventLoop()
            _quiet_sdk_logs()
        return _LOOP


def _quiet_sdk_logs() -> None:
    """The SDK logs a traceback for every line a server writes that is not JSON-RPC; a hostile server's garbage
    reaches the model as an error instead, so those records are dropped."""
    logging.getLogger("mcp.client.stdio").addFilter(
        lambda record: "Failed to parse JSONRPC message" not in record.getMessage())


@atexit.register
def _close_all() -> None:
    """Every server this process started stops with it."""
    for connection in list(_OPEN):
        connection.close()


if sys.version_info < (3, 11):  # pragma: no cover - BaseExceptionGroup is built in from 3.11
    from exceptiongroup import BaseExceptionGroup  # noqa: F401
