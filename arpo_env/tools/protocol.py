"""The protocols tools follow.

* `Tool`: one built-in tool called by its tag with one text argument (``<python>code</python>``): a name, a tag,
  `call`, `fork`, `snapshot`/`restore` and `close`;
* `Toolset`: tools a user brings (a Python function, an MCP server's tools), each described by a `ToolSpec` (a name,
  a description, a JSON schema of its arguments) and called with the arguments the environment read from the call
  (`arpo_env.tags.call_arguments`). One toolset object serves all its tools in an episode, so that tools sharing
  state (one MCP server's) fork together.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, runtime_checkable


def did_you_mean(names: Iterable[str], known: Iterable[str]) -> str:
    """``"topk (did you mean top_k?), nope"``: each name with the nearest of `known`, where one is near."""
    known = list(known)
    return ", ".join(f"{name} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, 1))
                     else name for name in names)


def check_options(what: str, options: Iterable[str], known: Iterable[str]) -> None:
    """A `ValueError` naming the options (of ``sandbox_options``, ``search_options``, …) that are not `known`, with
    the nearest known one and the list: a misspelt option was ignored, silently, or a TypeError."""
    known = list(known)
    unknown = [str(name) for name in options if name not in known]
    if unknown:
        raise ValueError(f"{what}: unknown {did_you_mean(unknown, known)}; the options are {', '.join(known)}")


MAX_SECONDS = 100_000_000
"""The longest time limit a tool takes (three years): past about 10^10 s every call failed (an OverflowError)."""
MAX_WHOLE = 2 ** 40
"""The largest count or size a tool's limit takes: a sandbox memory_mb of 2^62 killed the worker at every cell."""
PATH_TYPES = (str, os.PathLike)
"""What an option that names a file or folder may be (`type_problem`)."""


def limit_problem(name: str, value: Any, low: int | float | None, high: int | float = MAX_WHOLE) -> str | None:
    """What is wrong with `value` as the option `name`, or None: a whole number from `low` (an int) to `high`, or
    seconds (`low` a float, or None for above 0) up to `high`. A limit no tool can run under (text for a number, a
    negative time, one past what the system takes) made a tool whose every call failed, for the whole run."""
    whole = isinstance(low, int)
    number = not isinstance(value, bool) and isinstance(value, int if whole else (int, float))
    if number and math.isfinite(value) and (value > 0 if low is None else value >= low) and value <= high:
        return None
    what = (f"a whole number of at least {low}" if whole else "a number of seconds above 0" if low is None
            else f"a number of seconds of at least {low:g}")
    return f"{name} must be {what} and at most {high:,}, not {value!r}"


def type_problem(name: str, value: Any, what: str, *types: type) -> str | None:
    """What is wrong with `value` as the option `name`, or None: one of `types` (None always passes: the default),
    described as `what`. A path given as a number was a TypeError naming no option; a flag given as text was true."""
    if value is None or isinstance(value, types):
        return None
    return f"{name} must be {what}, not {type(value).__name__} {str(value)[:100]!r}"


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


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told of a tool, and how its calls are read: `name` (also its tag), `description`, and
    `parameters`, a JSON schema object of its arguments (``{"type": "object", "properties": {…}, "required": […]}``,
    the form MCP's ``inputSchema`` and OpenAI's function tools use)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_dict(self) -> dict[str, Any]:
        """The tool as OpenAI's and TRL's chat templates take it (``{"type": "function", "function": {…}}``)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@runtime_checkable
class Toolset(Protocol):
    """Tools an environment offers besides the built-in ones, made once per episode by a `ToolsetSource`.

    `run(name, arguments)` calls the tool `name` of `specs` with its checked arguments and returns what the model
    reads; a failure is a `ToolOutput` with ``failed`` set, not an exception. `fork`, `snapshot`, `restore` and
    `close` work as `Tool`'s, for all the set's tools at once.
    """

    specs: tuple[ToolSpec, ...]

    def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput: ...

    def fork(self) -> "Toolset": ...

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ToolsetSource(Protocol):
    """What a user gives an environment as tools (`arpo_env.tools.functions.FunctionTool`,
    `arpo_env.tools.mcp.MCPTools`): the specs of its tools, known when the environment is made, and `make()`, which
    returns the `Toolset` of one episode."""

    @property
    def specs(self) -> tuple[ToolSpec, ...]: ...

    def make(self) -> Toolset: ...


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


def elide(text: str, limit: int) -> tuple[str, int]:
    """`text` cut to about `limit` characters, its first three quarters and its last quarter kept (a tool's last
    lines are often what it was asked for; a traceback ends there too), with a line in between that says how many
    were left out; and that number (0: `text` as it is)."""
    if len(text) <= limit:
        return text, 0
    tail = limit // 4
    dropped = len(text) - limit
    return (text[: limit - tail] + f"\n[output truncated: {dropped:,} characters not shown]\n"
            + (text[-tail:] if tail else "")), dropped


def snapshot_cells(snapshot: Any) -> list[str]:
    """The cells an interpreter's snapshot (``{"cells": [code, …]}``, or None: none) replays, checked: a string
    would run letter by letter, so anything else is a `ValueError`."""
    cells = (snapshot or {}).get("cells", []) if isinstance(snapshot, (dict, type(None))) else None
    if not (isinstance(cells, list) and all(isinstance(c, str) for c in cells)):
        raise ValueError(f"a Python snapshot is {{'cells': [code, …]}}, not {str(snapshot)[:100]}")
    return list(cells)
