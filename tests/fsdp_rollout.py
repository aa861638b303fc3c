"""Run by ``torchrun --nproc_per_node 2`` in `tests/test_distributed.py`: ARPO rollouts from a model sharded with
FSDP 2 (torch's ``fully_shard`` over gloo), as `ARPOTrainer` generates under accelerate's FSDP 2, each process
taking its own number of decoding steps (on the CPU's oneDNN-packed weights, and on the modules' own as on a GPU);
then a training step together.

Each process writes ``rank<R>.json`` into the folder given as its argument: its trees' token ids, those of the same
rollout from the model before sharding, and what the training step saw.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import gymnasium as gym
import torch
import torch.distributed as dist
from tiny_agent import TASK, tiny_llama
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

import arpo_env  # noqa: F401
from arpo_algo.core.config import RolloutConfig
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import load_tokenizer
from arpo_algo.rollout.scheduler import ARPORollout
from arpo_algo.training.distributed import _reshard_settings, fsdp2_unsharded


def make_env():
    return gym.make("ARPO-Math-v0", sandbox_options={"timeout_s": 5}, max_tool_calls=4).unwrapped


def roll_out(model, tokenizer, rank: int, packed_weights: bool | None = None) -> list[list[int]]:
    # the second process's turns are twice as long: its rollout takes more decoding steps
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=16 * (rank + 1),
                           max_completion_tokens=64, temperature=1.0, seed=rank)
    generator = HFGenerator(model, tokenizer, packed_weights=packed_weights)
    trees = ARPORollout(generator, make_env, config).run([TASK])
    return [list(t.completion_ids) for tree in trees for t in tree.trajectories]


def reshard_settings(model) -> list:
    """Each unit's settings `fsdp2_unsharded` changes for the rollout and puts back, as comparable values."""
    return [[repr(value) for _, value in flags + groups]
            for flags, groups in (_reshard_settings(m._get_fsdp_state()) for m in model.modules()
                                  if isinstance(m, FSDPModule))]


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokenizer = load_tokenizer("smollm2-135m")
    model = tiny_llama(tokenizer)  # seeded: the same weights on every process
    plain = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    before = reshard_settings(model)
    with torch.no_grad(), fsdp2_unsharded(model):
        sharded_ids = roll_out(model, tokenizer, rank)  # on oneDNN-packed weights, the CPU's default
    with torch.no_grad(), fsdp2_unsharded(model):
        unpacked_ids = roll_out(model, tokenizer, rank, packed_weights=False)  # the modules' own, as on a GPU
    with torch.no_grad():
        plain_ids = roll_out(plain, tokenizer, rank)

    model.train()
    ids = torch.tensor([tokenizer.encode("What is 12 * 34? <python>print(12 * 34)</python>")])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    weight = model.model.layers[0].self_attn.q_proj.weight
    report = {"settings_restored": reshard_settings(model) == before, "sharded": sharded_ids, "unpacked": unpacked_ids, "plain": plain_ids, "loss": loss.item(),
              "sharded_again": isinstance(weight, DTensor),
              "grad_finite": bool(torch.isfinite(weight.grad.full_tensor()).all())}
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
