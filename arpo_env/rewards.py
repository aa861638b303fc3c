r"""Rewards: ARPO's hierarchical reward, as objects the environments own and as TRL reward functions.

The hierarchical reward of the paper:

* **format gate**: −1 when the completion breaks the format (no ``<answer>`` holding a ``\boxed{}``, unbalanced
  tags, a tool call after the answer, a tool call that got no ``<result>``: `arpo_env.tags.format_errors`). The
  default rule does not require ``<think>``; the reference code's stricter ``<think>`` rule is available by name:
  ``strict_think=True`` on the envs and `HierarchicalReward`, and the ``*_strict_think`` TRL reward functions;
* otherwise **correctness**: math-verify equivalence for math (0 or 1, bounded in time from any thread:
  `math_equal`), token F1 for QA (`arpo_env.scoring.qa_metrics`);
* **+0.1** when the answer is correct (score > 0) and both search and Python actually ran: in an environment, the
  tools it executed; for a completion alone (TRL reward functions), the calls answered by a ``<result>``. Tags
  inside tool results never count as the model's.

Every function named ``*_reward`` here is also a TRL reward function, ``f(prompts, completions, **kwargs) ->
list[float]``, so ``trl grpo --reward_funcs arpo_env.rewards.math_reward`` imports it. The gold answer is read from
the dataset column ``answer``, ``ground_truth``, ``solution`` or ``reward_model['ground_truth']``.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from arpo_env import tags
from arpo_env.datasets.loaders import GOLD_FIELDS
from arpo_env.scoring import failures
from arpo_env.scoring.math_equivalence import math_score
from arpo_env.scoring.qa_metrics import aliases, qa_exact_match, qa_score

BONUS_TOOLS = frozenset({tags.SEARCH, tags.PYTHON})
_log = logging.getLogger(__name__)


@dataclass
class RewardParts:
    """A reward and how it was reached."""

    total: float
    format_ok: bool
    score: float = 0.0
    """Correctness before the bonus: 0/1 for math, F1 for QA."""
    bonus: float = 0.0
    prediction: str | None = None
    errors: list[str] = field(default_factory=list)
    """Why the format gate failed."""
    scoring_errors: list[str] = field(default_factory=list)
    """Why the scorer could not decide (math-verify past its bound, an exception in our scoring code:
    `arpo_env.scoring.failures`): the score is 0, but not a verdict of wrong."""

    @property
    def correct(self) -> bool:
        return self.format_ok and self.score > 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "correct": self.correct}


Scorer = Callable[[str | None, Any, Mapping[str, Any]], float]
"""``scorer(prediction, gold, meta) -> float`` in [0, 1]; `meta` holds the question and the task's metadata."""


# --------------------------------------------------------------------------------------------------------------------
# The hierarchical reward
# --------------------------------------------------------------------------------------------------------------------
class HierarchicalReward:
    """ARPO's reward: format gate, then correctness, then the multi-tool bonus.

    Args:
        scorer: ``scorer(prediction, gold, meta) -> float`` in [0, 1] (math equivalence, QA F1, an LLM judge).
        strict_think: also require the reference code's ``<think>`` structure.
        tool_bonus: added when the answer is correct and both search and Python were used.
        require_boxed: the answer must hold a ``\\boxed{}``.
    """

    def __init__(self, scorer: Scorer = math_score, strict_think: bool = False,
                 tool_bonus: float = 0.1, require_boxed: bool = True) -> None:
        # tool_bonus="x" failed at the first correct answer that used both tools, NaN made its reward NaN;
        # strict_think must be a real switch: "no" is not false to Python
        if isinstance(tool_bonus, bool) or not isinstance(tool_bonus, numbers.Real) or not math.isfinite(tool_bonus):
            raise ValueError(f"tool_bonus must be a number (0.1 in the paper), not {tool_bonus!r}")
        if strict_think not in (True, False):
            raise ValueError(f"strict_think must be true or false, not {strict_think!r}")
        self.scorer = scorer
        self.strict_think = strict_think
        self.tool_bonus = tool_bonus
        self.require_boxed = require_boxed

    def prestart(self) -> None:
        """Start what scoring will need in the background, returning at once: the scorer's ``prestart`` if it has
        one (`math_score`'s starts math-verify's worker processes). An environment calls it as an episode starts."""
        start = getattr(self.scorer, "prestart", None)
        if start is not None:
            start()

    def __call__(self, completion: str, gold: Any, meta: Mapping[str, Any] | None = None,
                 tools_ran: set[str] | None = None, tool_tags: Sequence[str] = tags.TOOL_TAGS) -> RewardParts:
        """Score `completion`. `tools_ran`: the tools that really executed (an environment knows); by default, those
        whose calls got a ``<result>`` in the completion. `tool_tags`: the tags of the environment's tools (its own
        as well as the built-in ones), which the format gate reads calls by."""
        prediction = tags.final_answer(completion, tool_tags)
        errors = tags.format_errors(completion, self.strict_think, self.require_boxed, tool_tags=tool_tags)
        if errors:
            return RewardParts(-1.0, False, prediction=prediction, errors=errors)
        with failures.collected() as scoring_errors:
            score = failures.scored(self.scorer, prediction, gold, meta)
        ran = tags.ran_tools(completion, tool_tags) if tools_ran is None else set(tools_ran)
        bonus = self.tool_bonus if score > 0 and BONUS_TOOLS <= ran else 0.0
        return RewardParts(score + bonus, True, score, bonus, prediction, scoring_errors=scoring_errors)


