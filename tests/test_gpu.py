"""The transformers paths on a GPU: skipped where CUDA is not available (this project's CI). These checks ran as a
script on an NVIDIA H200 lent to one session (README, "On a GPU"): a rollout generating on CUDA, two real ARPO
steps in TRL in bf16 (the default where the GPU has it) and in fp32, and where `arpo rollout` and `arpo eval` put
their model."""

from __future__ import annotations

import copy
import math

import gymnasium as gym
import pytest
import torch
from tiny_agent import TASK

import arpo_env  # noqa: F401

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("algo", ["arpo", "grpo"])
def test_a_rollout_generates_on_the_gpu(algo, undecided, tokenizer):
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout

    generator = HFGenerator(copy.deepcopy(undecided).to("cuda"), tokenizer)
    config = RolloutConfig(num_generations=4, num_global=2, alpha=1.0, beta=0.0, max_new_tokens=24,
                           max_completion_tokens=400, seed=0)
    engine = (ARPORollout if algo == "arpo" else GRPORollout)(
        generator, lambda: gym.make("ARPO-Math-v0").unwrapped, config)
    trees = engine.run([TASK, TASK])
    assert generator.device.type == "cuda"
    assert [len(tree.trajectories) for tree in trees] == [4, 4] and engine.tool_calls > 0


@pytest.mark.parametrize("bf16", [None, False])
def test_two_arpo_steps_train_on_the_gpu(bf16, undecided, tokenizer, tmp_path):
    from datasets import Dataset

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.trainer import ARPOTrainer

    model = copy.deepcopy(undecided)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kw = dict(output_dir=str(tmp_path / "run"), num_generations=4, num_global=2, branch_alpha=1.0, branch_beta=0.0,
              per_device_train_batch_size=4, max_steps=2, max_new_tokens_per_turn=24, max_completion_length=400,
              temperature=1.0, learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no",
              env_kwargs={"sandbox_options": {"timeout_s": 5}, "max_tool_calls": 4}, seed=0,
              gradient_accumulation_steps=1, advantage_attribution="hard")
    if bf16 is not None:
        kw["bf16"] = bf16
    args = ARPOConfig(**kw)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": TASK["question"]}], **TASK}] * 4)
    trainer = ARPOTrainer(model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert args.bf16 == (bf16 is None and torch.cuda.is_bf16_supported())
    assert next(model.parameters()).device.type == "cuda"
    assert any(not torch.equal(before[k].cpu(), v.cpu()) for k, v in model.state_dict().items())
    assert all(h["arpo/tool_calls_per_trajectory"] > 0 for h in logs)


def test_rollout_and_eval_generate_on_the_gpu(undecided, tokenizer, tmp_path):
    from arpo_algo.generation.factory import make_generator

    undecided.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert make_generator(str(tmp_path)).device.type == "cuda"
