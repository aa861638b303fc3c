"""`RolloutConfig`: the one source of ARPO's rollout settings and their defaults (M, N, Z, α, β, k, …), and the
checks of each. `ARPOConfig` and ``arpo rollout`` read their fields and defaults from here."""

from __future__ import annotations

import argparse
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

from arpo_algo.settings import ConfigError, switch_problems, whole_problems

DEFAULT_NUM_GLOBAL = 8
"""N left out: the reference code's 8 global samples of its M = 16."""


def default_num_global(num_global: int | None, num_generations: int) -> int:
    """N as given, or left out (None): `DEFAULT_NUM_GLOBAL`, or M when M is smaller (so that M = 4 alone is valid)."""
    return min(DEFAULT_NUM_GLOBAL, num_generations) if num_global is None else num_global


def setting(default: Any, help: str, short: str | None = None, choices: Sequence[str] | None = None) -> Any:
    """A field of `RolloutConfig`: its default and its help (and its choices), which ``arpo rollout``'s flags
    (`add_rollout_flags`) and `ARPOConfig`'s fields (`trainer_field`) show as they are."""
    metadata: dict[str, Any] = {"help": help, "short": short}
    if choices:
        metadata["choices"] = list(choices)
    return field(default=default, metadata=metadata)


ENTROPY_TIMINGS = ("after_result", "lagged")
"""When ΔH is measured (`RolloutConfig.entropy_timing`)."""


@dataclass
class RolloutConfig:
    """The settings of one rollout (`arpo_algo.rollout.scheduler.ARPORollout`), with the reference code's defaults.

    This is the one place they are written. ``arpo rollout`` makes its flags from these fields (`add_rollout_flags`),
    `ARPOConfig` makes its fields from them under TRL's names (`TRAINER_NAMES`, `trainer_field`), and the trainer
    builds its rollouts' config back from its own (`from_trainer`).
    """

    num_generations: int = setting(16, "M: trajectories per task (one tree).", "-M")
    num_global: int | None = setting(None, "N: global samples per task before any branching (left out: 8, or M "
                                           "when M is smaller).", "-N")
    branch_factor: int = setting(2, "Z: paths out of a branch point (the original and Z-1 new ones).", "-Z")
    alpha: float = setting(0.5, "α: base branching probability in P = α + β·ΔH.")
    beta: float = setting(0.2, "β: weight of the entropy change ΔH in P = α + β·ΔH.")
    entropy_k: int = setting(20, "k: tokens whose normalised entropies are summed into H at the start of the "
                                 "response (H₀) and after every tool result; ΔH = H − H₀ (arpo_algo.core.entropy).")
    entropy_top_logprobs: int = setting(10, "Each token's entropy is summed over the top-N log-probs of the sampling "
                                            "distribution, normalised by ln|V|: the reference code's estimator "
                                            "(N = 10), the scale α and β are chosen on. 0: exact, over the whole "
                                            "vocabulary (the transformers backend only). Every backend computes it "
                                            "the same way.")
    entropy_timing: str = setting("after_result", "When ΔH is measured. after_result: on the k tokens right after "
                                                  "each tool result (the paper). lagged: the reference code's timing, "
                                                  "for comparison: the decision at tool call t uses the window after "
                                                  "result t−1, so the first decision is a coin flip at P = α.",
                                  choices=ENTROPY_TIMINGS)
    max_new_tokens: int = setting(512, "Tokens generated per turn (between two tool results).")
    max_completion_tokens: int = setting(4096, "Tokens per trajectory, tool outputs included: a trajectory is "
                                               "truncated where its next segment or tool output would pass this.")
    temperature: float = setting(1.0, "Sampling temperature (0: greedy).")
    top_p: float = setting(1.0, "Nucleus sampling: the smallest set of tokens whose probability reaches top-p.")
    branching: bool = setting(True, "Branch at tool steps (ARPO); off: M independent samples (GRPO).")
    seed: int = setting(0, "Seed of the rollout: the same seed draws the same trees on the transformers backend.")
    max_tool_workers: int = setting(16, "Threads that run tool calls concurrently during a rollout.")
    spare_samples: int = setting(2, "Fresh samples each task keeps under way ahead of its top-ups, while it is "
                                    "expected to need them: a top-up takes them before it starts a new sample, and "
                                    "those the task turns out not to need are stopped and discarded. 0: top-ups start "
                                    "only once they are certain.")
    min_spare_samples: int = setting(1, "Spares each task keeps under way from the start while it can still fall "
                                        "short of M, whether or not it is expected to (at most spare_samples). 0: "
                                        "spares start only once the task is expected to fall short.")
    speculative_branches: bool = setting(False, "Start the branches a decision can make with the segment it is taken "
                                                "on (transformers, vLLM's engine), not k tokens later, where the "
                                                "decision's draw makes keeping them likely; the trees are the same "
                                                "and the discarded branches' tokens are spent.")
    speculative_min_keep: float = setting(0.5, "With speculative branches: how likely a decision must be to keep "
                                               "them for them to start, read off the batch's decisions so far (0.5: "
                                               "more likely than not; 0: at every decision that can branch, which "
                                               "saves the most steps where a step costs the same whatever its rows: "
                                               "a GPU).")

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
        problems += entropy_problems(self.entropy_top_logprobs, self.entropy_timing)
        if self.max_tool_workers < 1:
            problems.append(f"max_tool_workers must be at least 1, not {self.max_tool_workers}")
        if self.seed < 0:  # numpy's generators and Gymnasium's reset take none below 0: it failed at the first task
            problems.append(f"seed must be at least 0, not {self.seed}")
        if problems:
            raise ConfigError("; ".join(problems))
        from arpo_env.episode import whole_number

        for name in (*counts, "max_new_tokens", "max_completion_tokens", "entropy_k", "entropy_top_logprobs"):  # 4.0
            setattr(self, name, whole_number(getattr(self, name)))
        self.branching, self.speculative_branches = bool(self.branching), bool(self.speculative_branches)


