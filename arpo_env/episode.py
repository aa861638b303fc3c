"""`EpisodeState`: where an episode stands, apart from its tools' own state; the part of an env that crosses the
wire and goes into snapshots."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arpo_env.datasets.task import Task


@dataclass
class EpisodeState:
    """Everything that defines where an episode stands, apart from the tools' own state."""

    task: Task
    segments: list[tuple[str, str]] = field(default_factory=list)
    """The completion so far as (kind, text) pieces: kind is "action" (the model's) or "observation" (the env's)."""
    tool_calls: dict[str, int] = field(default_factory=dict)
    turns: int = 0
    done: bool = False
    unavailable_calls: int = 0
    """Calls to a tool this env does not have: answered with an error result, and counted against the budget."""
    refused_calls: int = 0
    """Turns that wrote more than one tool call: none ran; answered with an error result, and counted against the
    budget (one each)."""

    @property
    def completion(self) -> str:
        return "".join(text for _, text in self.segments)

    @property
    def total_tool_calls(self) -> int:
        return sum(self.tool_calls.values())

    @property
    def budget_used(self) -> int:
        """Calls counted against ``max_tool_calls``: those that ran, those to a tool the env lacks, and the turns
        refused for writing several."""
        return self.total_tool_calls + self.unavailable_calls + self.refused_calls

    def copy(self) -> "EpisodeState":
        return EpisodeState(self.task, list(self.segments), dict(self.tool_calls), self.turns, self.done,
                            self.unavailable_calls, self.refused_calls)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task.as_dict(), "segments": [list(s) for s in self.segments],
                "tool_calls": dict(self.tool_calls), "turns": self.turns, "done": self.done,
                "unavailable_calls": self.unavailable_calls, "refused_calls": self.refused_calls}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EpisodeState":
        """The state `to_dict` wrote; a `ValueError` saying what is amiss for one of other types (a snapshot edited or
        damaged)."""
        counts = [d["turns"], d.get("unavailable_calls", 0), d.get("refused_calls", 0), *dict(d["tool_calls"]).values()]
        if not (isinstance(d["task"], dict) and isinstance(d["done"], bool) and isinstance(d["segments"], list)
                and all(isinstance(s, (list, tuple)) and len(s) == 2 and all(isinstance(p, str) for p in s)
                        for s in d["segments"])
                and all(whole_number(c) is not None and whole_number(c) >= 0 for c in counts)):
            raise ValueError("its task is an object, its segments [kind, text] pairs, its done true or false and its "
                             "counts whole numbers")
        segments: list[Any] = [tuple(s) for s in d["segments"]]
        return cls(Task.from_dict(d["task"]), segments, dict(d["tool_calls"]), int(d["turns"]), d["done"],
                   int(d.get("unavailable_calls", 0)), int(d.get("refused_calls", 0)))


def whole_number(value: Any) -> int | None:
    """`value` as a whole number (an int, numpy's included, or a float such as 3.0), or None: a bool, text, 1.5."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None
