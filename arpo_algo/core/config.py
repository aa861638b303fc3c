"""`RolloutConfig`: the one source of ARPO's rollout settings and their defaults (M, N, Z, α, β, k, …), and the
checks of each. `ARPOConfig` and ``arpo rollout`` read their fields and defaults from here."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Sequence

from arpo_algo.settings import ConfigError, switch_problems, whole_problems

DEFAULT_NUM_GLOBAL = 8
"""N left out: the reference code's 8 global samples of its M = 16."""


def default_num_global(num_global: int | None, num_generations: int) -> int:
    """N as given, or left out (None): `DEFAULT_NUM_GLOBAL`, or M when M is smaller (M = 4 alone was an error)."""
    return min(DEFAULT_NUM_GLOBAL, num_generations) if num_global is None else num_global


@dataclass
class RolloutConfig:
    num_generations: int = 16
    """M: trajectories per task."""
    num_global: int | None = None
    """N: global samples per task before any branching (None: `DEFAULT_NUM_GLOBAL`, or M when M is smaller)."""
    branch_factor: int = 2
    """Z: a branch point yields Z paths (the original and Z−1 new ones)."""
    alpha: float = 0.5
    """Base branching probability."""
    beta: float = 0.2
    """Weight of the entropy change ΔH in the branching probability."""
    entropy_k: int = 20
    """k: tokens whose entropies are summed into H at the start of the response (H₀) and after each tool result."""
    max_new_tokens: int = 512
    """Tokens per generated segment (one turn)."""
    max_completion_tokens: int = 4096
    """Tokens per trajectory, tool outputs included: a trajectory is truncated where its next segment or tool output
    would take it past this (that output is in its record, not in its tokens)."""
    temperature: float = 1.0
    top_p: float = 1.0
    branching: bool = True
    seed: int = 0
    max_tool_workers: int = 16
    spare_samples: int = 2
    """Fresh samples each task may keep under way ahead of its top-ups, while it is expected to need them (none
    without branching): a top-up takes them in order before it starts a new sample, and they are stopped (their work
    discarded) once the task cannot need them. 0: top-ups start only once they are certain."""
    min_spare_samples: int = 1
    """Spares each task keeps under way from the rollout's start while it can still fall short of M, expected to or
    not (at most `spare_samples`). 0: spares start only when the task is expected to fall short."""
    speculative_branches: bool = False
    """On a backend that can (``speculates``: transformers, vLLM's engine), a path's possible branches start with the
    segment their decision is taken on, right after the tool result, instead of k tokens later: the decision keeps them
    if it branches and drops them (their tokens discarded, counted) if not. They start only where the decision is likely
    enough to keep them (`speculative_min_keep`; by default more likely than not: its draw is known before the segment,
    and below the P of the median ΔH seen so far). The decision and what each branch draws are the same either way;
    branches end k tokens sooner. Off by default: in `benchmarks/rollout_efficiency.py --speculative` on chain tasks
    they saved 0–9% of the decoding steps (0–10% of vLLM's engine steps) for 1–4% more tokens, which on a 2-core CPU,
    where a step's cost grows with its rows, did not pay; on a GPU the steps are the time."""
    speculative_min_keep: float = 0.5
    """With `speculative_branches`: how likely the decision must be to keep them for them to start, its chance read
    off this batch's decisions so far (0.5: below the P of their median ΔH, more likely kept than not; 1: below the P
    of their smallest; 0: at every decision that can branch, whatever its draw). Where a step costs the same whatever
    its rows (a GPU at small batches), 0 takes the most steps off a rollout for its discarded tokens."""

    def __post_init__(self) -> None:  # ConfigError: a ValueError the command line says in one line
        counts = ("num_generations", "num_global", "branch_factor", "seed", "max_tool_workers", "spare_samples",
                  "min_spare_samples")
        problems = whole_problems({name: getattr(self, name) for name in counts
                                   if not (name == "num_global" and self.num_global is None)})
        problems += switch_problems({"branching": self.branching, "speculative_branches": self.speculative_branches})
        if isinstance(self.speculative_min_keep, bool) or not isinstance(self.speculative_min_keep, numbers.Real):
            problems.append(f"speculative_min_keep must be a number, not {self.speculative_min_keep!r}")
        if problems:
            raise ConfigError("; ".join(problems))
        self.num_global = default_num_global(self.num_global, self.num_generations)
        if not 1 <= self.num_global <= self.num_generations:
            raise ConfigError(f"need 1 <= N (num_global={self.num_global}) <= M (num_generations="
                              f"{self.num_generations})")
        if self.branch_factor < 1:
            raise ConfigError("branch_factor (Z) must be at least 1")
        if self.spare_samples < 0 or self.min_spare_samples < 0:
            raise ConfigError("spare_samples and min_spare_samples must be at least 0")
        if not 0 <= self.speculative_min_keep <= 1:  # a NaN fails too
            raise ConfigError(f"speculative_min_keep must be in [0, 1], not {self.speculative_min_keep}")
        problems = sampling_problems(self.max_new_tokens, self.max_completion_tokens, self.temperature, self.top_p,
                                     self.entropy_k, self.alpha, self.beta)
        if self.max_tool_workers < 1:
            problems.append(f"max_tool_workers must be at least 1, not {self.max_tool_workers}")
        if self.seed < 0:  # numpy's generators and Gymnasium's reset take none below 0: it failed at the first task
            problems.append(f"seed must be at least 0, not {self.seed}")
        if problems:
            raise ConfigError("; ".join(problems))
        from arpo_env.env import whole_number

        for name in (*counts, "max_new_tokens", "max_completion_tokens", "entropy_k"):  # 4.0, numpy's: plain ints
            setattr(self, name, whole_number(getattr(self, name)))
        self.branching, self.speculative_branches = bool(self.branching), bool(self.speculative_branches)


