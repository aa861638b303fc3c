"""The parser of ``arpo train`` and ``arpo sft``: TRL's `TrlParser` (a YAML recipe after ``--config``, then flags in
either spelling) with arpo's one-line errors. Their ``--help`` is `arpo_algo.training.help_texts`'."""

from __future__ import annotations

from typing import NoReturn

from trl import TrlParser

from arpo_algo.flags import one_line_error


class RecipeParser(TrlParser):
    """`TrlParser` (a YAML recipe after ``--config``, then flags in either spelling) whose errors are one line."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(one_line_error(self.prog, message, list(self._option_string_actions)))
