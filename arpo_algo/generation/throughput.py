"""A progress line that moves while tokens are generated.

A rollout step or an eval sample on a CPU can take minutes, and a bar that counts finished samples sits still for
all of them. `TokenMeter` reads a generator's `GeneratorStats.sampled_tokens` (which grows with every decoding step)
once a second and shows the tokens so far and the rate, on a tqdm bar or any callable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


def describe(tokens: int, seconds: float) -> str:
    """``1,234 tok, 25.1 tok/s``."""
    rate = tokens / seconds if seconds > 0 else 0.0
    return f"{tokens:,} tok, {rate:.1f} tok/s"


class TokenMeter:
    """Calls `show` with `describe` of the tokens sampled since it started, every `every` seconds, from a thread of
    its own, while it is entered::

        with TokenMeter(generator.stats, bar.set_postfix_str):
            engine.run(tasks)
    """

    def __init__(self, stats: Any, show: Callable[[str], Any], every: float = 1.0) -> None:
        self.stats, self.show, self.every = stats, show, every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_tokens, self.start_time = 0, 0.0

    def line(self) -> str:
        return describe(self.stats.sampled_tokens - self.start_tokens, time.perf_counter() - self.start_time)

    def __enter__(self) -> TokenMeter:
        self.start_tokens, self.start_time = self.stats.sampled_tokens, time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="arpo-token-meter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.show(self.line())
            except Exception:  # a closed bar: the line is cosmetic, the run goes on
                return

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
