"""Text spaces for language environments: any Unicode string up to a length."""

from __future__ import annotations

import multiprocessing as mp
import string
from types import ModuleType
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import shared_memory


class UnicodeText(spaces.Text):
    """A `gymnasium.spaces.Text` whose members are *any* Unicode strings of at most `max_length` characters.

    Gymnasium's `Text` admits only a fixed charset; model output and tool results hold any character. Sampling
    (for tests and the env checker) draws from printable ASCII letters, digits and spaces, so a sampled action never
    contains a tag. Being a `Text`, it batches like one under `gymnasium.make_vec` (a tuple of strings).
    """

    def __init__(self, max_length: int, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=string.ascii_letters + string.digits + " ",
                         seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


# Async vector envs pass observations through shared memory. Gymnasium stores a `Text` as indices into its charset;
# a `UnicodeText` is stored as UTF-32 code points behind a length slot, one row of `max_length + 1` per env.
@shared_memory.create_shared_memory.register(UnicodeText)
def _create(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array(np.dtype(np.uint32).char, n * (space.max_length + 1), lock=True)


def _rows(space: UnicodeText, memory: Any) -> np.ndarray:
    return np.frombuffer(memory.get_obj(), dtype=np.uint32).reshape(-1, space.max_length + 1)


class SharedTexts(tuple):
    """The live view of a batch of strings in shared memory (as numpy views are for arrays).

    Gymnasium reads the shared buffer once and later hands out ``deepcopy(view)``; a deep copy, indexing and
    iteration decode the strings that are in the buffer now.
    """

    def __new__(cls, space: UnicodeText, memory: Any, n: int) -> "SharedTexts":
        view = super().__new__(cls, ())
        view._space, view._memory, view._n = space, memory, n
        return view

    def current(self) -> tuple[str, ...]:
        rows = _rows(self._space, self._memory)[: self._n]
        return tuple(row[1: 1 + int(row[0])].tobytes().decode("utf-32-le", "surrogatepass") for row in rows)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        return self.current()[index]

    def __iter__(self) -> Any:
        return iter(self.current())

    def __eq__(self, other: object) -> bool:
        return self.current() == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(self.current())

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return self.current()


@shared_memory.read_from_shared_memory.register(UnicodeText)
def _read(space: UnicodeText, memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, memory, n)


@shared_memory.write_to_shared_memory.register(UnicodeText)
def _write(space: UnicodeText, index: int, value: str, memory: Any) -> None:
    points = np.frombuffer(value[: space.max_length].encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    row = _rows(space, memory)[index]
    row[0] = len(points)
    row[1: 1 + len(points)] = points
