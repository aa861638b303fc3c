"""Every rule about the text protocol's tags lives here.

The model writes plain text with a few XML-like tags::

    <think> reasoning … </think>
    <python> code </python>       <search> query </search>       <browse> url </browse>
    <result> the tool's output, written by the environment </result>
    <answer> \\boxed{final answer} </answer>

Tool calls may stand at the top level or inside ``<think>``. The inside of a tool call, a result or an answer is
opaque: tags written there (``print("<answer>")``) are text, not structure.

An environment may have tools of its own besides the three built in (a Python function, an MCP server's tools:
`arpo_env.tools.functions`, `arpo_env.tools.mcp`). Each is called by its name as a tag; a tool with several
arguments takes them as a JSON object, a tool with one text argument takes the text itself::

    <convert>{"amount": 12.5, "unit": "km"}</convert>      <lookup>ARPO</lookup>

The functions that parse a transcript take the tags of its environment's tools (`tool_tags`; the built-in three by
default), and `call_arguments` reads a call's arguments against the tool's schema.
"""

from __future__ import annotations

import functools
import json
import re
import textwrap
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

THINK, PYTHON, SEARCH, BROWSE, RESULT, ANSWER = "think", "python", "search", "browse", "result", "answer"
TOOL_TAGS = (PYTHON, SEARCH, BROWSE)
ALL_TAGS = (THINK, PYTHON, SEARCH, BROWSE, RESULT, ANSWER)
TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
"""What a tool's name may be, as it is written as a tag: a letter, then letters, digits, ``_``, ``.`` or ``-``."""
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*[ \t]*\n?|\n?[ \t]*```\s*$")


@dataclass(frozen=True)
class Span:
    """One complete ``<tag>content</tag>`` in a text; `start`/`end` cover the tags themselves. The content is cut
    from the text when it is read (a span keeps the text and where its content lies), so that parsing stays linear
    in the text's length when spans nest (``<think>`` written inside ``<think>`` thousands of times)."""

    tag: str
    start: int
    end: int
    body: tuple[int, int] = field(repr=False)
    text: str = field(repr=False, compare=False)

    @property
    def content(self) -> str:
        return self.text[self.body[0]:self.body[1]]


def close_tags(tags: tuple[str, ...] | list[str] = TOOL_TAGS) -> list[str]:
    """Stop strings for a generator: it stops when one of these tool calls, or the answer, is closed."""
    return [f"</{t}>" for t in tags] + [f"</{ANSWER}>"]


@functools.lru_cache(maxsize=64)
def _grammar(tool_tags: tuple[str, ...]) -> tuple[re.Pattern, frozenset[str]]:
    """The pattern of every tag of a protocol whose tools are `tool_tags`, and the tags whose inside is opaque."""
    names = sorted({THINK, RESULT, ANSWER, *tool_tags}, key=len, reverse=True)
    pattern = re.compile(r"<(/?)(" + "|".join(re.escape(n) for n in names) + r")>")
    return pattern, frozenset({*tool_tags, RESULT, ANSWER})


def protocol_tags(tool_tags: Sequence[str]) -> tuple[str, ...]:
    """The tool tags a transcript of an environment with these tools is parsed with: the built-in three (a call to
    one the env lacks is answered as such) and the env's own."""
    return tuple(dict.fromkeys([*TOOL_TAGS, *tool_tags]))


def check_tool_name(name: Any) -> str:
    """`name` if a tool may be called by it as a tag, else a `ValueError` that says why: the protocol's own tags
    (think, result, answer) are taken, and a name must match `TOOL_NAME`."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ValueError(f"a tool's name is written as a tag: a letter, then up to 63 letters, digits, '_', '.' or "
                         f"'-'; {str(name)[:100]!r} is not one (rename the tool)")
    if name in (THINK, RESULT, ANSWER):
        raise ValueError(f"a tool cannot be called {name!r}: <{name}> is a tag of the protocol itself (rename it)")
    return name


def spans(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> tuple[list[Span], list[str]]:
    """Parse `text` into its complete top-level and think-nested spans, and a list of structural errors."""
    pattern, opaque = _grammar(tuple(tool_tags))
    found: list[Span] = []
    errors: list[str] = []
    stack: list[tuple[str, int, int]] = []  # (tag, start of open tag, end of open tag)
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if stack and stack[-1][0] in opaque:  # inside an opaque span only its own closing tag counts
            if closing and tag == stack[-1][0]:
                _, start, body = stack.pop()
                found.append(Span(tag, start, m.end(), (body, m.start()), text))
            continue
        if not closing:
            if stack and (tag == THINK or tag == ANSWER):
                errors.append(f"<{tag}> opened inside <{stack[-1][0]}>")
            stack.append((tag, m.start(), m.end()))
        elif stack and stack[-1][0] == tag:
            _, start, body = stack.pop()
            found.append(Span(tag, start, m.end(), (body, m.start()), text))
        else:
            errors.append(f"</{tag}> without a matching <{tag}>")
    errors.extend(f"<{tag}> is never closed" for tag, _, _ in stack)
    found.sort(key=lambda s: s.start)
    return found, errors


def unclosed_tag(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> str | None:
    """The tag left open at the end of `text`, if any (an action cut off before its closing tag)."""
    pattern, opaque = _grammar(tuple(tool_tags))
    stack: list[str] = []
    for m in pattern.finditer(text):
        closing, tag = m.group(1) == "/", m.group(2)
        if stack and stack[-1] in opaque:
            if closing and tag == stack[-1]:
                stack.pop()
            continue
        if not closing:
            stack.append(tag)
        elif stack and stack[-1] == tag:
            stack.pop()
    return stack[-1] if stack else None


def last_call(text: str, tags: tuple[str, ...] | list[str]) -> Span | None:
    """The last complete tool call among `tags` in `text` (what an action ends with)."""
    calls = [s for s in spans(text, protocol_tags(tags))[0] if s.tag in tags]
    return calls[-1] if calls else None


def answer(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> Span | None:
    """The last complete ``<answer>`` span."""
    found = [s for s in spans(text, tool_tags)[0] if s.tag == ANSWER]
    return found[-1] if found else None


def tool_calls(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> list[Span]:
    return [s for s in spans(text, tool_tags)[0] if s.tag in tool_tags]


def unanswered_calls(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> list[Span]:
    """Tool calls not followed by a ``<result>``: calls that never ran (several in one action: the env runs none;
    or a completion that writes tool tags where no tool was ever attached)."""
    found = spans(text, tool_tags)[0]  # sorted by start
    starts = [s.start for s in found]
    missing = []
    for span in found:
        if span.tag in tool_tags:
            i = bisect_left(starts, span.end)  # the first span that starts after the call
            if i == len(found) or found[i].tag != RESULT:
                missing.append(span)
    return missing


def ran_tools(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> set[str]:
    """The tools whose calls got a ``<result>`` in the transcript (what the multi-tool bonus may count when the
    environment's own record is not at hand)."""
    unanswered = {(s.start, s.end) for s in unanswered_calls(text, tool_tags)}
    return {s.tag for s in tool_calls(text, tool_tags) if (s.start, s.end) not in unanswered}


def model_text(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> str:
    """The transcript without its ``<result>…</result>`` blocks: only what the model wrote."""
    results = [s for s in spans(text, tool_tags)[0] if s.tag == RESULT]
    out, last = [], 0
    for r in results:
        out.append(text[last:r.start])
        last = r.end
    return "".join(out) + text[last:]


def strip_code_fences(code: str) -> str:
    """Models often put Markdown fences inside ``<python>``; the interpreter should not see them."""
    return _FENCE.sub("", code) if "```" in code else code


