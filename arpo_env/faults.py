"""Scripted tool faults: tasks whose tool results are sometimes wrong, so that a careful agent checks them.

A task opts in with ``meta["tool_faults"] = {"rate": q, "seed": s}`` (the ``noisy`` procedural family does; see
`arpo_env.datasets.procedural`). Each Python call of its episodes then fails, with probability `q`, in one of two
ways the model can notice and answer by running the cell again:

* ``error``: the cell did not run, and the model reads `ERROR_TEXT` (an interrupted cell; run it again);
* ``stale``: the cell ran but its output was lost, and the model reads the first number of its own code, as if the
  operation had not been applied.

Whether the n-th call of an episode fails is a function of the task's seed and n alone, so the same task meets the
same faults in every run, fork and snapshot, and a retry is a fresh draw. Faults make tool results surprise the
model: the place where ARPO's entropy signal should pay off.
"""

from __future__ import annotations

import random
import re
from typing import Any

from arpo_env import tags

KINDS = ("error", "stale")
ERROR_TEXT = "error: the interpreter was interrupted before the cell ran (a transient fault); run it again."
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def scheduled(meta: dict[str, Any], tag: str, index: int) -> str | None:
    """The fault of call `index` (0 for the first) to the tool `tag` in an episode of a task with `meta`: ``"error"``,
    ``"stale"`` or None. Only Python calls fail."""
    spec = meta.get("tool_faults") if isinstance(meta, dict) else None
    if not isinstance(spec, dict) or tag != tags.PYTHON:
        return None
    rate = spec.get("rate", 0)
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0:
        return None
    draw = random.Random(f"{spec.get('seed', 0)}:{tag}:{index}")
    if draw.random() >= rate:
        return None
    return KINDS[draw.random() < 0.5]


def stale_output(code: str) -> str | None:
    """What a ``stale`` fault prints for `code`: its first number (the value carried in), or None for code without
    one (then the call runs as usual)."""
    match = _NUMBER.search(code)
    return None if match is None else match.group(0)


def looks_faulty(code: str, output: str) -> str | None:
    """The fault `output` of `code` looks like, ``"error"`` or ``"stale"``, or None: the error above, or the code's
    first number coming back unchanged. The scripted teacher checks results with this, and a careful model can learn
    the same check."""
    text = output.strip()
    if text.startswith(ERROR_TEXT[:40]):
        return "error"
    first = stale_output(code)
    return "stale" if first is not None and text == first.strip() else None
