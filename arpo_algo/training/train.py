"""``arpo train``: ARPO (or a baseline) from a YAML recipe and flags, parsed by TRL's `TrlParser`.

The flags are ``trl grpo``'s (every `GRPOConfig` and `ModelConfig` field), ARPO's (`ARPOConfig`) and a few of the
script's own (`ARPOScriptArguments`). A recipe is a YAML mapping of the same names; flags override it::

    arpo train --config examples/recipes/smollm2_cpu.yaml --max_steps 20 --algorithm grpo
    accelerate launch --config_file examples/accelerate/zero3.yaml -m arpo_algo.cli train --config recipe.yaml

The run directory (``output_dir``) receives TRL's checkpoints (``checkpoint-N/``), ``metrics.jsonl`` (one line per
logging step, appended) and ``rollouts.jsonl`` (the rollout trees, appended). ``--resume_from_checkpoint`` takes a
checkpoint folder, or ``last`` for the newest checkpoint in ``output_dir``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from trl import ModelConfig, ScriptArguments, TrlParser

from arpo_algo.flags import help_all_as_trl_help
from arpo_algo.training.config import ARPOConfig
from arpo_algo.training.parser import RecipeParser


@dataclass
class ARPOScriptArguments(ScriptArguments):
    """Script arguments of ``arpo train``. ``dataset_name``, when given, is the environment's dataset (``gsm8k``,
    ``arithmetic:2000:0``, a JSONL/JSON/parquet/CSV path, ``hub:owner/name``); ``data_dir`` is where named datasets
    live."""

    data_dir: str | None = field(default=None, metadata={"help": "Directory of named datasets (env kwarg data_dir)."})
    train_limit: int | None = field(default=None, metadata={"help": "Use only the first N tasks of the dataset."})
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Held-out tasks for TRL's evaluation (eval_strategy, eval_steps), e.g. "
                                        "chain:32:99 — logged as eval_reward, eval_arpo/accuracy, ..."})
    eval_limit: int | None = field(default=None, metadata={"help": "Use only the first N held-out tasks."})
    cold_start: str | None = field(
        default=None,
        metadata={"help": "An `arpo sft` recipe (YAML). When model_name_or_path does not exist yet, that SFT stage "
                          "runs first and writes it (the cold start of the paper's two-stage training). A relative "
                          "path is read from the current folder, else from the recipe's folder or one above it."},
    )

    def __post_init__(self) -> None:
        getattr(super(), "__post_init__", lambda: None)()
        from arpo_algo.settings import ConfigError

        for name in ("train_limit", "eval_limit"):  # 0 trained on every task, -1 on all but the last
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (left out: every task), not {value}")


def make_parser() -> TrlParser:
    return RecipeParser((ARPOScriptArguments, ARPOConfig, ModelConfig), prog="arpo train")


def parse_recipe(parser: TrlParser, argv: Sequence[str] | None) -> tuple[Any, ...]:
    """`parser.parse_args_and_config(argv)`, with a recipe that is not YAML, not a mapping, or has a key no config
    knows, and a setting TRL or transformers refuses in its own checks (``generation_batch_size (8) must be divisible
    by num_generations (3)``), as a `ConfigError`: one line, not a traceback. Those checks run before TRL looks for
    unknown keys, so a misspelt key whose default they refuse (``num_generation: 4`` leaves 16) is named first."""
    import yaml

    from arpo_algo.settings import ConfigError

    try:
        return parser.parse_args_and_config(argv)
    except UnicodeDecodeError as exc:  # a binary file, another encoding: a traceback (from TRL's open(), then ours)
        raise ConfigError(f"the recipe {recipe_path(list(argv or sys.argv[1:]))} is not UTF-8 text: {exc.reason} at "
                          f"byte {exc.start}") from None
    except TypeError:
        keys = _keys_not_text(recipe_path(list(argv or sys.argv[1:])))
        if not keys:
            raise
        raise ConfigError(f"the recipe has a key that is no name: {', '.join(keys)} (its keys, and its env table's, "
                          "name settings and variables)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"the recipe is not valid YAML: {getattr(exc, 'problem', None) or exc}{where}") from None
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        message = " ".join(str(exc).split())
        recipe = message.startswith("Unknown arguments from config file")
        if recipe or message.startswith("Some specified arguments are not used"):
            names = _unknown_names(parser, re.findall(r"'--([\w.-]+)'", message), recipe)
            raise ConfigError(f"{names} {_all_flags(parser)}") from None
        keys, flags = _unknown_in(parser, argv)
        if keys or flags:
            named = [_unknown_names(parser, keys, recipe=True)] if keys else []
            named += [_unknown_names(parser, flags)] if flags else []
            it = "them" if len(keys) + len(flags) > 1 else "it"
            raise ConfigError(f"{'; '.join(named)} {_all_flags(parser)}; with {it} left out: {message}") from None
        raise ConfigError(message) from None


def _keys_not_text(recipe: str | None) -> list[str]:
    """The keys of `recipe` (a YAML mapping) and of its ``env`` table that are no text (``1: 2``, ``env: {5: x}``),
    as they read: TRL's "keywords must be strings", "str expected, not int" were tracebacks."""
    import yaml

    try:
        config = yaml.safe_load(Path(recipe).read_text(encoding="utf-8")) if recipe else None
    except (OSError, ValueError, yaml.YAMLError):
        return []
    if not isinstance(config, dict):
        return []
    table = config.get("env") if isinstance(config.get("env"), dict) else {}
    return [repr(k) for k in [*config, *table] if not isinstance(k, str)]