def python_code(content: str) -> str:
    """What the interpreter runs of a ``<python>`` call's content: without Markdown fences (`strip_code_fences`) and
    without the indentation common to all its lines (a call written inside an indented block of the model's text was
    an ``IndentationError``). Code whose first line is not indented is left as it is."""
    code = strip_code_fences(content)
    first = next((line for line in code.split("\n") if line.strip()), "")
    return textwrap.dedent(code) if first[:1] in (" ", "\t") else code


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def _brace_tokens(pattern: re.Pattern, text: str):
    """The tokens of `pattern` in `text` (openers ending in ``{``, plain ``{`` and ``}``), each with the opener a
    ``}`` closes (None for an opener, and for a ``}`` that closes nothing). One pass with a stack, so linear in the
    text: the model's answer is hostile input, and matching each opener by scanning forward from it took 13 s on
    4,000 nested boxes (36 KB)."""
    stack: list[re.Match] = []
    for m in pattern.finditer(text):
        if m.group() == "}":
            yield m, (stack.pop() if stack else None)
        else:
            stack.append(m)
            yield m, None


def boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{…}`` (or ``\fbox{…}``), braces matched; None if there is none."""
    best: tuple[int, int] | None = None
    for m, opener in _brace_tokens(_BOXED, text):
        if opener is not None and opener.group() != "{" and (best is None or opener.end() > best[0]):
            best = (opener.end(), m.start())
    return text[best[0]:best[1]] if best else None


def final_answer(text: str, tool_tags: Sequence[str] = TOOL_TAGS) -> str | None:
    r"""The model's final answer: the ``\boxed{}`` inside the last ``<answer>``, or the answer's text."""
    span = answer(text, tool_tags)
    if span is None:
        return None
    inner = boxed(span.content)
    return (inner if inner is not None else span.content).strip()


MATH_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
"""The delimiters of LaTeX's math mode, as they wrap a whole answer."""
_WRAPPERS_AND_BRACES = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|textnormal|textup|emph|underline|"
                                  r"mathrm|mathbf|mathit|mathsf|mathtt|mathnormal|boldsymbol|bm|mbox|operatorname)"
                                  r"\s*\{|[{}]")


