"""Code that the README and the docs show runs: every Python block (unless marked ``<!-- test: skip (why) -->`` on the
line before it) is executed, the blocks of one page in order in one interpreter; every ``arpo`` command line in a
shell block names a command and flags that its ``--help`` knows."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts and not p.name.startswith("ARPO-")]  # env pages: generated
FENCE = re.compile(r"(?:<!-- test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>[\w-]*)\n(?P<body>.*?)\n```", re.DOTALL)


def blocks(page: Path, lang: str) -> list[tuple[str, str | None]]:
    return [(m["body"], m["mark"]) for m in FENCE.finditer(page.read_text(encoding="utf-8")) if m["lang"] == lang]


def test_the_pages_have_code_and_every_skip_says_why():
    found = {p.name: blocks(p, "python") for p in PAGES}
    assert found["README.md"], "the README's quickstart"
    for name, code in found.items():
        for _, mark in code:
            assert mark is None or re.fullmatch(r"skip \(.+\)", mark), f"{name}: a skip says why: {mark!r}"


@pytest.mark.parametrize("page", [pytest.param(p, marks=[] if p.name == "README.md" else [pytest.mark.slow])
                                  for p in PAGES if any(m is None for _, m in blocks(p, "python"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(page, tmp_path):
    code = "\n\n".join(body for body, mark in blocks(page, "python") if mark is None)
    script = tmp_path / "page.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                            timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, f"{page.name}:\n{result.stderr[-3000:]}"


def command_lines(page: Path) -> list[list[str]]:
    """Every ``arpo …`` invocation in the page's shell blocks, as words (continuation lines joined, comments cut)."""
    found = []
    for body, _ in blocks(page, "bash"):
        text = body.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #")[0]
            for part in re.split(r"&&|\|", line):
                words = shlex.split(part, comments=True)
                while words and ("=" in words[0] and not words[0].startswith("-")):  # VAR=value before it
                    words = words[1:]
                if words and words[0].split("/")[-1] == "arpo":
                    found.append(words)
                elif words[:3] and words[0] == "accelerate" and "arpo_algo.cli" in words:
                    found.append(["arpo", *words[words.index("arpo_algo.cli") + 1:]])
    return found


def known_flags(command: str) -> set[str]:
    if command in ("train", "sft"):
        from arpo_algo.training.sft import make_parser as sft_parser
        from arpo_algo.training.train import make_parser as train_parser

        parser = train_parser() if command == "train" else sft_parser()
    elif command == "view":
        from arpo_algo.cli.viewer import make_parser

        parser = make_parser()
    elif command == "rollout":
        from arpo_algo.cli.rollout import make_parser

        parser = make_parser()
    elif command == "serve":
        from arpo_algo.flags import Parser
        from arpo_env.remote.server import make_parser as serve_parser

        parser = serve_parser(Parser)
    else:
        from arpo_algo.cli.eval.command import make_parser

        parser = make_parser()
    return {o.replace("-", "_") for o in parser._option_string_actions} | {"__help_all", "__config", "__help"}


@pytest.mark.slow
def test_cli_examples_name_commands_and_flags_their_help_knows():
    from arpo_algo.cli.main import MODULE_COMMANDS

    checked = 0
    for page in PAGES:
        for words in command_lines(page):
            command = words[1]
            assert command in MODULE_COMMANDS, f"{page.name}: arpo {command}"
            flags = {w.split("=")[0].replace("-", "_") for w in words[2:] if w.startswith("--")}
            unknown = flags - known_flags(command)
            assert not unknown, f"{page.name}: arpo {command} does not take {sorted(unknown)}"
            checked += 1
    assert checked >= 15
