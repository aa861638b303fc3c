"""The command line's conventions, shared by every ``arpo`` command.

- One flag style. Help spells every flag as TRL does (``--data_dir``), and every command takes the dashed spelling
  (``--data-dir``) too, as TRL's own parser does for its flags.
- One-line errors. A bad flag or value is one line and a hint, not the whole usage.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn, Sequence


def _key(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def spelled(name: str) -> str:
    """A flag as help shows it: ``data-dir`` or ``data_dir`` → ``--data_dir``."""
    return "--" + _key(name)


def respell(args: Sequence[str], options: Sequence[str]) -> list[str]:
    """`args` with each flag written as the parser knows it: ``--data-dir`` becomes ``--data_dir`` when that is the
    option's name, and the other way round. Values, ``--name=value`` forms and everything after ``--`` keep their
    spelling."""
    known = {_key(o): o for o in options if o.startswith("--")}
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + list(args[i:])
        if arg.startswith("--") and len(arg) > 2:
            flag, eq, value = arg.partition("=")
            if flag not in known.values() and _key(flag) in known:
                arg = known[_key(flag)] + eq + value
        out.append(arg)
    return out


class FlagFormatter(argparse.HelpFormatter):
    """Help as wide as a terminal usually is, with room for the flags' names."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=110)


class Parser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` with arpo's conventions (see the module's docstring). Subparsers made from it
    are of this class too."""

    respells = True
    """Read by `arpo_algo.core.config.add_rollout_flags`: no hidden second spelling is needed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", FlagFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: Any, **kwargs: Any) -> argparse.Action:
        """Long flags are named with underscores (``--data_dir``); `respell` takes the dashed form."""
        names = tuple(spelled(n) if isinstance(n, str) and n.startswith("--") else n for n in names)
        return super().add_argument(*names, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(respell(args, list(self._option_string_actions)), namespace)

    def error(self, message: str) -> NoReturn:
        """``arpo eval: --limit: invalid int value: 'abc' (arpo eval --help lists the flags)``: one line."""
        raise SystemExit(one_line_error(self.prog, message, list(self._option_string_actions)))


def one_line_error(prog: str, message: str, options: Sequence[str]) -> str:
    """argparse's error `message` as one line, flags spelled as help spells them, an unknown flag with its nearest
    known one."""
    message = " ".join(message.split())
    message = re.sub(r"^argument (--?[\w-]+)(?:/--?[\w-]+)*:", r"\1:", message)
    message = re.sub(r"^argument command: invalid choice: (\S+)", r"unknown command \1", message)
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if unknown:
        from arpo_env.tools.protocol import did_you_mean

        flags = [a.split("=")[0] for a in unknown.group(1).split() if a.startswith("-")]
        known = sorted({spelled(o) for o in options if o.startswith("--") and o != "--help"})
        if flags:
            message = f"unknown flag{'s' * (len(flags) > 1)}: " + did_you_mean(flags, known)
    return f"{prog}: {message} ({prog} --help lists the flags)"


HELP_COMMANDS = ("train", "sft")
"""Commands whose ``--help`` is a text kept in the package (`arpo_algo.training.help_texts` writes it): their parser is
TRL's, and importing TRL to print help took about 11 s."""


def wants_help(argv: Sequence[str]) -> bool:
    return ("-h" in argv or "--help" in argv) and "--help-all" not in argv


def help_all_as_trl_help(argv: Sequence[str]) -> list[str]:
    """``--help-all`` of a TRL-parsed command is TRL's own ``--help``: every flag."""
    return [a for a in argv if a != "--help-all"] + ["--help"] * ("--help-all" in argv)


def packaged_help(command: str) -> str:
    """The curated ``--help`` of `command` (one of `HELP_COMMANDS`)."""
    from importlib import resources

    return resources.files("arpo_algo").joinpath("cli", "help", f"{command}.txt").read_text(encoding="utf-8")
