"""What went wrong while an answer was scored, kept with its reward rather than only in a log.

A scorer that gives up on an answer (math-verify past its time bound: a *timeout*) or fails on it (an exception in
our scoring code, or a worker that died: an *error*) gives no verdict. Its reward still needs a number, 0, but it is
no wrong answer, and whoever reads the reward must be able to tell. `record` notes such a failure in the thread that
scores; `collected` gathers the notes of one scoring; `scored` runs a scorer and turns its exception into a note.
`arpo_env.rewards.HierarchicalReward` puts the notes in `RewardParts.scoring_errors`, the trainer logs their rate
as ``arpo/scoring_errors``, and ``arpo eval`` keeps them in the sample and leaves the sample out of pass@1, counting
it in the table's scoring-errors row.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

_local = threading.local()


def record(message: str) -> None:
    """Note a scoring failure for the scoring under way in this thread (none under way: nothing to keep it in)."""
    notes = getattr(_local, "notes", None)
    if notes is not None:
        notes.append(message)


@contextmanager
def collected() -> Iterator[list[str]]:
    """The failures recorded in this thread while the block runs (nested blocks each see their own)."""
    outer = getattr(_local, "notes", None)
    _local.notes = notes = []
    try:
        yield notes
    finally:
        _local.notes = outer
        if outer is not None:
            outer.extend(notes)


TIMEOUT = "timed out"
"""The words a timeout's note holds (`is_timeout`)."""


def is_timeout(note: str) -> bool:
    return TIMEOUT in note


def scored(scorer: Callable[..., float], prediction: Any, gold: Any, meta: Mapping[str, Any] | None = None) -> float:
    """`scorer`'s score, or 0.0 with a note when it raises: an exception in our scoring code is a scoring error,
    counted with the reward, not a wrong answer."""
    try:
        return float(scorer(prediction, gold, meta or {}))
    except Exception as exc:  # noqa: BLE001 - any bug of a scorer: noted, not raised into the rollout
        record(f"scoring failed: {type(exc).__name__}: {' '.join(str(exc).split())}"[:300])
        return 0.0
