"""A Python function as a tool: its name, its docstring's first paragraph and its typed signature are what the model
is told, and its return value is what the model reads.

    from arpo_env.tools.functions import tool

    @tool
    def convert(amount: float, unit: str = "km") -> float:
        \"\"\"Convert a distance to miles.

        Args:
            amount: The distance.
            unit: Its unit, "km" or "m".
        \"\"\"
        return amount * (0.621371 if unit == "km" else 0.000621371)

The model calls it as ``<convert>{"amount": 12.5, "unit": "km"}</convert>`` (a function of one ``str`` argument as
``<name>text</name>``). A function's calls must not depend on earlier calls: it is shared by every fork of an episode,
so forking costs nothing. A tool with state of its own that forks is a `arpo_env.tools.protocol.Toolset`.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from typing import Any, Callable

from arpo_env import tags
from arpo_env.tools.protocol import StatelessTool, ToolOutput, ToolSpec, elide, limit_problem

__all__ = ["FunctionTool", "tool"]

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", tuple: "array",
            dict: "object"}


class FunctionTool(StatelessTool):
    """A Python function as a tool (see the module docstring); made by `tool`. Calling it calls the function. It is
    stateless (`StatelessTool`): every episode and fork shares it.

    Args:
        function: A function whose parameters have type annotations (``str``, ``int``, ``float``, ``bool``, lists,
            dicts, optional forms of these, or ``typing.Literal``) and no ``*args``/``**kwargs``.
        name: The tool's name, written as its tag (default: the function's name).
        description: What the model is told it does (default: the docstring's first paragraph).
        max_output_chars: Longer return values are cut to this many characters, with a note saying how many went.
        timeout_s: If given, a call that has not returned after this many seconds is an error the model reads, and
            the episode goes on. The call runs in a thread of its own, which Python cannot stop: it finishes in the
            background. Without it (the default) a call runs in the env's thread, as long as it takes.
    """

    def __init__(self, function: Callable[..., Any], name: str | None = None, description: str | None = None,
                 max_output_chars: int = 8000, timeout_s: float | None = None) -> None:
        if not callable(function):
            raise TypeError(f"a function tool wraps a function, not {type(function).__name__}")
        self.function = function
        self.name = tags.check_tool_name(name if name is not None else getattr(function, "__name__", ""))
        doc = inspect.getdoc(function) or ""
        self.description = description if description is not None else _summary(doc)
        self.max_output_chars = int(max_output_chars)
        problem = limit_problem("timeout_s", timeout_s, None) if timeout_s is not None else None
        if problem:
            raise ValueError(f"{self.name}: {problem}")
        self.timeout_s = timeout_s
        self.parameters = _schema(function, _arg_docs(doc))
        self.specs = (ToolSpec(self.name, self.description, self.parameters),)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference, as functions are: ``@tool`` puts this object where the function's name was, so the
        function itself is no longer found by its name (an env pickles with its arguments)."""
        module, name = getattr(self.function, "__module__", None), getattr(self.function, "__qualname__", "")
        if module and _global(module, name) is self:
            return _global, (module, name)
        return FunctionTool, (self.function, self.name, self.description, self.max_output_chars, self.timeout_s)

    # ToolsetSource and Toolset: a stateless function is its own toolset, shared by every episode and fork
    def make(self) -> "FunctionTool":
        return self

    def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """The function's return value as text (a string as it is, other values as JSON where they can be, else
        their ``str``); an exception it raises is an error the model reads."""
        try:
            value = self._call(arguments)
        except TimeoutError:
            return ToolOutput(f"error: {self.name} did not return within {self.timeout_s:g} s", failed=True,
                              error="timeout")
        except Exception as exc:  # noqa: BLE001 - the model's arguments can make any function fail
            return ToolOutput(f"error: {type(exc).__name__}: {exc}", failed=True, error=f"{type(exc).__name__}: {exc}")
        text = _as_text(value)
        text, dropped = elide(text, self.max_output_chars)
        return ToolOutput(text, extra={"truncated_chars": dropped} if dropped else {})

    def _call(self, arguments: dict[str, Any]) -> Any:
        if self.timeout_s is None:
            return self.function(**arguments)
        import concurrent.futures
        import threading

        done: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            try:
                done.set_result(self.function(**arguments))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        threading.Thread(target=work, name=f"tool-{self.name}", daemon=True).start()
        try:
            return done.result(self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError from None



def tool(function: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None,
         max_output_chars: int = 8000, timeout_s: float | None = None) -> Any:
    """Make a function a tool: ``@tool`` or ``@tool(name="lookup")``. Returns a `FunctionTool`, which an environment
    takes in its ``tools`` (``gym.make("ARPO-Math-v0", tools=["python", convert])``) and which still calls the
    function when called."""
    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description, max_output_chars=max_output_chars,
                            timeout_s=timeout_s)

    return wrap(function) if function is not None else wrap


def _global(module: str, qualname: str) -> Any:
    """The object a module holds under a dotted name, or None."""
    import importlib

    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
        return found
    except (ImportError, AttributeError):
        return None


def _summary(doc: str) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters):\s*$")


