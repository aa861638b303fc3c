"""The protocol every tool follows: a name, a tag, `call`, `fork`, `snapshot`/`restore` and `close`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable


@dataclass
class ToolOutput:
    """What one tool call produced.

    `text` is what the model reads inside ``<result>…</result>``; a failure is text too (``failed`` says so), so the
    episode goes on and the model can react. `extra` holds tool-specific facts (cache hits, a restarted worker).
    """

    text: str
    failed: bool = False
    error: str | None = None
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """A tool the environment can run when the model writes ``<tag>query</tag>``.

    Stateless tools (search, browse) return ``self`` from `fork` and ``None`` from `snapshot`. Stateful tools (the
    Python interpreter) copy their state so the fork and the original evolve independently.
    """

    name: str
    tag: str

    def call(self, query: str) -> ToolOutput: ...

    def fork(self) -> "Tool": ...

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...

    def close(self) -> None: ...


class StatelessTool:
    """Base for tools whose calls do not depend on earlier calls (search, browse): forking is free, there is no
    state to snapshot, and closing one env's handle must not close a tool other envs share."""

    def fork(self) -> "StatelessTool":
        return self

    def snapshot(self) -> None:
        return None

    def restore(self, snapshot: Any) -> None:
        pass

    def close(self) -> None:
        pass


def python_tool_factory(sandbox: str = "local", options: dict[str, Any] | None = None) -> "Callable[[], Tool]":
    """A factory of ``<python>`` tools: the local sandbox (default) or E2B, with their options."""
    options = dict(options or {})
    if sandbox == "local":
        from arpo_env.sandbox import LocalSandbox, SandboxLimits

        preload = tuple(options.pop("preload", ())) or None
        limits = SandboxLimits(**options)
        return (lambda: LocalSandbox(limits, preload)) if preload else (lambda: LocalSandbox(limits))
    if sandbox == "e2b":
        from arpo_env.e2b_sandbox import E2BSandbox

        return lambda: E2BSandbox(**options)
    raise ValueError(f"unknown sandbox {sandbox!r}: use 'local' or 'e2b'")


def build_tools(tools: "Sequence[str]", sandbox: str = "local", sandbox_options: dict[str, Any] | None = None,
                search: str = "local", search_options: dict[str, Any] | None = None,
                browse_options: dict[str, Any] | None = None) -> "dict[str, Callable[[], Tool]]":
    """Tool factories by tag, from the tool names and backend options an environment was given."""
    factories: dict[str, Callable[[], Tool]] = {}
    for name in tools:
        if name == "python":
            factories[name] = python_tool_factory(sandbox, sandbox_options)
        elif name == "search":
            from arpo_env.search import search_tool_factory

            factories[name] = search_tool_factory(search, search_options)
        elif name == "browse":
            from arpo_env.browse import browse_tool_factory

            factories[name] = browse_tool_factory(browse_options)
        else:
            raise ValueError(f"unknown tool {name!r}; known: python, search, browse")
    return factories
