"""Training on several processes: the rollout engine's generation under FSDP 2 and ZeRO-3, and the launches the
engine cannot run in lock step (refused before the model loads)."""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from arpo_algo.settings import ConfigError


class HFGeneration:
    """Generate with the trained model itself: unwrapped for generation (DeepSpeed ZeRO-3 parameters gathered,
    FSDP 1 parameters summoned, FSDP 2 units held unsharded), in eval mode and without gradients, then back to
    training."""

    def __init__(self, trainer: Any) -> None:  # an ARPOTrainer
        self.trainer = trainer

    def __enter__(self) -> Any:
        from trl.models.utils import unwrap_model_for_generation

        from arpo_algo.generation.hf_generator import HFGenerator

        t = self.trainer
        self.was_training = t.model.training
        self.contexts = [
            unwrap_model_for_generation(t.model_wrapped, t.accelerator,
                                        gather_deepspeed3_params=t.args.ds3_gather_for_generation,
                                        gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs),
            torch.no_grad(),
            t._dist.summon_full_params(t.model_wrapped, recurse=False),
        ]
        model = self.contexts[0].__enter__()
        for ctx in self.contexts[1:]:
            ctx.__enter__()
        self.contexts.append(fsdp2_unsharded(model))
        self.contexts[-1].__enter__()
        self.generator = HFGenerator(model, t._tokenizer)
        return self.generator

    def __exit__(self, *exc: Any) -> None:
        self.generator.close()
        for ctx in reversed(self.contexts):
            ctx.__exit__(*exc)
        self.trainer.model.train(self.was_training)


_WARNED: set[str] = set()


def check_processes_joined(state: Any, environ: Any = os.environ) -> None:
    """Processes that a launcher started together but that did not join one another: each would train alone, save
    its checkpoints over the others' and append to the same logs (`accelerate launch
    --config_file examples/accelerate/fsdp.yaml` on a machine without a GPU, without ``use_cpu``: accelerate runs FSDP
    and ``--multi_gpu`` on GPUs only, and left every process undistributed; each "finished"). That is a
    `ConfigError`. FSDP asked for where accelerate runs plain data parallelism instead (``use_cpu``: over gloo) is a
    warning: every process then holds the whole model and its optimizer state."""
    launched = int(environ.get("WORLD_SIZE", "1") or 1)
    kind = str(getattr(state.distributed_type, "value", state.distributed_type))
    if launched > 1 and state.num_processes != launched:
        raise ConfigError(
            f"{launched} processes were launched, but accelerate did not join them ({kind}): each would train alone "
            "and write over the others' checkpoints and logs. accelerate runs FSDP, DeepSpeed and --multi_gpu on "
            "GPUs; on a machine without one, set use_cpu: true (the processes then join over gloo)")
    if (launched > 1 and str(environ.get("ACCELERATE_USE_FSDP", "")).lower() == "true" and kind != "FSDP"
            and environ.get("RANK", "0") == "0" and "fsdp" not in _WARNED):
        _WARNED.add("fsdp")  # once a launch: by its first process, once (arpo train checks before the trainer)
        warnings.warn(f"FSDP was asked for, but accelerate runs FSDP on GPUs only: these {launched} processes train "
                      f"with {kind} (each holds the whole model and its optimizer state)", UserWarning, stacklevel=2)


def lockstep_problem(dist: Any, ds3_gather_for_generation: bool, use_vllm: bool, num_processes: int) -> str | None:
    """Why the transformers backend cannot generate on these processes, or None.

    Each process rolls out its own trees, so each takes its own number of decoding steps. Under DeepSpeed ZeRO-3
    without ``ds3_gather_for_generation`` and under FSDP 1, every forward gathers parameters from every process (a
    collective), so a process that has finished its rollout while another still decodes leaves it waiting for ever
    or matches its gather with another collective (run on two gloo processes: "Is there a distributed collective
    mismatch"). transformers' ``generate`` keeps processes in step with dummy forwards (``synced_gpus``); the rollout
    engine gathers the parameters once instead: ZeRO-3 with ``ds3_gather_for_generation`` (TRL's default) and FSDP 2
    (`fsdp2_unsharded`)."""
    if use_vllm or num_processes < 2:
        return None
    if dist.is_zero3 and not ds3_gather_for_generation:
        return ("ARPO's rollouts take a different number of decoding steps on each process, and under DeepSpeed "
                "ZeRO-3 without ds3_gather_for_generation each step gathers the parameters from every process: set "
                "ds3_gather_for_generation: true (the default), or use_vllm")
    if dist.fsdp_version == 1:
        return ("ARPO's rollouts take a different number of decoding steps on each process, and under FSDP 1 each "
                "step gathers the parameters from every process: use FSDP 2 (fsdp_version: 2, as "
                "examples/accelerate/fsdp.yaml), or use_vllm")
    return None


@contextmanager
def fsdp2_unsharded(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Hold every FSDP 2 unit of `model` unsharded (its full parameters on this process), and kept so after each
    forward, until the block ends; then shard them again as they were. Outside FSDP 2, nothing.

    An FSDP 2 unit gathers its parameters before each forward and frees them after it (``reshard_after_forward``):
    a collective at every decoding step, and the processes, each on its own rollout, take different numbers of
    steps, so the first to finish left the others in a gather no one else joined. Here the gathers happen once, on
    every process alike, when generation starts, and no forward inside gathers anything (FSDP 2's pre-forward skips
    a unit that is unsharded)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP 2
        yield model
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield model
        return
    kept = [_reshard_settings(unit._get_fsdp_state()) for unit in units]
    try:
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        yield model
    finally:
        for flags, groups in kept:
            for (owner, name), value in [*flags, *groups]:
                setattr(owner, name, value)
        for unit in units:
            unit.reshard()


def _reshard_settings(state: Any) -> tuple[list, list]:
    """What FSDP 2's public ``set_reshard_after_forward`` changes on one unit's state, as (owner, attribute) and
    value pairs, to be put back as the unit had it (a root unit's differs from the others', and accelerate's
    ``fsdp_reshard_after_forward`` sets them). Private, and laid out differently across torch releases (one param
    group or a list of them; ``_reshard_after_forward`` in later ones): only what this release has is read."""
    flags = [((state, name), getattr(state, name)) for name in ("_auto_reshard_after_forward", "_reshard_after_forward")
             if hasattr(state, name)]
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [] if one is None else [one]
    return flags, [((group, "post_forward_mesh_info"), group.post_forward_mesh_info) for group in groups]