def _arg_docs(doc: str) -> dict[str, str]:
    """Each argument's description from a Google-style ``Args:`` section (``name: text`` or ``name (type): text``,
    continued on more indented lines)."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    inside, current, indent = False, None, None
    for line in lines:
        if _ARGS_HEADER.match(line.strip()):
            inside, current, indent = True, None, None
            continue
        if not inside:
            continue
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if indent is None:
            indent = width
        if width < indent or (width == 0 and line.strip().endswith(":")):
            inside = False
            continue
        m = re.match(r"\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line)
        if width == indent and m:
            current = m.group(1).lstrip("*")
            out[current] = m.group(2).strip()
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
    return out


def _schema(function: Callable[..., Any], docs: dict[str, str]) -> dict[str, Any]:
    """The JSON schema object of the function's arguments."""
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: read as written
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(function).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"{function.__name__}: a tool's arguments are named (*{p.name} and **{p.name} cannot be "
                            "described to the model)")
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"{function.__name__}: the argument {p.name!r} is positional-only; a tool's arguments are "
                            "given by name")
        annotation = hints.get(p.name, p.annotation)
        if annotation is inspect.Parameter.empty:
            raise TypeError(f"{function.__name__}: the argument {p.name!r} has no type annotation; the model is told "
                            "each argument's type (str, int, float, bool, list, dict)")
        schema = _json_schema(annotation, f"{function.__name__}({p.name})")
        if p.name in docs:
            schema["description"] = docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        elif p.default is None or isinstance(p.default, (str, int, float, bool)):
            schema["default"] = p.default
        properties[p.name] = schema
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def _json_schema(annotation: Any, where: str) -> dict[str, Any]:
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if annotation is type(None) or annotation is None:
        return {"type": "null"}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        kinds = sorted({_SCALARS.get(type(a), "string") for a in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        parts = [_json_schema(a, where) for a in args]
        kinds: list[str] = []
        for part in parts:
            kind = part.get("type")
            kinds += kind if isinstance(kind, list) else [kind]
        return {"type": kinds[0] if len(set(kinds)) == 1 else list(dict.fromkeys(kinds))}
    if origin in _SCALARS:
        schema: dict[str, Any] = {"type": _SCALARS[origin]}
        if origin in (list, tuple) and args and args[-1] is not Ellipsis:
            schema["items"] = _json_schema(args[0], where)
        return schema
    raise TypeError(f"{where}: a tool's argument is str, int, float, bool, a list, a dict, a Literal or an optional "
                    f"one of these, not {annotation!r}")


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return tags.unicode_text(value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if value is None:
        return "(no output)"
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)
