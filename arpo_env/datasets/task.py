"""A task (a question, its gold answer, where it came from) and the errors a dataset can raise."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """One question. `answer` is a string, or a list of accepted aliases."""

    question: str
    answer: Any
    id: str = ""
    source: str = ""
    kind: str = "math"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Task":
        return cls(**{k: d[k] for k in ("question", "answer", "id", "source", "kind", "meta") if k in d})


class DataError(Exception):
    """A dataset could not be loaded: `DataNotFound` or `DataUnreadable`."""


class DataNotFound(DataError, FileNotFoundError):
    """A dataset could not be found; the message says where it was looked for and how to get it."""


class BadDatasetName(DataError, ValueError):
    """A dataset name that cannot be read: a procedural family's N, SEED or level that is not a whole number in its
    range (``arithmetic:abc``, ``chain:0``)."""


class DataUnreadable(DataError, ValueError):
    """A dataset's file is there but is not what it should be (cut short, not JSON, not parquet, not UTF-8); the
    message names the file and, for JSON lines, the line."""
