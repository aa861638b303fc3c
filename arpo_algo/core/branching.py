"""ARPO's branching, as the paper states it: pure functions of numbers, torch-free, each tested on its own.

At every tool step a path measures H, the entropy of the first k tokens it generates after the tool result, against
H₀, its own first window's. With ΔH = H − H₀ it branches with probability P = clip(α + β·ΔH, 0, 1) into Z paths, while
its task has fewer than M trajectories (`decide`). A task that is certain to end short of M, even if every live path
branched at every tool step it has left (`capacity`), is topped up with fresh samples (`top_ups_needed`). The
scheduler (`arpo_algo.rollout.scheduler`) also starts fresh samples ahead of need where a task is expected to fall
short (`expected_trajectories`), and may start a decision's branches before its ΔH is known where its draw makes
keeping them likely (`speculation_pays`).

Every draw is a function of (seed, task, stream, tool step) (`uniform_draw`), so a decision does not depend on the order
in which events happen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def branch_probability(alpha: float, beta: float, delta_h: float | None) -> float:
    """P = clip(α + β·ΔH, 0, 1). Without a finite ΔH (no measured token) the base probability α is used."""
    if delta_h is None or not math.isfinite(delta_h):
        return float(min(max(alpha, 0.0), 1.0))
    return float(min(max(alpha + beta * delta_h, 0.0), 1.0))


@dataclass(frozen=True)
class Decision:
    """One branch decision: ΔH, P, whether it branched, and how many new paths it makes (Z − 1, or fewer where the
    task has less room left before M)."""

    delta_h: float
    p: float
    branched: bool
    new_paths: int


def decide(h: float | None, h0: float | None, draw: float, alpha: float, beta: float, branch_factor: int,
           room: int) -> Decision | None:
    """ARPO's decision on the segment after a tool result whose window entropy is `h`, for a path whose first window's
    was `h0`: branch when the uniform `draw` falls below P. `room` is M less the task's finished and live paths: no
    branch without it, and never more than it. None where there is nothing to decide on (an empty segment, or an empty
    first one: no entropy)."""
    if h is None or h0 is None:
        return None
    delta = h - h0
    p = branch_probability(alpha, beta, delta)
    branched = room > 0 and branch_factor > 1 and draw < p
    return Decision(delta, p, bool(branched), min(branch_factor - 1, room) if branched else 0)


def uniform_draw(seed: int, task: int, stream: int, step: int) -> float:
    """The uniform draw of a path's decision at its tool step `step`: known before the segment it decides on, and the
    same in any order of events."""
    return float(np.random.default_rng([seed, task, stream, step]).random())


def capacity(tool_steps_left: int, branch_factor: int, can_branch: bool) -> int:
    """The most trajectories a live path can still end as: Z^r with r its tool steps left (every path out of a branch
    point may branch again at each later step); 1 where it cannot branch (a top-up, GRPO, Z = 1). r is capped at 20,
    past which the number means "more than any M"."""
    if not can_branch or branch_factor < 2:
        return 1
    return branch_factor ** min(tool_steps_left, 20)


def top_ups_needed(num_generations: int, finished: int, capacities: Sequence[int]) -> int:
    """Fresh samples a task needs now: what its finished trajectories and the most its live paths can grow into
    (`capacity`) leave short of M."""
    return max(0, num_generations - finished - sum(capacities))


def expected_growth(branch_factor: int, mean_p: float, steps_left: float) -> float:
    """The trajectories one live path is expected to end as if it branches with probability `mean_p` at each of
    `steps_left` more tool steps: (1 + (Z − 1)·p)^q."""
    return (1 + (branch_factor - 1) * mean_p) ** max(0.0, steps_left)


def expected_trajectories(finished: int, paths: Sequence[tuple[bool, int, int]], branch_factor: int, mean_p: float,
                          mean_steps: float) -> float:
    """The trajectories a task is expected to end with: each finished one, and for each live path (is it a top-up, its
    tool steps so far, its tool steps left) one for a top-up, else its `expected_growth` over the tool steps a path
    takes on average (`mean_steps`) less its own, at most the steps it has left."""
    expected = float(finished)
    for topup, steps, steps_left in paths:
        expected += 1 if topup else expected_growth(branch_factor, mean_p, min(steps_left, mean_steps - steps))
    return expected


def speculation_pays(draw: float, alpha: float, beta: float, deltas: Sequence[float], min_keep: float) -> bool:
    """Whether a decision's branches should start with its segment, before its ΔH is known: its `draw` is below the P
    of the (1 − min_keep) quantile of the ΔH of the decisions seen so far (0 before any), so that at least that share
    of them would keep the branches if ΔH were drawn from those. At ``min_keep == 0`` they always start."""
    if min_keep <= 0:
        return True
    typical = float(np.quantile(deltas, 1 - min_keep)) if len(deltas) else 0.0
    return draw < branch_probability(alpha, beta, typical)
