"""Rollout trees: the M trajectories of one task, the branch points that produced them, and JSONL I/O.

A *node* is one path of the rollout engine: a global sample (a root, ``parent=None``) or a branch. A branch node
shares its parent's completion tokens ``[0, start)`` and diverges at ``start``, the first token generated after a
tool result whose entropy change ΔH made the engine branch with probability P. Every trajectory ends at a node (its
leaf); following ``parent`` links gives the tokens it shares with others, which hard advantage attribution uses.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

from arpo_algo import jsonl


@dataclass
class Node:
    id: int
    parent: int | None
    start: int
    """Offset in the completion where this node's own tokens begin (0 for a root)."""
    kind: str
    """"global" (one of the N initial samples), "branch", or "topup" (a fresh sample filling the group to M)."""
    step: int = 0
    """The tool step at which a branch was taken."""
    delta_h: float | None = None
    p: float | None = None
    turn: int | None = None
    """The rollout turn (generation round, from 0) in which this node's path was started."""


@dataclass
class Trajectory:
    """One complete episode: the tokens a trainer needs, and what a person wants to look at."""

    node: int
    prompt_ids: list[int]
    completion_ids: list[int]
    mask: list[int]
    """1 on tokens the model generated, 0 on tool-output tokens (excluded from the loss)."""
    logprobs: list[float]
    """Log-probs of the sampled tokens under the sampling distribution; 0 on tool-output tokens."""
    entropies: list[float | None]
    """Normalised entropy where it was measured (the first k tokens of each segment), else None."""
    segments: list[dict[str, Any]]
    """The completion as text pieces: {"kind": "model" | "tool", "text", "start", "end"} (token offsets)."""
    reward: float
    reward_parts: dict[str, Any]
    tool_calls: int
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """Each branching decision taken on this trajectory's own path: {"step", "token", "delta_h", "p", "branched"}."""
    truncated: bool = False

    @property
    def completion_text(self) -> str:
        return "".join(s["text"] for s in self.segments)


@dataclass
class RolloutTree:
    task: dict[str, Any]
    algo: str
    nodes: list[Node]
    trajectories: list[Trajectory]
    stats: dict[str, Any] = field(default_factory=dict)

    def ancestors(self, node: int) -> list[int]:
        """`node` and its ancestors, leaf first."""
        by_id = {n.id: n for n in self.nodes}
        chain = [node]
        while by_id[chain[-1]].parent is not None:
            chain.append(by_id[chain[-1]].parent)  # type: ignore[arg-type]
        return chain

    @property
    def branches(self) -> int:
        return sum(n.kind == "branch" for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "algo": self.algo, "nodes": [asdict(n) for n in self.nodes],
                "trajectories": [asdict(t) for t in self.trajectories], "stats": self.stats}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RolloutTree":
        """The tree `to_dict` wrote; a `ValueError` saying what is amiss for JSON of another shape (a line of another
        file, or a tree whose task or reward parts are no object)."""
        try:
            if not isinstance(d, dict):
                raise TypeError(f"a {type(d).__name__}, not an object of fields")
            for key in ("nodes", "trajectories"):
                if not (isinstance(d[key], list) and all(isinstance(v, dict) for v in d[key])):
                    raise TypeError(f"its {key} are no list of objects")
            tree = cls(d["task"], d["algo"], [Node(**n) for n in d["nodes"]],
                       [Trajectory(**t) for t in d["trajectories"]], d.get("stats", {}))
            if not isinstance(tree.task, dict) or not all(isinstance(t.reward_parts, dict) for t in tree.trajectories):
                raise TypeError("its task and each trajectory's reward_parts are objects")
        except (KeyError, TypeError) as exc:
            what = f"no {exc.args[0]!r} field" if isinstance(exc, KeyError) and exc.args else f"{exc}"
            raise ValueError(f"not a rollout tree as arpo rollout and arpo train write them ({what})") from None
        return tree


def entropy_windows(segments: list[dict[str, Any]], entropies: list[float | None], own_from: int = 0
                    ) -> Iterator[tuple[str, list[float]]]:
    """The measured entropies of each model segment, with where it sits: ``"start"`` (the response's first segment)
    or ``"after_tool"`` (it follows a tool result) — the two windows ARPO compares. The trainer logs their means and
    `arpo view` plots them by position. Segments starting before `own_from` are skipped: give a branch's start to
    count the prefix it shares with its parent once."""
    previous = None
    for seg in segments:
        where = "start" if previous is None else "after_tool" if previous == "tool" else None
        previous = seg["kind"]
        if seg["kind"] != "model" or where is None or seg["start"] < own_from:
            continue
        values = [e for e in entropies[seg["start"]:seg["end"]] if e is not None]
        if values:
            yield where, values


def write_jsonl(trees: Iterable[RolloutTree], path: str | os.PathLike, append: bool = True) -> int:
    """Write one tree per line; by default append (rollout logs are never rewritten). Returns the count."""
    n = 0
    with jsonl.append(path) if append else open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
        for tree in trees:
            f.write(json.dumps(tree.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike, skipped: Callable[[int, str, ValueError], None] | None = None
               ) -> Iterator[RolloutTree]:
    """The trees of a file `write_jsonl` wrote (a run's ``rollouts.jsonl``, ``arpo rollout``'s output), past a line
    cut short by a killed writer: such a line is skipped, and given to `skipped` (its number, text and error). A line
    that is JSON but no tree is a `ValueError` naming it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, value in jsonl.records(f, skipped):
            try:
                tree = RolloutTree.from_dict(value)
            except ValueError as exc:  # JSON, but no tree (a file of another kind): not what a killed writer leaves
                raise ValueError(f"{path} line {n}: {exc}") from None
            yield tree