# --------------------------------------------------------------------------------------------------------------------
# TRL reward functions
# --------------------------------------------------------------------------------------------------------------------
def completion_text(completion: Any) -> str:
    """TRL passes plain strings, or (conversational datasets) lists of messages: take the assistant text. A message's
    content may be a list of parts (``[{"type": "text", "text": …}]``, as multimodal chat templates write it): their
    text, joined (its ``str`` was scored, with every newline and quote escaped)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        content = completion.get("content", completion.get("text", ""))
        if isinstance(content, list):
            return "".join(part.get("text") or "" if isinstance(part, dict) else str(part) for part in content)
        return "" if content is None else str(content)
    return "".join(completion_text(m) for m in completion if not isinstance(m, dict) or m.get("role") != "user")


def gold_answers(kwargs: dict[str, Any]) -> list[Any]:
    """The gold answer of each row, from whichever column the dataset has (those `load_tasks` reads, in its order:
    GAIA's ``Final answer`` and Bamboogle's ``Answer`` too; a worked ``solution`` after them)."""
    for key in (*GOLD_FIELDS[:-1], "solution", GOLD_FIELDS[-1]):
        if kwargs.get(key) is not None:
            return list(kwargs[key])
    if kwargs.get("reward_model") is not None:
        return [row.get("ground_truth") if isinstance(row, dict) else row for row in kwargs["reward_model"]]
    raise KeyError(f"the dataset needs a gold-answer column: {', '.join(GOLD_FIELDS[:-1])}, solution, "
                   f"{GOLD_FIELDS[-1]} or reward_model")


def row_meta(kwargs: dict[str, Any], i: int) -> dict[str, Any]:
    """Per-row metadata a scorer may use (answer_type, question), from the dataset's columns."""
    return {k: kwargs[k][i] for k in ("answer_type", "question") if kwargs.get(k) is not None}


def _batch(reward: HierarchicalReward, completions: Sequence[Any], kwargs: dict[str, Any],
           part: Callable[[RewardParts], float]) -> list[float]:
    golds = gold_answers(kwargs)
    empty = [i for i, g in enumerate(golds[:len(completions)]) if not aliases(g)]
    if empty:  # scored as wrong (a well-formed answer 0, a broken one -1); the dataset is the user's to fix
        _log.warning("%d of %d rows have no gold answer (rows %s: %r); no answer is right for them",
                     len(empty), len(completions), empty[:5], golds[empty[0]])
    return [part(reward(completion_text(c), g, row_meta(kwargs, i)))
            for i, (c, g) in enumerate(zip(completions, golds))]


_MATH = HierarchicalReward(math_score)
_QA = HierarchicalReward(qa_score)
_MATH_STRICT = HierarchicalReward(math_score, strict_think=True)
_QA_STRICT = HierarchicalReward(qa_score, strict_think=True)


def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """0 for a well-formed completion, −1 otherwise (the format gate alone)."""
    return [0.0 if not tags.format_errors(completion_text(c)) else -1.0 for c in completions]


def math_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """The full hierarchical reward with math-verify correctness."""
    return _batch(_MATH, completions, kwargs, lambda p: p.total)


def math_reward_strict_think(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """`math_reward` with the reference code's ``<think>`` rule: the completion must open with ``<think>`` and
    close it before the answer."""
    return _batch(_MATH_STRICT, completions, kwargs, lambda p: p.total)


def qa_reward_strict_think(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """`qa_reward` with the reference code's ``<think>`` rule."""
    return _batch(_QA_STRICT, completions, kwargs, lambda p: p.total)


def math_accuracy_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1 when the boxed answer is mathematically equal to the gold answer, else 0 (format not gated)."""
    golds = gold_answers(kwargs)
    return [math_score(tags.final_answer(completion_text(c)), g) for c, g in zip(completions, golds)]


def qa_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """The full hierarchical reward with QA correctness (best token F1 over the gold aliases)."""
    return _batch(_QA, completions, kwargs, lambda p: p.total)


def qa_em_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """Exact match (SQuAD normalisation; LaTeX wrappers unwrapped) of the boxed answer against any gold alias
    (format not gated)."""
    golds = gold_answers(kwargs)
    return [qa_exact_match(tags.final_answer(completion_text(c)), g) for c, g in zip(completions, golds)]


def arpo_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """The hierarchical reward for mixed math + QA data: each row is scored by its ``ability`` column."""
    golds = gold_answers(kwargs)
    abilities = kwargs.get("ability") or ["math"] * len(completions)
    return [(_QA if ability == "qa" else _MATH)(completion_text(c), g, row_meta(kwargs, i)).total
            for i, (c, g, ability) in enumerate(zip(completions, golds, abilities))]