ROLLOUT_NAMES = ("max_new_tokens", "max_completion_tokens", "temperature", "top_p", "entropy_k", "alpha", "beta")


def sampling_problems(max_new_tokens: int, max_completion_tokens: int, temperature: float, top_p: float,
                      entropy_k: int, alpha: float, beta: float, names: Sequence[str] = ROLLOUT_NAMES) -> list[str]:
    """What is wrong with a rollout's sampling settings, each said under its name in `names` (`RolloutConfig`'s by
    default; `ARPOConfig` checks its own with its names): a turn or trajectory with no token, a negative temperature
    (0 is greedy), a top-p outside (0, 1], an entropy window of no token, a branching weight that is not a number."""
    turn, whole, temp, nucleus, k, a, b = names
    from arpo_env.env import whole_number

    # text or true/false (a config written from Python) was a TypeError ("must be real number, not str"), unnamed
    problems = [f"{name} must be a whole number, not {value!r}" for name, value in
                ((turn, max_new_tokens), (whole, max_completion_tokens), (k, entropy_k)) if whole_number(value) is None]
    problems += [f"{name} must be a number, not {value!r}" for name, value in
                 ((temp, temperature), (nucleus, top_p), (a, alpha), (b, beta))
                 if isinstance(value, bool) or not isinstance(value, numbers.Real)]
    if problems:
        return problems
    if max_new_tokens < 1 or max_completion_tokens < 1:
        problems.append(f"a turn and a trajectory need at least one token ({turn}={max_new_tokens}, "
                        f"{whole}={max_completion_tokens})")
    if not (math.isfinite(temperature) and temperature >= 0):
        problems.append(f"{temp} must be at least 0 (0: greedy), not {temperature}")
    if not 0 < top_p <= 1:
        problems.append(f"{nucleus} must be in (0, 1], not {top_p}")
    if entropy_k < 1:
        problems.append(f"{k} must be at least 1, not {entropy_k}")
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        problems.append(f"{a} and {b} must be numbers, not {alpha} and {beta}")
    return problems