def recipe_path(argv: Sequence[str]) -> str | None:
    """The recipe's path as TRL reads it: the argument after the first ``--config``."""
    args = list(argv)
    at = args.index("--config") if "--config" in args else None
    return args[at + 1] if at is not None and at + 1 < len(args) else None


def _unknown_in(parser: TrlParser, argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The recipe's keys and the command line's flags that `parser` does not know (TRL reads the recipe given after
    ``--config``; ``env`` is its table of environment variables)."""
    import yaml

    args = list(argv) if argv is not None else sys.argv[1:]
    config: Any = {}
    recipe = recipe_path(args)
    if "--config" in args:
        try:
            config = yaml.safe_load(Path(recipe).read_text()) if recipe else {}
        except (OSError, yaml.YAMLError):
            pass
        at = args.index("--config")
        del args[at:at + 2]
    known = {action.dest for action in parser._actions}
    keys = [str(k) for k in config if k != "env" and k not in known] if isinstance(config, dict) else []
    try:
        rest = parser.parse_known_args(args)[1]
    except SystemExit:  # argparse's own error: parse_args_and_config would have stopped on it before
        rest = []
    return keys, [s[2:].split("=")[0] for s in rest if s.startswith("--")]


OTHER_NAMES = {"alpha": "branch_alpha", "Z": "branch_factor", "branches": "branch_factor",
               "num_branches": "branch_factor", "M": "num_generations", "N": "num_global",
               "global_samples": "num_global", "k": "entropy_k", "dataset": "dataset_name", "tasks": "train_limit",
               "algo": "algorithm", "env": "env_id", "max_new_tokens": "max_new_tokens_per_turn",
               "max_completion_tokens": "max_completion_length"}
"""What the paper (α, Z, M, N, k) and ``arpo rollout``'s flags call a setting, by the name ``arpo train`` knows it
by: the nearest spelling of ``alpha`` is ``lora_alpha``, of ``dataset`` ``data_seed``. (ARPO's β is
``branch_beta``; ``beta`` is TRL's KL weight, a flag, so never an unknown name.)"""


def _unknown_names(parser: TrlParser, names: Sequence[str], recipe: bool = False) -> str:
    """"the recipe has keys no flag knows: learning_rat (did you mean learning_rate?)", or "unknown flags: …"; a
    name the paper or ``arpo rollout`` uses is given the flag's (`OTHER_NAMES`)."""
    from dataclasses import fields

    from arpo_env.tools.protocol import did_you_mean

    known = [f.name for cls in parser.dataclass_types for f in fields(cls)]
    named = [f"{name} ({parser.prog} calls it {OTHER_NAMES[name]})" if OTHER_NAMES.get(name) in known else
             did_you_mean([name], known) for name in names]
    return f"{'the recipe has keys no flag knows' if recipe else 'unknown flags'}: {', '.join(named)}"


def _all_flags(parser: TrlParser) -> str:
    return f"(the flags: {parser.prog} {'--help-all' if parser.prog == 'arpo train' else '--help'})"


RESULTS = ("checkpoint-*", "metrics.jsonl", "rollouts*.jsonl", "*.safetensors", "adapter_config.json")
"""What a run leaves once it has done any work: a folder with none of these is removed when the run fails."""


def has_results(output_dir: str) -> bool:
    folder = Path(output_dir)
    return any(next(folder.glob(pattern), None) is not None for pattern in RESULTS)


def removed_if_unused(output_dir: str) -> Any:
    """`jsonl.removed_if_unused` for a run folder (`has_results`), from the launch's first process only (the others
    share its folder)."""
    from contextlib import nullcontext

    from arpo_algo import jsonl

    if os.environ.get("RANK", "0") != "0":
        return nullcontext()
    return jsonl.removed_if_unused(output_dir, lambda: has_results(output_dir))


def check_output_dir(output_dir: str) -> None:
    """An ``output_dir`` that cannot be a run directory — a file is there, or a file stands where one of its parent
    folders should — as a `ConfigError` now: it was a FileExistsError traceback from transformers once the model was
    loaded (and, with a cold start, after the SFT stage had run)."""
    from arpo_algo.settings import ConfigError

    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"output_dir {output_dir} is a file, not a folder: give a folder for the run")
    blocking = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
    if not folder.exists() and blocking is not None:
        raise ConfigError(f"output_dir {output_dir} cannot be made: {blocking} is a file")


HELD_ENV = "ARPO_HELD_OUTPUT_DIR"
"""The folder this process (or, for a cold start's ``arpo sft``, its ``arpo train``) holds (`held_output_dir`)."""


@contextmanager
def held_output_dir(output_dir: str, busy: str | None = None) -> Iterator[None]:
    """``output_dir`` held by this launch alone while it runs (`jsonl.sole_writer`): a second ``arpo train`` or
    ``arpo sft`` into the folder at once saved its checkpoints over the first's, appended to its logs and moved them
    aside as an earlier run's. Held by the launch's first process (the others are its own), and not again where it
    is held already (`HELD_ENV`): by the ``arpo sft`` of a cold start, whose ``arpo train`` holds the folder for it,
    or by a cold start into the run's own ``output_dir``. With `busy`, wait for the folder, saying so."""
    from arpo_algo import jsonl

    where = os.path.abspath(output_dir)
    if os.environ.get("RANK", "0") != "0" or os.environ.get(HELD_ENV) == where:
        yield
        return
    with jsonl.sole_writer(output_dir, busy or f"another run is writing to {output_dir} now: wait for it to end "
                           "(resume_from_checkpoint: last then goes on from its checkpoint), or give another "
                           "output_dir", folder=True, wait=busy is not None):
        before, os.environ[HELD_ENV] = os.environ.get(HELD_ENV), where  # seen by a cold start's child and this process
        try:
            yield
        finally:
            if before is None:
                del os.environ[HELD_ENV]
            else:
                os.environ[HELD_ENV] = before


def resolve_resume(value: Any, output_dir: str, command: str = "arpo train") -> str | None:
    """``last``/``true`` → the newest complete ``checkpoint-N`` in ``output_dir`` (None when there is none yet). A
    checkpoint is complete once its ``trainer_state.json``, which transformers writes last, reads: a run killed while
    it saved a checkpoint leaves one without it (or without its weights), which resumes from nothing; the one before
    it is taken, and the skipped one named."""
    if value in (None, False, "", "false", "False"):
        return None
    if value is True or str(value).lower() in ("true", "last"):
        return newest_checkpoint(output_dir, command=command)
    if not os.path.isdir(str(value)):
        raise SystemExit(f"{command}: checkpoint {value} not found")
    if not checkpoint_complete(str(value)):
        raise SystemExit(f"{command}: checkpoint {value} is incomplete (no trainer_state.json that reads, or no "
                         "weights: the run was stopped while saving it); resume from an earlier one, or with 'last'")
    return str(value)


def note_starting_over(resume: str | None, output_dir: str, command: str = "arpo train") -> None:
    """A run without ``--resume_from_checkpoint`` into a folder that holds a checkpoint says that it starts over from
    step 0, and how to go on instead (a stopped run started again without the flag lost its steps without a word).
    Said once the run is set up, so that a mistake in it stays one line."""
    earlier = None if resume else newest_checkpoint(output_dir, quiet=True)
    if earlier and os.environ.get("RANK", "0") == "0":
        print(f"{command}: {output_dir} holds {os.path.basename(earlier)} of an earlier run; this run starts over "
              "from step 0 (--resume_from_checkpoint last goes on from it)", file=sys.stderr)


def newest_checkpoint(output_dir: str, quiet: bool = False, command: str = "arpo train") -> str | None:
    """The newest complete ``checkpoint-N`` in `output_dir` (incomplete ones named on stderr unless `quiet`)."""
    if not os.path.isdir(output_dir):
        return None
    pattern = re.compile(r"^checkpoint-(\d+)$")
    found = sorted((int(m.group(1)), entry) for entry in os.listdir(output_dir)
                   if (m := pattern.match(entry)) and os.path.isdir(os.path.join(output_dir, entry)))
    for _, name in reversed(found):
        folder = os.path.join(output_dir, name)
        if checkpoint_complete(folder):
            return folder
        if not quiet:
            print(f"{command}: {folder} is incomplete (the run was stopped while saving it); skipped",
                  file=sys.stderr)
    return None


def checkpoint_complete(folder: str) -> bool:
    """Whether a checkpoint folder holds its trainer state (which reads) and its model's weights."""
    try:
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return False
    names = os.listdir(folder)
    return any(n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names) \
        or any(n.startswith(("pytorch_model_fsdp", "global_step")) for n in names)


def build_trainer(script_args: ARPOScriptArguments, args: ARPOConfig, model_args: ModelConfig) -> Any:
    from trl import get_peft_config

    from arpo_algo.environments import env_arguments
    from arpo_algo.generation.models import load_tokenizer, resolve
    from arpo_algo.settings import ConfigError
    from arpo_algo.training.trainer import ARPOTrainer
    from arpo_env.integrations.trl_dataset import task_dataset

    env_kwargs = dict(args.env_kwargs or {})
    # both given, and apart: the recipe's dataset_name won over --env_kwargs '{"dataset": …}' in silence (and the
    # other way round for a recipe's env_kwargs), so a run trained on other tasks than the ones asked for
    both = [f"{flag} {given!r} and env_kwargs' {key} {env_kwargs[key]!r}"
            for flag, key, given in (("dataset_name", "dataset", script_args.dataset_name),
                                     ("data_dir", "data_dir", script_args.data_dir))
            if given and env_kwargs.get(key) not in (None, given)]
    if both:
        raise ConfigError(f"{'; '.join(both)} differ: name each once (--dataset_name and --data_dir override the "
                          "recipe's)")
    if script_args.dataset_name:
        env_kwargs["dataset"] = script_args.dataset_name
    if script_args.data_dir:
        env_kwargs["data_dir"] = script_args.data_dir
    args.env_kwargs = env_kwargs
    # before the cold start: an env argument the env refuses is found now, not minutes later
    with env_arguments(args.env_id):
        dataset = task_dataset(args.env_id, limit=script_args.train_limit, **ARPOTrainer.env_kwargs(args))
        eval_dataset = None
        if script_args.eval_dataset_name:
            eval_kwargs = {**ARPOTrainer.env_kwargs(args), "dataset": script_args.eval_dataset_name}
            eval_dataset = task_dataset(args.env_id, limit=script_args.eval_limit, **eval_kwargs)
    model_name = model_args.model_name_or_path or "smollm2-135m"
    cold_start_s = None
    said = bool(script_args.cold_start) and not holds_model(model_name)
    if said:  # the cold start is long work: say what is about to run first
        say_plan(script_args, args, model_args)
    if script_args.cold_start:
        from accelerate import PartialState

        from arpo_algo.generation.models import EMBEDDED

        state = PartialState()
        with state.main_process_first():  # one process runs the cold start; the others then find it done
            if not holds_model(model_name):
                cold_start_s = run_cold_start(script_args.cold_start, model_name)
            elif state.is_main_process and model_name.lower() not in EMBEDDED:
                print(reused_cold_start(model_name, script_args.cold_start), file=sys.stderr)
    path = resolve(model_name)
    if not said:
        say_plan(script_args, args, model_args)  # the inputs are checked; the model loads next
    model_init_kwargs = dict(args.model_init_kwargs or {})
    if model_args.dtype and model_args.dtype != "auto":
        model_init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation:
        model_init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    args.model_init_kwargs = model_init_kwargs or None
    trainer = ARPOTrainer(path, args=args, train_dataset=dataset, eval_dataset=eval_dataset,
                          processing_class=load_tokenizer(model_name), peft_config=get_peft_config(model_args))
    trainer.cold_start_seconds = cold_start_s
    return trainer


def holds_model(path: str) -> bool:
    """Whether `path` names a finished model: the embedded one (``smollm2-135m``), or a folder with its config (or
    a PEFT adapter's) and its tokenizer, which ``arpo sft`` writes last. A cold start that was stopped leaves the
    folder without them (empty, or with checkpoints only)."""
    from arpo_algo.generation.models import EMBEDDED

    if path.lower() in EMBEDDED:  # the embedded model's name is not a folder to write the cold start into
        return True
    folder = Path(path)
    return ((folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()) and \
        (folder / "tokenizer_config.json").is_file()


COLD_START_RECIPE = "arpo_cold_start.yaml"
"""The cold-start recipe as it was when it made the model, kept in the model's folder (`reused_cold_start`)."""


def reused_cold_start(model: str, recipe: str) -> str:
    """The line `arpo train` writes when the cold start's model is there already and is used as it is: a recipe
    edited since (more synthetic tasks, another family) was not run again, and nothing said so."""
    try:
        then: str | None = (Path(model) / COLD_START_RECIPE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        then = None
    try:
        now: str | None = Path(recipe).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        now = None
    if then is None:
        return f"arpo train: starting from {model}, which exists: the cold start {recipe} is not run"
    if then != now:
        return (f"arpo train: starting from {model}, which the cold start made from an earlier version of {recipe}: "
                f"delete {model} to run the cold start again on the recipe as it is now")
    return f"arpo train: starting from {model}, made by the cold start {recipe} (delete it to run that again)"


def beside_recipe(path: str | None, recipe: str | None) -> str | None:
    """A file the `recipe` names (``cold_start``) by a relative path: from the current folder when it is there, else
    from the recipe's folder or the nearest folder above it that has it (the shipped recipes name each other from the
    project's root: ``arpo train --config ~/arpo/examples/recipes/smollm2_cpu.yaml`` run from another folder found no
    ``examples/recipes/smollm2_sft_cpu.yaml``)."""
    if not path or not recipe or os.path.isabs(path) or os.path.exists(path):
        return path
    folder = Path(recipe).resolve().parent
    for above in (folder, *folder.parents):
        if (above / path).exists():
            return str(above / path)
    return path


def run_cold_start(recipe: str, output_dir: str) -> float | None:
    """Run the ``arpo sft`` recipe in a child process (its memory is all given back before RL starts; a cold start
    in this process kept its model and optimizer alive beside the RL ones) and return its wall time. A cold start
    that was stopped (the folder is there without a model) runs again, from its last checkpoint if it saved one.
    None when another run made the model while this one waited for it."""
    import subprocess
    import time

    if not Path(recipe).is_file():
        raise FileNotFoundError(f"cold-start recipe {recipe} not found")
    why = "does not exist" if not Path(output_dir).exists() else "holds no finished model (a cold start stopped?)"
    # two runs of one recipe at once (other output_dirs) each ran the cold start into the same folder: the second
    # waits for the first's, then finds the model made
    with held_output_dir(output_dir, f"arpo train: another run is making the cold-start model in {output_dir} now; "
                         "waiting for it"):
        if holds_model(output_dir):
            print(reused_cold_start(output_dir, recipe), file=sys.stderr)
            return None
        resume = newest_checkpoint(output_dir)  # one the kill cut short is skipped (get_last_checkpoint took it)
        print(f"arpo train: {output_dir} {why}; running the cold-start SFT recipe {recipe} first"
              + (f", resuming from {resume}" if resume else ""), file=sys.stderr)
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "sft", "--config", recipe, "--output_dir",
                                 output_dir] + (["--resume_from_checkpoint", resume] if resume else []))
        if result.returncode != 0:
            raise SystemExit(f"arpo train: the cold start ({recipe}) failed with exit status {result.returncode}")
        try:  # what the model was made from, for the runs that find it there (`reused_cold_start`)
            (Path(output_dir) / COLD_START_RECIPE).write_text(Path(recipe).read_text(encoding="utf-8"),
                                                              encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            pass
        return time.perf_counter() - started


def summary(trainer: Any, seconds: float) -> str:
    """What a person wants to read at the end: the first and last logged values and where everything is."""
    logs = [h for h in trainer.state.log_history if "reward" in h]
    out = Path(trainer.args.output_dir)
    lines = [f"\n{trainer.args.algorithm.upper()} finished {trainer.state.global_step} steps in {seconds:.0f} s"]
    cold = getattr(trainer, "cold_start_seconds", None)
    if cold is not None:
        lines.append(f"  time                     cold-start SFT {cold:.0f} s, then RL {seconds:.0f} s")
    if logs:
        first, last = logs[0], logs[-1]
        for key, label in (("reward", "reward"), ("arpo/accuracy", "accuracy"), ("arpo/format_valid",
                                                                                   "format valid"),
                           ("arpo/tool_calls_per_trajectory", "tool calls / trajectory"),
                           ("arpo/branches_per_question", "branches / question")):
            if key in first and key in last:
                lines.append(f"  {label:<24} {first[key]:8.3f} (step {first['step']}) → {last[key]:8.3f} "
                             f"(step {last['step']})")
    checkpoints = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    lines += [f"  run directory            {out}",
              f"  checkpoints              {', '.join(p.name for p in checkpoints) or 'none'}",
              f"  metrics                  {out / 'metrics.jsonl'}",
              f"  rollout trees            {out / (trainer.args.rollout_log or '-')}"]
    if trainer.args.rollout_log:
        lines.append(f"  look at them             arpo view {out} --out {out / 'report.html'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = help_all_as_trl_help(sys.argv[1:] if argv is None else argv)  # --help: arpo_algo.cli.main
    refuse_gpu_defaults_on_cpu(argv)
    parser = make_parser()
    script_args, args, model_args = parse_recipe(parser, argv)
    script_args.cold_start = beside_recipe(script_args.cold_start, recipe_path(argv))
    if args.beta:  # the paper's β = 0.2 written as `beta: 0.2` trained with a KL penalty instead, silently
        print(f"arpo train: beta={args.beta} is TRL's KL weight (a reference model is kept and the policy pulled "
              f"towards it); ARPO's β, the slope of P = α + β·ΔH, is branch_beta (here {args.branch_beta})",
              file=sys.stderr)
    check_output_dir(args.output_dir)
    check_launch(args)
    with removed_if_unused(args.output_dir), held_output_dir(args.output_dir):
        return run_training(script_args, args, model_args)


CPU_RECIPE = "examples/recipes/smollm2_cpu.yaml"
"""The recipe a machine without a GPU is pointed to."""


def refuse_gpu_defaults_on_cpu(argv: Sequence[str]) -> None:
    """``arpo train`` with neither ``--config`` nor ``--max_steps`` on a machine without a GPU is refused: the
    defaults are the paper's GPU run (M = 16, 4,096 tokens, 300 steps), which would run for days on a CPU."""
    import torch

    from arpo_algo.settings import ConfigError

    chosen = any(a.split("=")[0] in ("--config", "--max_steps", "--max-steps", "--help") for a in argv)
    if not chosen and not torch.cuda.is_available():
        raise ConfigError(f"no --config and no GPU: the defaults are sized for a GPU (M = 16, 4,096 tokens, 300 "
                          f"steps). On a CPU: arpo train --config {CPU_RECIPE} (give --max_steps to run the "
                          "defaults anyway)")


def say_plan(script_args: Any, args: Any, model_args: Any) -> None:
    """`plan` on stderr, from the launch's first process."""
    if os.environ.get("RANK", "0") == "0":
        print(plan(script_args, args, model_args), file=sys.stderr)


def plan(script_args: Any, args: Any, model_args: Any) -> str:
    """What `arpo train` is about to run, in a few lines, printed once its inputs are checked and before the long
    work (the cold start, or the model's loading)."""
    env_kwargs = dict(args.env_kwargs or {})
    dataset = script_args.dataset_name or env_kwargs.get("dataset") or "the env's default"
    rollout = (f"M = {args.num_generations}, N = {args.num_global}, Z = {args.branch_factor}, "
               f"P = clip({args.branch_alpha} + {args.branch_beta}·ΔH)" if args.algorithm == "arpo"
               else f"M = {args.num_generations}")
    model = model_args.model_name_or_path or "smollm2-135m"
    cold = f" (made first by the cold start {script_args.cold_start})" if script_args.cold_start else ""
    return (f"arpo train: {args.algorithm.upper()} on {args.env_id} ({dataset}), model {model}{cold}\n"
            f"  rollouts    {rollout}; {args.max_new_tokens_per_turn} tokens per turn, {args.max_completion_length} "
            "per trajectory\n"
            f"  steps       {args.max_steps if args.max_steps > 0 else 'by epochs'}, micro-batches of "
            f"{args.per_device_train_batch_size} trajector{'y' if args.per_device_train_batch_size == 1 else 'ies'} "
            f"× {args.gradient_accumulation_steps} accumulated, device {args.device}\n"
            f"  output      {args.output_dir}")


def check_launch(args: Any) -> None:
    """`arpo_algo.training.distributed.check_processes_joined` before the model loads (and before the output folder is
    held: processes that did not join one another all take it for the launch's first)."""
    from accelerate import PartialState

    from arpo_algo.training.distributed import check_processes_joined

    args.device  # noqa: B018 - sets up accelerate's state as TrainingArguments does, use_cpu included
    check_processes_joined(PartialState())


def run_training(script_args: Any, args: Any, model_args: Any) -> int:
    """`main` past its checks, with ``output_dir`` held by this launch alone (`jsonl.sole_writer`)."""
    import time

    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir)
    trainer = build_trainer(script_args, args, model_args)
    start = time.perf_counter()  # the RL phase; the cold start (if it ran) is timed in build_trainer
    note_starting_over(resume, args.output_dir)
    if resume:
        print(f"arpo train: resuming from {resume}", file=sys.stderr)
    trainer.train(resume_from_checkpoint=resume)
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        print(summary(trainer, time.perf_counter() - start))
        with open(Path(args.output_dir) / "arpo_config.json", "w") as f:
            json.dump({k: v for k, v in vars(args).items() if _jsonable(v)}, f, indent=1, default=str)
    if hasattr(trainer, "end"):  # transformers >= 5.18: finish the trackers, destroy the process group
        trainer.end()
    return 0


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))
