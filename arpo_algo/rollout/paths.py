"""The state the scheduler keeps: one `PathState` per path under way, one `TaskState` per task."""

from __future__ import annotations

import enum
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from arpo_algo.core.tree import Node, Trajectory
from arpo_algo.generation.protocol import Path


class Phase(enum.Enum):
    """What a path's next segment is to ARPO's entropy measurement."""

    FIRST = "first"
    """The response's first segment: its window entropy is the path's H₀."""
    AFTER_TOOL = "after tool"
    """The first segment after a tool result: ARPO decides on it whether to branch."""
    DECIDED = "decided"
    """After a tool result, with the decision taken already: while the segment generated (a backend that decides
    mid-segment), or by the parent of a branch, which generates that segment again."""
    PLAIN = "plain"
    """After a notice (a malformed turn's error) or a decided segment: nothing to measure."""


@dataclass(eq=False)
class PathState:
    """A path under way: the generator's sequence (`seq`), its environment, and what it has produced so far.

    A branch's environment is forked in the tool pool, off the critical path: until the fork is done `env` is None
    and `env_job` holds (the fork job, this branch's index in it); the branch generates meanwhile.

    `stream` names the path in its request seeds and branch draws: its tree node for a global sample, M + j for
    the task's top-up j (tree nodes are below M), so a top-up draws alike whether it started as a spare or late, and
    for a branch a 64-bit hash of (its parent's stream, the tool step, its index), so it draws alike whether it
    started speculatively or after its decision. A spare or a speculative branch has no tree node (``node == -1``)
    until the task takes it."""

    task: int
    node: int
    seq: Path
    """The generator's sequence: its tokens (the prompt's included) and their cache."""
    env: Any
    stream: int = -1
    topup: int | None = None
    """Its index among the task's top-ups (spares included); None for a global sample or a branch."""
    spare: bool = False
    """Started ahead of need: not in the tree (nor in the task's counts) until the task takes it."""
    turn: int = 0
    """The round it started in (its node's `turn`)."""
    ended: Trajectory | None = None
    """A spare that finished before the task took it: its trajectory, waiting."""
    cancelled: bool = False
    stepping: bool = False
    """Its env step is under way in the tool pool."""
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float | None] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    h0: float | None = None
    """H₀, the window entropy of the response's first segment (None if it was empty)."""
    last_h: float | None = None
    """H of the path's latest model segment: what the reference's timing (``entropy_timing="lagged"``) decides on."""
    phase: Phase = Phase.FIRST
    """What its next segment is to the entropy measurement."""
    steps: int = 0
    env_job: tuple[Future, int] | None = None
    forking: Future | None = None
    """The job forking this path's branches: its next env step waits for it (the copies are of the state before)."""
    tool_steps_left: int = 0
    """Tool calls its env's budget still allows, as of its last env step (kept by the rollout's own thread: an env
    step under way in the tool pool must not change what the scheduler sees, or the trees would depend on timing)."""

    def environment(self) -> Any:
        """The path's environment, once its fork (if any) is done."""
        if self.env is None and self.env_job is not None:
            job, i = self.env_job
            self.env, self.env_job = job.result()[i], None
        return self.env


class TaskState:
    """A task under way: its root env and prompt, its tree's nodes, its finished trajectories and its spares."""

    def __init__(self, task: dict[str, Any], root_env: Any, prompt_ids: list[int], root_path: Path) -> None:
        self.task, self.root_env, self.prompt_ids, self.root_path = task, root_env, prompt_ids, root_path
        self.nodes: list[Node] = []
        self.done: list[Trajectory] = []
        self.live = 0
        self.spares: list[PathState] = []
        """Spare samples not taken yet, in the order they started (the order the task takes them in)."""
        self.topups = 0
        """Top-up indices given out (spares included): the next top-up is number `topups`."""
        self.tool_budget = max(0, root_env.max_tool_calls - root_env.state.budget_used)
        """The tool calls a path of this task may make."""

    def new_node(self, parent: int | None, start: int, kind: str, turn: int, **kw: Any) -> int:
        self.nodes.append(Node(len(self.nodes), parent, start, kind, turn=turn, **kw))
        return len(self.nodes) - 1