def unwrap_text(answer: str) -> str:
    r"""An answer without LaTeX text wrappers and math delimiters: ``\text{Paris}`` → ``Paris``, ``$D$`` → ``D``
    (for QA and multiple-choice scoring; math equivalence parses LaTeX itself). Braces are matched, so
    ``\text{a{b}c}`` keeps its inner braces."""
    text = str(answer)
    out: list[str] = []
    last = 0
    for m, opener in _brace_tokens(_WRAPPERS_AND_BRACES, text):  # a wrapper goes, and so does the brace closing it
        out.append(text[last:m.start()])
        last = m.end()
        if m.group() == "{" or (m.group() == "}" and (opener is None or opener.group() == "{")):
            out.append(m.group())
    out.append(text[last:])
    text = "".join(out)
    text = text.strip()
    for left, right in MATH_DELIMITERS:
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            text = text[len(left): len(text) - len(right)].strip()
    return text


def eval_answer(text: str) -> str | None:
    r"""The final answer as benchmarks extract it, whatever the format: the last ``<answer>`` (its ``\boxed{}``,
    else its text), else the last ``\boxed{}`` the model wrote (tool results are not the model's), else None."""
    found = final_answer(text)
    if found is not None:
        return found
    inner = boxed(model_text(text))
    return inner.strip() if inner is not None else None


def wrap_result(output: str) -> str:
    """The observation appended after a tool call.

    A result is opaque (tags inside it are text), so only a ``</result>`` in the tool's output could end it early;
    those are escaped. It is valid Unicode (`unicode_text`): what a cell prints can hold lone surrogates, which no
    tokenizer encodes.
    """
    safe = re.sub(r"<(/?)result>", r"&lt;\1result&gt;", unicode_text(output))
    return f"\n<{RESULT}>\n{safe}\n</{RESULT}>\n"


_SURROGATE = re.compile("[\ud800-\udfff]")