ROLLOUT_NAMES = ("max_new_tokens", "max_completion_tokens", "temperature", "top_p", "entropy_k", "alpha", "beta")


def sampling_problems(max_new_tokens: int, max_completion_tokens: int, temperature: float, top_p: float,
                      entropy_k: int, alpha: float, beta: float, names: Sequence[str] = ROLLOUT_NAMES) -> list[str]:
    """What is wrong with a rollout's sampling settings, each said under its name in `names` (`RolloutConfig`'s by
    default; `ARPOConfig` checks its own with its names): a turn or trajectory with no token, a negative temperature
    (0 is greedy), a top-p outside (0, 1], an entropy window of no token, a branching weight that is not a number."""
    turn, whole, temp, nucleus, k, a, b = names
    from arpo_env.episode import whole_number

    # text or true/false (a config written from Python) is refused by name
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


def entropy_problems(top_logprobs: Any, timing: Any) -> list[str]:
    """What is wrong with the entropy estimator's settings (`RolloutConfig.entropy_top_logprobs`, `entropy_timing`)."""
    from arpo_env.episode import whole_number

    problems = []
    if whole_number(top_logprobs) is None or whole_number(top_logprobs) < 0:
        problems.append(f"entropy_top_logprobs must be a whole number of at least 0 (0: exact), not {top_logprobs!r}")
    if timing not in ENTROPY_TIMINGS:
        problems.append(f"entropy_timing must be {' or '.join(ENTROPY_TIMINGS)}, not {timing!r}")
    return problems


def entropy_estimator(top_logprobs: int, timing: str) -> str:
    """How a run measured ΔH, in words: ``top-10 log-probs, after the result``."""
    what = "exact" if top_logprobs == 0 else f"top-{top_logprobs} log-probs"
    return f"{what}, {'lagged (the reference code)' if timing == 'lagged' else 'after the result'}"


