"""``arpo serve``: `arpo_env.remote.server` with the command line's conventions (both spellings of every flag,
errors in one line)."""

from __future__ import annotations

from typing import Sequence

from arpo_algo.flags import Parser


def main(argv: Sequence[str] | None = None) -> int:
    from arpo_env.remote.server import main as serve

    return serve(argv, parser_class=Parser)
