"""What went wrong while an answer was scored, kept with its reward rather than only in a log.

A scorer that gives up on an answer (math-verify past its time or memory bound) scores it 0, like a wrong answer; the
difference matters to whoever reads the reward. `record` notes such a failure in the thread that scores; `collected`
gathers the notes of one scoring (`arpo_env.rewards.HierarchicalReward` puts them in `RewardParts.scoring_errors`,
and the trainer logs their rate as ``arpo/scoring_errors``).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

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
