"""The system prompt and user turn of the environments (our own wording; the release's prompts are not used)."""

from __future__ import annotations

from typing import Mapping

from arpo_env import tags
from arpo_env.tools.protocol import ToolSpec

_TOOL_LINES = {
    tags.PYTHON: "<python>code</python> runs Python in a persistent interpreter: variables stay defined between "
                 "calls, numpy and sympy are available, and you see what the code prints (and the value of its "
                 "last line).",
    tags.SEARCH: "<search>query</search> searches the web and returns the top results.",
    tags.BROWSE: "<browse>url</browse> reads a web page and returns its main text.",
}

_EXAMPLE = {
    tags.PYTHON: "<think>I need the product of 1234 and 5678.</think>\n<python>print(1234 * 5678)</python>\n"
                 "<result>\n7006652\n</result>\n<answer>\\boxed{7006652}</answer>",
    tags.SEARCH: "<think>I need to look up the capital of Australia.</think>\n<search>capital of Australia</search>\n"
                 "<result>\n1. Canberra is the capital city of Australia …\n</result>\n"
                 "<answer>\\boxed{Canberra}</answer>",
}


def system_prompt(tools: tuple[str, ...] | list[str], max_tool_calls: int,
                  specs: Mapping[str, ToolSpec] | None = None) -> str:
    """Tell the model the protocol: think, call tools by tag, read results, answer in a box; without tools (``arpo
    eval --mode direct``), think and answer in a box (it told of tools and a budget of calls, listing none). A tool
    of the user's is listed with its call's form (`arpo_env.tags.call_form`), its description and its arguments'."""
    if not tools:
        return ("You are a careful problem solver.\nReason step by step inside <think> </think>.\nWhen you know the "
                "answer, write it as <answer>\\boxed{your final answer}</answer> and stop.")
    lines = [
        "You are a careful problem solver who can use tools.",
        "Reason step by step inside <think> </think>. While reasoning you may call a tool:",
        *(f"- {_TOOL_LINES[t]}" if t in _TOOL_LINES else f"- {_tool_line(specs[t])}" for t in tools
          if t in _TOOL_LINES or (specs and t in specs)),
        *(["A call written as {…} takes its arguments as one JSON object."] if specs and any(
            t not in _TOOL_LINES and tags.text_argument(specs[t].parameters) is None for t in tools if t in specs)
          else []),
        "Write one tool call at a time and stop after its closing tag; the result comes back inside "
        "<result> </result>.",
        f"You can make at most {max_tool_calls} tool calls.",
        "When you know the answer, write it as <answer>\\boxed{your final answer}</answer> and stop.",
    ]
    example = next((_EXAMPLE[t] for t in tools if t in _EXAMPLE), _EXAMPLE[tags.PYTHON])
    return "\n".join([*lines, "", "Example:", example])


def _tool_line(spec: ToolSpec) -> str:
    """``<convert>{"amount": number, "unit": string (optional)}</convert> converts … amount: the distance; unit: …``"""
    line = tags.call_form(spec.name, spec.parameters)
    if spec.description:
        line += ": " + spec.description.rstrip(".") + "."
    notes = [f"{name}: {schema['description'].rstrip('.')}" for name, schema in
             dict(spec.parameters.get("properties") or {}).items()
             if isinstance(schema, Mapping) and schema.get("description")]
    return line + (" " + "; ".join(notes) + "." if notes else "")


def user_turn(question: str) -> str:
    return f"{question.strip()}\n\nPut the final answer in <answer>\\boxed{{}}</answer>."
