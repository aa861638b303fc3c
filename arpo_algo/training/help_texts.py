"""The curated ``--help`` of ``arpo train`` and ``arpo sft``.

Both commands print a text kept in the package (``arpo_algo/cli/help/``), so that help needs no TRL import and fits
a screen or two; ``--help-all`` is TRL's full list. This module writes those texts from the dataclasses' own help,
and a test checks that they are up to date::

    python -m arpo_algo.training.help_texts     # writes arpo_algo/cli/help/{train,sft}.txt
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import Field, fields
from pathlib import Path
from typing import Sequence

from trl import ModelConfig

HELP_DIR = Path(__file__).resolve().parent.parent / "cli" / "help"


TRAIN_ESSENTIALS = ("model_name_or_path", "output_dir", "dataset_name", "learning_rate", "max_steps",
                    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                    "max_completion_length", "temperature", "top_p", "loss_type", "beta", "use_vllm", "vllm_mode",
                    "use_peft", "save_steps", "logging_steps", "report_to", "seed", "resume_from_checkpoint")
"""The TRL / transformers flags ``arpo train --help`` shows after ``--config`` and ARPO's own."""

SFT_ESSENTIALS = ("model_name_or_path", "output_dir", "learning_rate", "num_train_epochs", "max_steps",
                  "per_device_train_batch_size", "gradient_accumulation_steps", "max_length", "use_peft",
                  "save_steps", "logging_steps", "report_to", "seed", "resume_from_checkpoint")
"""The TRL / transformers flags ``arpo sft --help`` shows after ``--config`` and the cold start's own."""


def _line(spec: Field) -> str:
    """``  --name {a,b}   the help's first sentence``, wrapped under itself."""
    meta = spec.metadata
    text = " ".join(str(meta.get("help", "")).split())
    text = re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[a-z0-9`)'\]]\.) ", text, maxsplit=1)[0]  # the rest is in --help-all
    choices = f" {{{','.join(map(str, meta['choices']))}}}" if meta.get("choices") else ""
    flag = f"  --{spec.name}{choices}"
    if len(flag) > 32:
        return flag + "\n" + textwrap.fill(text, 110, initial_indent=" " * 34, subsequent_indent=" " * 34)
    return textwrap.fill(text, 110, initial_indent=flag.ljust(34), subsequent_indent=" " * 34)


def curated_help(usage: str, intro: str, own: Sequence[Field], essentials: Sequence[str], classes: Sequence[type],
                 own_title: str) -> str:
    """Help of a TRL-parsed command: usage, what it does, ``--config``, its own flags in full, the most used TRL
    flags in a sentence each, and where the rest are."""
    everything = {f.name: f for cls in classes for f in fields(cls)}
    prog = usage.split()[1] if len(usage.split()) > 1 else ""
    return "\n".join([
        f"usage: {usage}", "", textwrap.fill(intro, 110), "",
        "  --config RECIPE.yaml".ljust(34) + "a YAML mapping of any of the flags below (examples/recipes/); flags "
        "override it",
        "", f"{own_title}:", *[_line(f) for f in own], "",
        "Most used TRL and transformers flags:", *[_line(everything[n]) for n in essentials], "",
        f"Every flag takes either spelling (--data_dir or --data-dir). All ~300 flags: arpo {prog} --help-all",
    ]) + "\n"


def train_help() -> str:
    from trl import GRPOConfig

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.train import ARPOScriptArguments

    grpo = {f.name for f in fields(GRPOConfig)}
    script = [f for f in fields(ARPOScriptArguments) if f.name in ("data_dir", "train_limit", "eval_dataset_name",
                                                                   "cold_start")]
    own = [f for f in fields(ARPOConfig) if f.name not in grpo] + script
    return curated_help("arpo train --config RECIPE.yaml [--FLAG VALUE ...]",
                        "Train a model with ARPO, or with the GRPO, DAPO and REINFORCE++ baselines, on an arpo "
                        "environment. Without --config and without a GPU it refuses: the defaults are sized for a "
                        "GPU, and examples/recipes/smollm2_cpu.yaml is the CPU recipe.",
                        own, TRAIN_ESSENTIALS, (ARPOScriptArguments, ARPOConfig, ModelConfig), "ARPO")


def sft_help() -> str:
    from arpo_algo.training.config import ColdStartConfig
    from arpo_algo.training.sft import SFTScriptArguments

    return curated_help("arpo sft --config RECIPE.yaml [--FLAG VALUE ...]",
                        "The cold start: supervised fine-tuning on tool-integrated trajectories (files, rollout "
                        "trees, or synthetic traces a scripted teacher plays in the sandbox). Tool output is masked "
                        "from the loss, as in RL.",
                        list(fields(SFTScriptArguments)), SFT_ESSENTIALS,
                        (SFTScriptArguments, ColdStartConfig, ModelConfig), "Cold start")


HELP_TEXTS = {"train": train_help, "sft": sft_help}


def write_help_texts() -> list[Path]:
    HELP_DIR.mkdir(exist_ok=True)
    written = []
    for command, make in HELP_TEXTS.items():
        path = HELP_DIR / f"{command}.txt"
        path.write_text(make(), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written in write_help_texts():
        print(f"wrote {written}")
