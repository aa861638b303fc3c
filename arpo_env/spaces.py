"""Text spaces for language environments: any Unicode string up to a length."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces


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
