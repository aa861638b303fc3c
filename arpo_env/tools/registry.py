"""The tool backends, together: the protocol they share, and the choice of a backend by name.

* `arpo_env.tools.protocol` — `Tool`, `ToolOutput`, `StatelessTool`: what every backend implements;
* ``<python>``: `arpo_env.tools.sandbox` (the local forkable interpreter; its worker program is
  `arpo_env.tools.sandbox`) or `arpo_env.tools.e2b` (E2B cloud sandboxes);
* ``<search>``: `arpo_env.tools.search` (local BM25, ddgs, recorded);
* ``<browse>``: `arpo_env.tools.browse` (httpx + trafilatura, or an offline page store);
* `arpo_env.tools.cache` — the SQLite cache the search and browse backends share;
* a user's tools: `arpo_env.tools.functions` (a Python function) and `arpo_env.tools.mcp` (an MCP server's tools).

Backends import the protocol, never this registry; the registry imports a backend only when it is chosen, so
choosing one loads nothing else and nothing imports in a circle.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Sequence

from arpo_env.tools.protocol import StatelessTool, Tool, ToolOutput, ToolsetSource, ToolSpec, check_options

__all__ = ["StatelessTool", "Tool", "ToolOutput", "ToolsetFactory", "build_tools", "python_tool_factory"]

BUILT_IN = ("python", "search", "browse")


class ToolsetFactory:
    """The factory of a user's tools in an environment: called once per episode, it returns the `Toolset` that
    serves all of `specs` (the same factory stands under each of their tags)."""

    def __init__(self, source: ToolsetSource) -> None:
        self.source = source
        self.specs: tuple[ToolSpec, ...] = tuple(source.specs)

    def __call__(self) -> Any:
        return self.source.make()

    def __repr__(self) -> str:
        return f"ToolsetFactory({self.source!r})"


def is_toolset_source(entry: Any) -> bool:
    """Whether `entry` is a `ToolsetSource`, read from its class: ``isinstance`` with the protocol would read
    ``specs``, which starts an MCP server."""
    import inspect

    return not isinstance(entry, type) and all(
        inspect.getattr_static(entry, name, None) is not None for name in ("specs", "make"))


def toolset_source(entry: Any) -> ToolsetSource:
    """A user's tool as a `ToolsetSource`: a `FunctionTool` or `MCPTools` as it is, a plain function made a
    `FunctionTool`; anything else a `ValueError`."""
    if is_toolset_source(entry):
        return entry
    if callable(entry) and not isinstance(entry, type):
        from arpo_env.tools.functions import FunctionTool

        try:
            return FunctionTool(entry)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the function {getattr(entry, '__name__', entry)!r} cannot be a tool: {exc}") from None
    raise ValueError(f"a tool is a name (python, search, browse), a function, a FunctionTool or an MCPTools, not "
                     f"{type(entry).__name__} {str(entry)[:100]!r}")


def python_tool_factory(sandbox: str = "local", options: dict[str, Any] | None = None,
                        hide: Sequence[str] = ()) -> Callable[[], Tool]:
    """A factory of ``<python>`` tools: the local sandbox (default) or E2B, with their options. `hide`: paths the
    local sandbox's cells may not read, besides its options' ``hidden_paths`` (an environment's task files)."""
    options = dict(options or {})
    if sandbox == "local":
        from arpo_env.tools.sandbox.host import LocalSandbox, SandboxLimits

        # named here: SandboxLimits' own TypeError reaches the user wrapped in every keyword argument of the env
        check_options("sandbox_options", options, [f.name for f in dataclasses.fields(SandboxLimits)]
                      + ["preload", "fork_ahead"])
        preload = _entries("preload", options.pop("preload", ()), "a module's name or a list of them") or None
        ahead = options.pop("fork_ahead", False)
        if ahead not in (True, False):
            raise ValueError(f"sandbox_options: fork_ahead is true or false, not {ahead!r}")
        options["hidden_paths"] = _entries("hidden_paths", options.get("hidden_paths", ()),
                                           "a path or a list of paths") + tuple(hide)
        limits = SandboxLimits(**options)
        if preload:
            return lambda: LocalSandbox(limits, preload, fork_ahead=ahead)
        return lambda: LocalSandbox(limits, fork_ahead=ahead)
    if sandbox == "e2b":
        import inspect

        from arpo_env.tools.e2b import E2BSandbox

        check_options("sandbox_options", options, inspect.signature(E2BSandbox).parameters)  # else a wrapped TypeError
        E2BSandbox(**options)  # its options and key are checked when the env is made, not at its first reset
        return lambda: E2BSandbox(**options)
    raise ValueError(f"unknown sandbox {sandbox!r}: use 'local' or 'e2b'")


def _entries(name: str, value: Any, what: str) -> tuple[str, ...]:
    """A sandbox option that lists names or paths, as a tuple of strings: a string is one (one path, not its letters), a
    number a `ValueError` ."""
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if not (isinstance(value, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in value)):
        raise ValueError(f"sandbox_options: {name} must be {what}, not {type(value).__name__} {str(value)[:100]!r}")
    return tuple(os.fspath(v) for v in value)


def build_tools(tools: Sequence[Any], sandbox: str = "local", sandbox_options: dict[str, Any] | None = None,
                search: str = "local", search_options: dict[str, Any] | None = None,
                browse_options: dict[str, Any] | None = None,
                hide: Sequence[str] = ()) -> dict[str, Callable[[], Tool]]:
    """Tool factories by tag, from the tools and backend options an environment was given; `hide`: paths the
    local sandbox may not read (the files of the environment's tasks). `tools` as `tool_names` reads them: built-in
    tools by name, a user's as functions or toolset sources (each of its tools under its own name, one
    `ToolsetFactory` for them all). Two tools of one name are a `ValueError`. Options
    or a backend given for a tool that is not among them are a warning: they are not used (``search_options`` to an env
    without ``search``)."""
    tools = tool_names(tools)
    for what, options in (("sandbox_options", sandbox_options), ("search_options", search_options),
                          ("browse_options", browse_options)):
        if options is not None and not isinstance(options, Mapping):  # "dictionary update sequence element #0 …"
            raise ValueError(f"{what} is a dict of options, not {type(options).__name__} {str(options)[:100]!r}")
    factories: dict[str, Callable[[], Any]] = {}
    for name in tools:
        if not isinstance(name, str):
            factory = ToolsetFactory(toolset_source(name))
            for spec in factory.specs:
                if spec.name in factories:
                    raise ValueError(f"two tools are called {spec.name!r} (the second from {factory.source!r}); "
                                     "rename one (MCPTools takes prefix=)")
                factories[spec.name] = factory
            continue
        if name in factories:
            raise ValueError(f"two tools are called {name!r}; give each tool once")
        if name == "python":
            factories[name] = python_tool_factory(sandbox, sandbox_options, hide)
        elif name == "search":
            from arpo_env.tools.search import search_tool_factory

            factories[name] = search_tool_factory(search, search_options)
        elif name == "browse":
            from arpo_env.tools.browse import browse_tool_factory

            factories[name] = browse_tool_factory(browse_options)
        else:
            raise ValueError(f"unknown tool {name!r}; known: python, search, browse (a tool of your own is a function "
                             "or an MCPTools, given as itself, not by name)")
    unused = [what for what, tool, given in (("sandbox", "python", sandbox not in ("local", None)),
                                             ("sandbox_options", "python", bool(sandbox_options)),
                                             ("search", "search", search not in ("local", None)),
                                             ("search_options", "search", bool(search_options)),
                                             ("browse_options", "browse", bool(browse_options)))
              if given and tool not in factories]
    message = (f"{' and '.join(unused)} given, but the env has no tool they are for (its tools: "
               f"{', '.join(factories) or 'none'}): not used. Add the tool to tools= to use them") if unused else None
    if message is not None and message not in _WARNED:  # once a process: a run makes many envs of the same arguments
        import warnings

        _WARNED.add(message)
        warnings.warn(message, stacklevel=2)
    return factories


_WARNED: set[str] = set()


def tool_names(tools: Any) -> list[Any]:
    """The tools an environment's ``tools`` argument gives: a list (any iterable) of built-in tools' names and a
    user's tools (functions, `FunctionTool`, `MCPTools`), or a string naming one tool or several with commas
    (``"python"``, ``"search,python"``: one name, not its letters), or one user's tool; anything else a
    `ValueError`."""
    given = tools
    if isinstance(tools, str):
        tools = [name.strip() for name in tools.split(",") if name.strip()]
    elif isinstance(tools, Iterable) and not isinstance(tools, (bytes, bytearray, Mapping)):
        tools = list(tools)
    elif callable(tools) or is_toolset_source(tools):
        tools = [tools]
    else:
        tools = [given]  # refused below
    if not all(isinstance(t, str) or callable(t) or is_toolset_source(t) for t in tools):
        # tools are names or Tool objects: 5, [5] and b"python" are refused by what they are
        raise ValueError(f"tools are tool names (python, search, browse) as a list or one string, and a tool of your "
                         f"own is a function or an MCPTools in the list, not {type(given).__name__} "
                         f"{str(given)[:100]!r}")
    return tools
