"""The protocol every tool follows: a name, a tag, `call`, `fork`, `snapshot`/`restore` and `close`."""

from __future__ import annotations

import difflib
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
