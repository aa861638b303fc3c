"""``arpo rollout``: sample ARPO or GRPO rollout trees of a model on an environment and append them to a JSONL file.

Its rollout flags are made from `arpo_algo.core.config.RolloutConfig` (`add_rollout_flags`), so their defaults and
help are the config's."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

from arpo_algo.core.config import add_rollout_flags, default, from_flags
from arpo_algo.flags import Parser
from arpo_algo.generation.factory import make_generator
from arpo_algo.generation.throughput import TokenMeter


def make_parser() -> Parser:
    p = Parser(prog="arpo rollout", description="Sample ARPO or GRPO rollout trees of a model on an arpo environment "
               "and append them to a JSONL file.")
    p.add_argument("--model", default="smollm2-135m", help="hub id, local path, or smollm2-135m (embedded)")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    p.add_argument("--env", default="ARPO-Math-v0", help="environment id")
    p.add_argument("--env_kwargs", default="{}",
                   help='JSON keyword arguments for the env, e.g. \'{"dataset": "gsm8k"}\'')
    p.add_argument("--server_url", default=None, help="run the envs on arpo serve servers (URLs, comma-separated; "
                   "token in $ARPO_SERVE_TOKEN)")
    p.add_argument("--dataset", default=None, help="shortcut for env kwarg dataset")
    p.add_argument("--data_dir", default=None, help="shortcut for env kwarg data_dir")
    p.add_argument("--tasks", type=int, default=8, help="number of tasks (the first ones of the dataset)")
    p.add_argument("--start", type=int, default=0, help="index of the first task")
    p.add_argument("--algo", choices=["arpo", "grpo"], default="arpo")
    # max_new_tokens and max_completion_tokens: their default depends on the backend and device (`rollout_budget`)
    add_rollout_flags(p, skip=("branching", "max_tool_workers", "max_new_tokens", "max_completion_tokens"))
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help=f"tokens per turn (default {GPU_BUDGET[0]}; {CPU_BUDGET[0]} with the hf backend on a CPU)")
    p.add_argument("--max_completion_tokens", type=int, default=None,
                   help=f"tokens per trajectory (default {GPU_BUDGET[1]}; {CPU_BUDGET[1]} with the hf backend on a "
                        "CPU)")
    p.add_argument("--batch_tasks", type=int, default=4, help="tasks rolled out together (one generation batch)")
    p.add_argument("--out", default="trees.jsonl", help="JSONL file the trees are appended to; the same command "
                   "again (after a kill) rolls out only the tasks whose trees it lacks ('-': standard output)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return rollout_main(make_parser().parse_args(argv))


GPU_BUDGET = (default("max_new_tokens"), default("max_completion_tokens"))
"""Tokens per turn and per trajectory for `arpo rollout` where generation is fast (a GPU, vLLM)."""
CPU_BUDGET = (128, 1024)
"""The budget when transformers generates on a CPU: an untuned model writes until it is cut off, and M = 16 paths of
4,096 tokens take far more than the few minutes a first try should. Both flags override it."""


def rollout_budget(args: argparse.Namespace) -> tuple[tuple[int, int], str]:
    """The token budget and where it came from (printed, so a user knows why)."""
    import torch

    on_cpu = args.backend == "hf" and not torch.cuda.is_available()
    default, why = (CPU_BUDGET, "a CPU budget: no GPU") if on_cpu else (GPU_BUDGET, "the default budget")
    chosen = (default[0] if args.max_new_tokens is None else args.max_new_tokens,  # 0 is refused, not the default
              default[1] if args.max_completion_tokens is None else args.max_completion_tokens)
    return chosen, why if chosen == default else "as given"


def writable(path: str) -> None:
    """Fail now, in one line, when the trees file cannot be appended to (a folder, a missing folder, no permission),
    not after the first batch's rollouts, which were lost with a traceback. Leaves no file behind. A named pipe is
    refused: the file is read again to resume, and opening a pipe waits for its other end (the command hung,
    silently)."""
    import stat

    from arpo_algo import jsonl
    from arpo_algo.settings import ConfigError

    try:
        kind = os.stat(path).st_mode
    except OSError:
        kind = 0
    if stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind):
        raise ConfigError(f"--out {path} is a pipe: the trees go to a file (read again to resume), or with - to "
                          "standard output (arpo rollout --out - | arpo sft --from_rollouts -)")
    existed = os.path.lexists(path)
    try:
        jsonl.append(path).close()
    except OSError as exc:
        raise ConfigError(f"--out {path} cannot be written ({exc.strerror or exc}): give a file for the trees, or - "
                          "for standard output") from None
    if not existed:
        os.remove(path)


def rollout_run_id(args: argparse.Namespace, config: Any) -> str:
    """What tells one `arpo rollout`'s trees from another's in a trees file: a digest of the env, its arguments and
    data, the model (and, for a folder, its weight files' sizes and times), the backend and every rollout setting
    (not which tasks, the batch or ``--out``). A digest, since ``--env_kwargs`` may hold a key."""
    import hashlib
    from dataclasses import asdict

    from arpo_algo.generation.factory import model_files
    from arpo_algo.settings import json_object

    run = {"env": args.env, "env_kwargs": json_object("--env_kwargs", args.env_kwargs, "{}"), "dataset": args.dataset,
           "data_dir": args.data_dir, "algo": args.algo, "model": args.model, "backend": args.backend,
           "model_files": model_files(args.model, args.backend), **asdict(config)}
    return hashlib.sha256(json.dumps(run, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def rolled_out(path: str, run: str) -> tuple[set[int], int]:
    """The tasks whose trees `path` holds from the rollout `run` (`rollout_run_id`), and how many trees it holds of
    other rollouts (or that record no run: written before runs were)."""
    from arpo_algo import jsonl

    done, others = set(), 0
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
            for _, tree in jsonl.records(f):
                stats = tree.get("stats") if isinstance(tree, dict) else None
                if isinstance(stats, dict) and stats.get("run") == run and isinstance(stats.get("index"), int):
                    done.add(stats["index"])
                elif isinstance(stats, dict):
                    others += 1
    except FileNotFoundError:
        pass
    return done, others


def rollout_env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """gym.make's keyword arguments for `arpo rollout`: ``--env_kwargs`` with ``--dataset`` and ``--data_dir``, and the
    trees file (``--out``) hidden from the local sandbox: it holds the tasks' answers, and a run appending to it may
    roll the same tasks out again."""
    from arpo_algo.environments import hide_from_sandbox
    from arpo_algo.settings import json_object

    env_kwargs = json_object("--env_kwargs", args.env_kwargs, '{"max_tool_calls": 3}')
    if args.server_url:
        env_kwargs["server_url"] = args.server_url
    if args.dataset:
        env_kwargs["dataset"] = args.dataset
    if args.data_dir:
        env_kwargs["data_dir"] = args.data_dir
    return env_kwargs if args.out == "-" else hide_from_sandbox(args.env, env_kwargs, args.out)


def rollout_main(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import arpo_env  # noqa: F401
    from arpo_algo import jsonl
    from arpo_algo.environments import env_arguments
    from arpo_algo.settings import ConfigError

    env_kwargs = rollout_env_kwargs(args)
    with env_arguments(args.env):  # fail early on a bad env, dataset or argument, with its message
        probe = gym.make(args.env, **env_kwargs).unwrapped
    n_tasks = min(args.tasks, len(probe.tasks) - args.start)
    probe.close()
    wrong = [f"{flag} must be at least 1, not {value}" for flag, value in (("--tasks", args.tasks),
                                                                          ("--batch_tasks", args.batch_tasks))
             if value < 1]
    if not 0 <= args.start < len(probe.tasks):
        wrong.append(f"--start must be a task of the dataset, from 0 to {len(probe.tasks) - 1}, not {args.start}")
    if wrong:  # only what is wrong
        raise ConfigError("; ".join(wrong))
    if args.out != "-":
        writable(args.out)
    (max_new, max_completion), why = rollout_budget(args)
    config = from_flags(args, max_new_tokens=max_new, max_completion_tokens=max_completion)
    if args.out == "-":
        return roll_out(args, env_kwargs, config, n_tasks, (max_new, max_completion), why)
    with jsonl.sole_writer(args.out, f"another arpo rollout is writing {args.out} now: wait for it to end (then this "
                           "command rolls out only the tasks it lacks), or give another --out"):
        return roll_out(args, env_kwargs, config, n_tasks, (max_new, max_completion), why)


def roll_out(args: argparse.Namespace, env_kwargs: dict[str, Any], config: Any, n_tasks: int,
             budget: tuple[int, int], why: str) -> int:
    """`rollout_main` past its checks, with ``--out`` held by this process alone (`jsonl.sole_writer`)."""
    import gymnasium as gym
    from tqdm.auto import tqdm

    from arpo_algo.core.tree import write_jsonl
    from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout

    max_new, max_completion = budget
    run = rollout_run_id(args, config)
    todo = list(range(args.start, args.start + n_tasks))
    if args.out != "-":  # the same command again (after a kill) does only the tasks the file lacks
        done, others = rolled_out(args.out, run)
        if done & set(todo):
            print(f"{args.out} holds the trees of {len(done & set(todo))} of these {n_tasks} tasks from this same "
                  "rollout: the others are rolled out", file=sys.stderr)
            todo = [i for i in todo if i not in done]
        if others:
            print(f"{args.out} holds {others} trees of other rollouts (other settings, model or env): this one's are "
                  "appended after them, and `arpo view` shows them all (another --out keeps them apart)",
                  file=sys.stderr)
        n_tasks = len(todo)
        if not todo:
            print(f"nothing to roll out: {args.out} holds the trees of all of these tasks (another --out, or --start, "
                  "rolls out more)", file=sys.stderr)
            return 0
    print(f"loading {args.model} ({args.backend}) …; {max_new} tokens per turn, {max_completion} per trajectory "
          f"({why}; --max_new_tokens / --max_completion_tokens change it)", file=sys.stderr)
    generator = make_generator(args.model, args.backend)
    cls = ARPORollout if args.algo == "arpo" else GRPORollout
    start = time.perf_counter()
    rewards, correct, tools, branches = [], 0, 0, 0
    with tqdm(total=n_tasks * args.num_generations, unit="traj", desc=f"{args.algo} rollouts") as bar:
        engine = cls(generator, lambda: gym.make(args.env, **env_kwargs).unwrapped, config, progress=bar.update)
        def finished(i: int, tree: Any) -> None:  # written as soon as it is complete: a killed run keeps its work
            nonlocal correct, tools, branches
            tree.stats = {**tree.stats, "index": batch[i], "run": run}
            if args.out == "-":  # a pipe: `arpo rollout … --out - | arpo sft --from_rollouts -`
                sys.stdout.write(json.dumps(tree.to_dict(), ensure_ascii=False) + "\n")
                sys.stdout.flush()
            else:
                write_jsonl([tree], args.out)
            rewards.extend(t.reward for t in tree.trajectories)
            correct += sum(bool(t.reward_parts.get("correct")) for t in tree.trajectories)
            tools += sum(t.tool_calls for t in tree.trajectories)
            branches += tree.branches
            bar.set_postfix_str(status())

        def status(tokens: str = "") -> str:
            reward = f"reward {sum(rewards) / len(rewards):+.2f}" if rewards else ""
            return ", ".join(s for s in (reward, tokens or meter.line()) if s)

        meter = TokenMeter(generator.stats, lambda line: bar.set_postfix_str(status(line)))
        try:
            with meter:
                for first in range(0, n_tasks, args.batch_tasks):
                    batch = todo[first:first + args.batch_tasks]
                    engine.run(batch, on_tree=finished)
        finally:
            generator.close()  # a vLLM engine of its own ends now, not at the interpreter's exit
    n = max(1, len(rewards))
    stats, spares = generator.stats, engine.spares
    tasks = f"{n_tasks} task{'' if n_tasks == 1 else 's'}"
    print(f"\n{tasks}, {len(rewards)} trajectories in {time.perf_counter() - start:.1f} s → {args.out}\n"
          f"mean reward {sum(rewards) / n:+.3f} | accuracy {correct / n:.1%} | tool calls {tools} "
          f"({tools / n:.2f}/traj) | branches {branches}\n"
          f"generated tokens {stats.generated_tokens} | encoded (prefill) tokens {stats.prefill_tokens}"
          + (f"\nspare samples {spares['started']} started, {spares['taken']} taken as top-ups, "
             f"{spares['discarded']} discarded ({spares['discarded_tokens']} tokens, "
             f"{spares['discarded_tool_calls']} tool calls)" if spares["started"] else "")
          + (f"\nspeculative branches {engine.speculative['started']} started, {engine.speculative['kept']} kept "
             f"({stats.speculative_tokens} tokens discarded)" if engine.speculative["started"] else ""),
          file=sys.stderr if args.out == "-" else sys.stdout)
    return 0