TRAINER_NAMES = {"alpha": "branch_alpha", "beta": "branch_beta", "max_new_tokens": "max_new_tokens_per_turn",
                 "max_completion_tokens": "max_completion_length", "max_tool_workers": "tool_workers"}
"""`RolloutConfig` fields that `ARPOConfig` names otherwise: TRL's own (``beta`` is its KL weight,
``max_completion_length`` its trajectory budget) or clearer beside TRL's. ``branching`` and ``seed`` are the trainer's
to set for each step; the others keep their names."""
NOT_IN_TRAINER = ("branching", "seed")


def default(name: str) -> Any:
    """The default of `RolloutConfig`'s field `name`."""
    return RolloutConfig.__dataclass_fields__[name].default


def trainer_field(name: str, help: str | None = None) -> Any:
    """`ARPOConfig`'s field for `RolloutConfig`'s `name`: the same default and, unless `help` is given, the same
    help."""
    spec = RolloutConfig.__dataclass_fields__[name]
    metadata = {"help": help or spec.metadata["help"]}
    if spec.metadata.get("choices"):
        metadata["choices"] = spec.metadata["choices"]
    return field(default=spec.default, metadata=metadata)


def from_trainer(args: Any, **overrides: Any) -> RolloutConfig:
    """The `RolloutConfig` of an `ARPOConfig` (its fields read under `TRAINER_NAMES`), with `overrides` (the step's
    ``branching`` and ``seed``, a group's M)."""
    values = {f.name: getattr(args, TRAINER_NAMES.get(f.name, f.name)) for f in fields(RolloutConfig)
              if f.name not in NOT_IN_TRAINER}
    return RolloutConfig(**{**values, **overrides})


def add_rollout_flags(parser: argparse.ArgumentParser, skip: Sequence[str] = (),
                      defaults: Mapping[str, Any] | None = None) -> None:
    """Add a flag for every `RolloutConfig` field but `skip`, with its default (or `defaults`' for a benchmark that
    samples less) and its help. Each takes both spellings (``--num_generations`` and ``--num-generations``; help shows
    the first) and its short form where it has one (``-M``). A switch is ``--name`` / ``--no-name``."""
    defaults = dict(defaults or {})
    respells = getattr(parser, "respells", False)  # arpo_algo.flags.Parser takes both spellings itself
    for spec in fields(RolloutConfig):
        if spec.name in skip:
            continue
        value = defaults.get(spec.name, spec.default)
        flag = f"--{spec.name}"
        names = [spec.metadata["short"], flag] if spec.metadata.get("short") else [flag]
        help_text = spec.metadata["help"].replace("%", "%%")
        if isinstance(spec.default, bool):
            parser.add_argument(flag, dest=spec.name, action=argparse.BooleanOptionalAction, default=value,
                                help=help_text)
            kind: dict[str, Any] = {"action": "store_true"}
        else:
            kind = {"type": type(spec.default) if spec.default is not None else int}
            if spec.metadata.get("choices"):
                kind["choices"] = spec.metadata["choices"]
            parser.add_argument(*names, dest=spec.name, default=value, **kind,
                                help=help_text + ("" if value is None else f" Default: {value}."))
        if "_" in spec.name and not respells:  # the dashed spelling, hidden from help
            parser.add_argument(f"--{spec.name.replace('_', '-')}", dest=spec.name, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS, **kind)


def from_flags(args: argparse.Namespace, **overrides: Any) -> RolloutConfig:
    """The `RolloutConfig` of flags added by `add_rollout_flags` (those skipped take their defaults or
    `overrides`)."""
    values = {f.name: getattr(args, f.name) for f in fields(RolloutConfig) if hasattr(args, f.name)}
    return RolloutConfig(**{**values, **overrides})