def unicode_text(text: str) -> str:
    """`text` with the surrogate code points a Python string may hold (``print(chr(0xd800))``, a lone half of an
    escaped pair) made valid: a pair becomes the character it encodes, a lone one U+FFFD. UTF-8 has no encoding for
    them, so a tokenizer refuses the string, and so would any UTF-8 file the text is written to."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def format_errors(completion: str, strict_think: bool = False, require_boxed: bool = True,
                  require_results: bool = True, tool_tags: Sequence[str] = TOOL_TAGS) -> list[str]:
    r"""Why a completion breaks the format; empty when it is well-formed.

    Well-formed means: tags balanced and properly nested, exactly one final ``<answer>`` holding a ``\boxed{}``
    (when `require_boxed`), no tool call after the answer, and (when `require_results`, the default, as in the
    reference code) every tool call answered by a ``<result>``: tool tags that never ran are a format error. Tags
    inside a ``<result>`` are the tool's text, never the model's. With `strict_think` (the reference implementation's
    ``<think>`` rule, off by default) the completion must also open with ``<think>`` and close it before the answer.
    """
    found, errors = spans(completion, tool_tags)
    answers = [s for s in found if s.tag == ANSWER]
    if not answers:
        errors.append("no <answer>…</answer>")
    else:
        last = answers[-1]
        if len(answers) > 1:
            errors.append(f"{len(answers)} answers")
        if require_boxed and boxed(last.content) is None:
            errors.append(r"the answer has no \boxed{}")
        if any(s.tag in tool_tags and s.start > last.start for s in found):
            errors.append("a tool call after the answer")
        if require_results:
            errors += [f"a <{s.tag}> call got no <result>" for s in unanswered_calls(completion, tool_tags)
                       if s.start < last.start]
        if strict_think:
            thinks = [s for s in found if s.tag == THINK]
            if not completion.lstrip().startswith(f"<{THINK}>"):
                errors.append("does not start with <think>")
            elif not thinks or thinks[0].end > last.start:
                errors.append("<think> not closed before the answer")
    return errors


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
    "object": (dict,), "null": (type(None),)}


def text_argument(parameters: Mapping[str, Any]) -> str | None:
    """The argument a call's plain text fills, for a tool whose schema has exactly one argument and it is text
    (``<lookup>ARPO</lookup>`` rather than ``<lookup>{"key": "ARPO"}</lookup>``); None for any other tool."""
    properties = dict(parameters.get("properties") or {})
    if len(properties) != 1:
        return None
    name, schema = next(iter(properties.items()))
    kinds = schema.get("type") if isinstance(schema, Mapping) else None
    return name if kinds == "string" or (isinstance(kinds, list) and "string" in kinds) else None


def call_arguments(body: str, tool: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a call's `body` gives the tool `tool`, whose arguments `parameters` describes (a JSON schema
    object, as MCP lists it): a JSON object (Markdown fences around it are dropped), or for a tool of one text
    argument (`text_argument`) the text itself. A body that is neither, an unknown or missing argument, or a value of
    the wrong JSON type is a `ValueError` whose message the model reads in its ``<result>``, naming the form."""
    properties = dict(parameters.get("properties") or {})
    text = strip_code_fences(body).strip()
    single = text_argument(parameters)
    form = call_form(tool, parameters)
    if single is not None and not text.startswith("{"):
        return {single: body.strip("\n")}
    try:
        arguments = json.loads(text) if text else {}
    except ValueError as exc:
        raise ValueError(f"the arguments of <{tool}> are a JSON object ({exc.msg} at character {exc.pos}); "
                         f"call it as {form}") from None
    if not isinstance(arguments, dict):
        if single is not None:
            return {single: body.strip("\n")}
        raise ValueError(f"the arguments of <{tool}> are a JSON object, not {type(arguments).__name__}; call it as "
                         f"{form}")
    unknown = [name for name in arguments if name not in properties]
    if unknown and parameters.get("additionalProperties", False) is False and properties:
        raise ValueError(f"<{tool}> has no argument {', '.join(map(repr, unknown))}; its arguments are "
                         f"{', '.join(properties) or 'none'}: call it as {form}")
    missing = [name for name in parameters.get("required") or () if name not in arguments]
    if missing:
        raise ValueError(f"<{tool}> needs the argument {', '.join(map(repr, missing))}: call it as {form}")
    for name, value in arguments.items():
        kinds = (properties.get(name) or {}).get("type") if isinstance(properties.get(name), Mapping) else None
        kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
        allowed = tuple(t for k in kinds for t in _JSON_TYPES.get(k, (object,)))
        wrong_bool = isinstance(value, bool) and "boolean" not in kinds
        if allowed and (not isinstance(value, allowed) or wrong_bool):
            raise ValueError(f"the argument {name!r} of <{tool}> is {' or '.join(kinds)}, not "
                             f"{_json_kind(value)} {json.dumps(value)[:60]}: call it as {form}")
        choices = (properties.get(name) or {}).get("enum") if isinstance(properties.get(name), Mapping) else None
        if choices and value not in choices:
            raise ValueError(f"the argument {name!r} of <{tool}> is one of {', '.join(map(json.dumps, choices))}, "
                             f"not {json.dumps(value)[:60]}")
    return arguments


def _json_kind(value: Any) -> str:
    return next((k for k, types in _JSON_TYPES.items() if isinstance(value, types) and not
                 (k in ("integer", "number") and isinstance(value, bool))), type(value).__name__)


def call_form(tool: str, parameters: Mapping[str, Any]) -> str:
    """How a call of `tool` is written, for the system prompt and the error messages:
    ``<convert>{"amount": number, "unit": string}</convert>``, or ``<lookup>key</lookup>`` for a tool of one text
    argument. Optional arguments say so."""
    single = text_argument(parameters)
    if single is not None:
        return f"<{tool}>{single}</{tool}>"
    required = set(parameters.get("required") or ())
    fields = []
    for name, schema in dict(parameters.get("properties") or {}).items():
        kind = schema.get("type", "value") if isinstance(schema, Mapping) else "value"
        kind = " or ".join(kind) if isinstance(kind, list) else kind
        fields.append(f'"{name}": {kind}' + ("" if name in required else " (optional)"))
    return f"<{tool}>{{{', '.join(fields)}}}</{tool}>"
