"""ARPOTrainer: advantages on hand-built trees, masked tool tokens, real training steps, `arpo train` and resume."""

from __future__ import annotations

import collections
import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_agent import TASK, write_recipe

import arpo_env  # noqa: F401
from arpo_algo.core.advantages import grpo_advantages, hard_attribution, reinforce_pp_advantages, token_owners
from arpo_algo.core.config import RolloutConfig
from arpo_algo.core.tree import Node, RolloutTree, Trajectory, read_jsonl
from arpo_algo.training.config import ARPOConfig

ROOT = Path(__file__).resolve().parents[1]


def hand_tree(rewards=(1.0, 0.0, 0.0, 1.0)) -> RolloutTree:
    """Root 0 (8 tokens) and root 1 (6); node 2 branches from 0 at token 3 (7 tokens); node 3 from 2 at 5 (9)."""
    nodes = [Node(0, None, 0, "global"), Node(1, None, 0, "global"), Node(2, 0, 3, "branch", 1, 0.1, 0.52),
             Node(3, 2, 5, "branch", 2, 0.2, 0.54)]
    lengths = {0: 8, 1: 6, 2: 7, 3: 9}
    trajectories = [Trajectory(n, [1, 2], list(range(100, 100 + lengths[n])), [1] * lengths[n], [0.0] * lengths[n],
                               [None] * lengths[n], [], r, {"total": r}, 1)
                    for n, r in zip((0, 1, 2, 3), rewards)]
    return RolloutTree({"question": "q", "answer": "a"}, "arpo", nodes, trajectories)


def test_token_owners_follow_the_branch_points():
    tree = hand_tree()
    assert token_owners(tree, 0).tolist() == [0] * 8
    assert token_owners(tree, 2).tolist() == [0, 0, 0, 2, 2, 2, 2]
    assert token_owners(tree, 3).tolist() == [0, 0, 0, 2, 2, 3, 3, 3, 3]


def test_soft_attribution_is_grpo_over_the_m_sequences():
    adv = grpo_advantages(np.array([[1.0, 0.0, 0.0, 1.0]]), scale="group")[0]
    std = math.sqrt(4 * 0.25 / 3)  # sample standard deviation of (1, 0, 0, 1)
    assert adv == pytest.approx([0.5 / (std + 1e-4), -0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.5 / (std + 1e-4)])
    assert grpo_advantages(np.array([[1.0, 0.0, 0.0, 1.0]]), scale="none")[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    # a group whose rewards are all equal carries no signal
    assert grpo_advantages(np.array([[1.0, 1.0]]), scale="group")[0].tolist() == [0.0, 0.0]


def test_hard_attribution_gives_shared_tokens_the_mean_of_their_descendants_once():
    tree = hand_tree()
    adv = [0.5, -0.5, -0.5, 0.5]  # rewards (1, 0, 0, 1), centred
    token_adv, keep, scale = hard_attribution(tree, adv)
    assert all((c == 1).all() for c in scale)  # no row weights: every row's tokens weigh alike
    third = (0.5 - 0.5 + 0.5) / 3  # tokens 0-2 of node 0 are shared by trajectories 0, 2 and 3
    assert token_adv[0].tolist() == pytest.approx([third] * 3 + [0.5] * 5)
    assert token_adv[1].tolist() == pytest.approx([-0.5] * 6)
    assert token_adv[2].tolist() == pytest.approx([third] * 3 + [0.0] * 2 + [-0.5] * 2)  # 3-4: shared by 2 and 3
    assert token_adv[3].tolist() == pytest.approx([third] * 3 + [0.0] * 2 + [0.5] * 4)
    assert keep[0].tolist() == [1] * 8
    assert keep[1].tolist() == [1] * 6
    assert keep[2].tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert keep[3].tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    # each distinct token is counted once: 8 + 6 + (7 - 3) + (9 - 5) tokens in all
    assert sum(int(k.sum()) for k in keep) == 22


def test_reinforce_pp_normalises_over_the_batch():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, -1.0, 0.0])
    adv = reinforce_pp_advantages(rewards)
    assert adv == pytest.approx((rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4))
    assert adv.mean() == pytest.approx(0.0)


def test_a_trl_it_was_not_made_for_is_one_line_before_any_work():
    """pyproject took any TRL from 0.24 on; 1.15 failed at the first rollout, inside TRL, with a TypeError."""
    import re

    from arpo_algo.settings import ConfigError
    from arpo_algo.training.trainer import TRL_VERSIONS, check_trl

    for good in ("1.16.0", "1.16.3", "1.16.0.dev0"):
        check_trl(good)
    for bad in ("0.24.0", "1.15.0", "1.17.0", "2.0.0"):
        with pytest.raises(ConfigError, match=rf"^ARPOTrainer runs on TRL 1.16.x .*, not TRL {re.escape(bad)}: pip "):
            check_trl(bad)
    bound = re.search(r'"trl>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert bound and bound.groups() == TRL_VERSIONS  # the package's bound and the trainer's check agree


def test_one_switch_sets_each_baseline():
    common = dict(output_dir="/tmp/unused", num_generations=4, num_global=2, per_device_train_batch_size=4,
                  use_cpu=True, report_to="none")
    dapo = ARPOConfig(algorithm="dapo", **common)
    assert (dapo.loss_type, dapo.epsilon_high, dapo.dynamic_sampling, dapo.branching) == ("dapo", 0.28, True, False)
    rpp = ARPOConfig(algorithm="reinforce_pp", **common)
    assert rpp.advantage_estimator == "reinforce_pp" and not rpp.branching
    assert ARPOConfig(algorithm="arpo", **common).branching
    with pytest.raises(ValueError, match="num_global"):
        ARPOConfig(**{**common, "num_global": 8})
    for baseline in ("grpo", "dapo", "reinforce_pp"):  # N is ARPO's: its default (8) refused M=4 for them too
        assert not ARPOConfig(algorithm=baseline, **{**common, "num_global": 8}).branching
    with pytest.raises(ValueError, match="algorithm"):
        ARPOConfig(algorithm="ppo", **common)


# Real training ------------------------------------------------------------------------------------------------------
def config(tmp_path, **overrides) -> ARPOConfig:
    kw = dict(output_dir=str(tmp_path / "run"), num_generations=4, num_global=2, branch_alpha=1.0, branch_beta=0.0,
              per_device_train_batch_size=4, max_steps=2, max_new_tokens_per_turn=24, max_completion_length=400,
              temperature=1.0, learning_rate=1e-3, logging_steps=1, report_to="none", save_strategy="no",
              env_kwargs={"sandbox_options": {"timeout_s": 5}, "max_tool_calls": 4}, use_cpu=True, seed=0,
              gradient_checkpointing=False, gradient_accumulation_steps=1)
    kw.update(overrides)
    return ARPOConfig(**kw)


def dataset(n=4):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": TASK["question"]}], **TASK}] * n)


@pytest.mark.slow
def test_two_real_arpo_steps_train_the_model(undecided, tokenizer, tmp_path, monkeypatch):
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.training.trainer import ARPOTrainer

    closed = []  # each step's generator gives its packed weight copies back as the step's generation ends
    close = HFGenerator.close
    monkeypatch.setattr(HFGenerator, "close", lambda gen: (close(gen), closed.append(gen)))

    model = copy.deepcopy(undecided)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = ARPOTrainer(model, args=config(tmp_path, advantage_attribution="hard"), train_dataset=dataset(),
                          processing_class=tokenizer)
    batches = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        batches.append(out)
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), "weights did not change"
    assert len(closed) == 2 and all(gen._linears is None or not gen._linears._packed for gen in closed)
    trees = list(read_jsonl(tmp_path / "run" / "rollouts.jsonl"))
    assert len(trees) == 2 and all(len(t.trajectories) == 4 for t in trees)  # M trajectories per prompt
    assert sum(t.stats["tool_calls"] for t in trees) > 0
    assert all(h["arpo/tool_calls_per_trajectory"] > 0 for h in logs)
    assert all(h["arpo/scoring_errors"] == 0 for h in logs)  # every answer judged, none given up on
    assert any(h["reward_std"] > 0 for h in logs)  # mixed rewards: a real learning signal
    # the loss mask is 0 on every tool-output token, and hard attribution drops the duplicated shared prefix
    for out, tree in zip(batches, trees):
        assert out["advantages"].dim() == 2
        for row, traj in enumerate(tree.trajectories):
            tool = [i for s in traj.segments if s["kind"] == "tool" for i in range(s["start"], s["end"])]
            assert tool and all(out["tool_mask"][row, i] == 0 for i in tool)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2]


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "vespo"]


def loss_gradient(trainer, tree, advantages, mask_rows):
    """d loss / d advantage per token, through TRL's own `_compute_loss` at ratio 1 (the policy is the sampler),
    for the trajectories of `tree` as one batch. The model's log-probs are a constant: the loss is then linear in
    each token's advantage, and that derivative is the weight the loss type gives the token."""
    rows = tree.trajectories
    width = max(len(t.completion_ids) for t in rows)
    completion = torch.zeros(len(rows), width, dtype=torch.long)
    completion_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, t in enumerate(rows):
        completion[i, : len(t.completion_ids)] = torch.tensor(t.completion_ids)
        completion_mask[i, : len(t.completion_ids)] = 1
    tool_mask = torch.ones(len(rows), width, dtype=torch.long)
    for i, m in enumerate(mask_rows):
        tool_mask[i, : len(m)] = torch.tensor(m)
    advantages = advantages.clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (torch.full((len(rows), width), -1.0),
                                                                  torch.zeros(len(rows), width), None)
    trainer.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": torch.ones(len(rows), 2, dtype=torch.long),
              "prompt_mask": torch.ones(len(rows), 2, dtype=torch.long), "completion_ids": completion,
              "completion_mask": completion_mask, "tool_mask": tool_mask, "advantages": advantages,
              "num_items_in_batch": (completion_mask * tool_mask).sum()}
    trainer._compute_loss(trainer.model, inputs).backward()
    return advantages.grad


def reordered(tree: RolloutTree, order: list[int]) -> RolloutTree:
    """The same tree with its trajectories in another order: as if its descendants had finished in that order."""
    return RolloutTree(tree.task, tree.algo, tree.nodes, [tree.trajectories[i] for i in order], tree.stats)


def distinct_token_weights(tree: RolloutTree, gradient: torch.Tensor, values: list[np.ndarray]) -> dict:
    """What each distinct token (its node and position) contributes to the loss's gradient, over all its copies:
    the sum of (the copy's advantage × the loss's weight for it)."""
    from arpo_algo.core.advantages import token_owners

    found: dict = {}
    for i, t in enumerate(tree.trajectories):
        for pos, node in enumerate(token_owners(tree, i).tolist()):
            found[(node, pos)] = found.get((node, pos), 0.0) + float(values[i][pos]) * float(gradient[i, pos])
    return found


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.slow
def test_hard_attribution_gives_each_shared_token_its_descendants_weight_whatever_their_order(
        loss_type, undecided, tokenizer, tmp_path):
    """Every TRL loss type: under hard attribution a shared token is trained once (one copy carries its mean
    advantage, the others 0), and it weighs the mean of the weights its descendants' tokens have under the loss
    type, whichever descendant keeps it. Under grpo and sapo (a row's tokens weigh 1/its length) the keeper's own
    weight made a shared token weigh 1/8 or 1/9 of its row for the same tree, by which descendant came first. The
    control: de-duplicating through the mask inflates a branch's own tokens for those two."""
    from arpo_algo.core.advantages import hard_attribution, hard_token_advantages
    from arpo_algo.training.trainer import ARPOTrainer

    level = "sequence" if loss_type == "luspo" else "token"
    trainer = ARPOTrainer(undecided, args=config(tmp_path, loss_type=loss_type, advantage_attribution="hard",
                                                 importance_sampling_level=level),
                          train_dataset=dataset(), processing_class=tokenizer)
    contributions = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):  # trajectory 0 keeps the root's first tokens, then trajectory 3 does
        tree = reordered(hand_tree(), order)
        advantages = [[1.0, 2.0, 3.0, 4.0][i] for i in order]  # positive: sapo's and vespo's coefficients as soft's
        full_masks = [t.mask for t in tree.trajectories]
        width = max(len(t.completion_ids) for t in tree.trajectories)
        values = hard_token_advantages(tree, advantages, loss_type=loss_type)
        trainer._pending_trees, trainer._trained = [tree], values  # the trainer's own path to TRL's (B, T) tensor
        hard = trainer._advantage_tensor(width)
        _, keep, _ = hard_attribution(tree, advantages)
        soft_weight = loss_gradient(trainer, tree, torch.ones(4, width), full_masks)
        hard_weight = loss_gradient(trainer, tree, hard, full_masks)
        for i, t in enumerate(tree.trajectories):
            n = len(t.completion_ids)
            kept = torch.tensor(keep[i], dtype=torch.bool)
            assert torch.all(hard[i, :n][~kept] == 0)  # a copy carries nothing
            assert torch.all(hard[i, :n][kept] > 0)
        assert sum(int(k.sum()) for k in keep) == 22  # each distinct token once (8 + 6 + 4 + 4)
        contributions.append(distinct_token_weights(tree, hard_weight, values))
        # a shared token weighs the mean of its descendants' token weights: the root's first 3 tokens are shared by
        # the trajectories of nodes 0, 2 and 3
        rows = {t.node: i for i, t in enumerate(tree.trajectories)}
        mean_weight = float(np.mean([soft_weight[rows[n], 0] for n in (0, 2, 3)]))
        mean_advantage = (1.0 + 3.0 + 4.0) / 3
        assert contributions[-1][(0, 0)] == pytest.approx(mean_advantage * mean_weight, rel=1e-5)
        if loss_type in ("grpo", "sapo") and order[0] == 0:  # where node 3's trajectory keeps only its own tokens
            dedup = [[a * int(b) for a, b in zip(t.mask, k)] for t, k in zip(tree.trajectories, keep)]
            inflated = loss_gradient(trainer, tree, hard, dedup)
            own = torch.tensor(keep[rows[3]], dtype=torch.bool)  # node 3's trajectory owns 4 of its 9 tokens
            assert torch.allclose(inflated[rows[3], :9][own], soft_weight[rows[3], :9][own] * 9 / 4)
    first, second = contributions
    assert first.keys() == second.keys()
    for token in first:
        assert first[token] == pytest.approx(second[token], rel=1e-5), token  # the finishing order does not matter


def test_hard_attribution_keeps_a_shared_prefix_when_its_first_trajectory_is_truncated():
    from arpo_algo.core.advantages import hard_attribution

    tree = hand_tree()
    _, keep, _ = hard_attribution(tree, [0.0] * 4, eligible=[False, True, True, True])  # trajectory 0 truncated
    assert keep[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]  # its own tokens stay with it (masked by TRL anyway)
    assert keep[2].tolist() == [1, 1, 1, 1, 1, 1, 1]  # the prefix it shared goes to a descendant that trains
    assert sum(int(k.sum()) for k in keep) == 22


def test_the_runs_rollout_trees_are_hidden_from_the_sandbox(tmp_path):
    # rollouts.jsonl holds every task with its answer, and a task comes back each epoch: a cell that read it would
    # be rewarded for copying. The trainer's envs hide the output folder (besides what they hide themselves).
    from conftest import assert_hidden_from_the_sandbox

    from arpo_algo.training.trainer import ARPOTrainer

    args = config(tmp_path)
    os.makedirs(args.output_dir)
    trees = os.path.join(args.output_dir, "rollouts.jsonl")
    with open(trees, "w") as f:
        f.write(json.dumps({"task": TASK}) + "\n")
    kwargs = ARPOTrainer.env_kwargs(args)
    assert kwargs["sandbox_options"]["timeout_s"] == 5 and kwargs["max_tool_calls"] == 4  # the user's stay
    assert_hidden_from_the_sandbox(kwargs, trees, args.env_id)
    e2b = config(tmp_path, env_kwargs={"sandbox": "e2b", "sandbox_options": {"template": "x"}})
    assert ARPOTrainer.env_kwargs(e2b)["sandbox_options"] == {"template": "x"}  # E2B takes no such option
    other = config(tmp_path, env_id="CartPole-v1", env_kwargs={})
    assert ARPOTrainer.env_kwargs(other) == {}  # nor does an env that is not ours


def test_settings_the_rollout_cannot_honour_are_refused(tmp_path):
    common = dict(output_dir=str(tmp_path), num_generations=4, num_global=2, per_device_train_batch_size=4,
                  use_cpu=True, report_to="none")
    for bad, words in [({"top_k": 50}, "top_k"), ({"min_p": 0.1}, "min_p"), ({"repetition_penalty": 1.1},
                       "repetition_penalty"), ({"generation_kwargs": {"num_beams": 2}}, "generation_kwargs"),
                       ({"multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
                       ({"advantage_attribution": "hard", "beta": 0.04}, "KL"),
                       ({"advantage_attribution": "hard", "entropy_coef": 0.01}, "entropy bonus"),
                       ({"top_p": 1.5}, "top_p must be in"), ({"temperature": -0.7}, "temperature must be at least 0"),
                       ({"max_new_tokens_per_turn": 0}, "max_new_tokens_per_turn=0"),
                       ({"entropy_k": 0}, "entropy_k must be at least 1"), ({"branch_beta": float("nan")}, "branch_"),
                       ({"eval_temperature": -1.0}, "eval_temperature"), ({"tool_workers": 0}, "tool_workers"),
                       # what TrainingArguments and GRPOConfig accept: a step's rollouts, then a traceback, or nothing
                       ({"temperature": 0.0}, "above 0 for training"), ({"num_iterations": 0}, "num_iterations"),
                       ({"learning_rate": -1e-6}, "learning_rate"), ({"beta": -0.1}, "beta must"),
                       ({"epsilon": -0.2}, "clipping"), ({"weight_decay": -0.1}, "weight_decay"),
                       ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
                       ({"seed": -1}, "seed must be"), ({"seed": 2**32}, "seed must be"),
                       # a config written from Python: a TypeError that named nothing, or the env's error after the
                       # model had loaded
                       ({"branch_alpha": "0.5"}, "branch_alpha must be a number, not '0.5'"),
                       ({"entropy_k": 2.5}, "entropy_k must be a whole number, not 2.5"),
                       ({"max_tool_calls": -1}, "max_tool_calls must be a whole number of at least 0"),
                       ({"dynamic_sampling_rounds": -1}, "dynamic_sampling_rounds must be at least 0, not -1"),
                       # inf: every advantage NaN, then every weight of the model; NaN: the reward dropped unsaid
                       ({"reward_weights": [float("inf")]}, r"reward_weights must be finite numbers, one per reward "
                                                            r"function \(the env's first\), not \[inf\]"),
                       ({"reward_weights": [1.0, float("nan")]}, "reward_weights must be finite"),
                       ({"reward_weights": ["x"]}, "reward_weights must be finite"),
                       # the first step's rollout refused them, once the model had loaded ("no" was true)
                       ({"branch_factor": 2.5}, "branch_factor must be a whole number, not 2.5"),
                       ({"tool_workers": 1.5}, "tool_workers must be a whole number"),
                       ({"min_spare_samples": "1"}, "min_spare_samples must be a whole number"),
                       ({"speculative_branches": "no"}, "speculative_branches must be true or false"),
                       ({"speculative_min_keep": "0.5"}, "speculative_min_keep must be a number")]:
        with pytest.raises(ValueError, match=words):  # at the config, before a model is loaded
            ARPOConfig(**common, **bad)
    from arpo_algo.training.config import ColdStartConfig

    with pytest.raises(ValueError, match="learning_rate must be at least 0"):
        ColdStartConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=-2e-5)
    with pytest.raises(ValueError, match="seed must be"):  # arpo sft too: numpy's traceback once the model had loaded
        ColdStartConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", seed=-3)
    with pytest.raises(ValueError, match="max_grad_norm must be a number"):  # transformers clipped nothing, silently
        ARPOConfig(**common, max_grad_norm=float("nan"))
    with pytest.raises(ValueError, match="max_grad_norm must be a number"):
        ColdStartConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_grad_norm=float("nan"))
    assert ARPOConfig(**common, eval_temperature=0.0).eval_temperature == 0.0  # greedy evaluation stays
    # the help's "None disables it", as a command line writes it: it wrote the trees to a file named None
    assert [ARPOConfig(**common, rollout_log=v).rollout_log for v in ("None", "none", "", "trees.jsonl")] == [
        None, None, None, "trees.jsonl"]


def test_n_left_out_is_8_or_m_when_m_is_smaller(tmp_path):
    # N's default was 8 whatever M: `arpo train --num_generations 4` was an error until N was given too (arpo
    # rollout cut it to M), and so was RolloutConfig(num_generations=4).
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, use_cpu=True, report_to="none")
    assert ARPOConfig(**common, num_generations=4).num_global == 4
    assert ARPOConfig(**common, num_generations=16, gradient_accumulation_steps=4).num_global == 8
    assert RolloutConfig(num_generations=4).num_global == 4 and RolloutConfig().num_global == 8
    with pytest.raises(ValueError, match="num_global"):  # given, it is what it says
        ARPOConfig(**common, num_generations=4, num_global=6)
    with pytest.raises(ValueError, match="num_global"):
        RolloutConfig(num_generations=4, num_global=6)


def test_trls_gradient_checkpointing_is_taken_without_a_deprecation_warning(tmp_path):
    """TRL defaults and documents gradient_checkpointing; transformers 5.20+ renamed it and warned at every run (TRL's
    own default included). Both names work, without the warning, and mean the same."""
    import warnings

    from arpo_algo.training.config import ColdStartConfig

    common = dict(output_dir=str(tmp_path), num_generations=4, num_global=2, per_device_train_batch_size=4,
                  use_cpu=True, report_to="none")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        default, off = ARPOConfig(**common), ARPOConfig(**common, gradient_checkpointing=False)
        cold = ColdStartConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert not [w for w in caught if "checkpointing" in str(w.message)], [str(w.message) for w in caught]
    assert default.gradient_checkpointing is True and cold.gradient_checkpointing is True  # TRL's default stands
    assert off.gradient_checkpointing is False and getattr(off, "activation_checkpointing", False) is False
    for bad, words in [({"max_new_tokens": 0}, "max_new_tokens=0"), ({"top_p": 0.0}, "top_p"),
                       ({"temperature": float("inf")}, "temperature"), ({"max_tool_workers": 0}, "max_tool_workers"),
                       ({"seed": -1}, "seed must be at least 0")]:
        with pytest.raises(ValueError, match=words):  # the engine's own config says so in its own names
            RolloutConfig(**bad)
    assert ARPOConfig(**common, advantage_attribution="hard").beta == 0.0


@pytest.mark.slow
def test_default_config_and_trainer_are_valid(undecided, tokenizer, tmp_path, monkeypatch):
    from arpo_algo.training.trainer import ARPOTrainer

    args = ARPOConfig(str(tmp_path / "out"))
    assert args.num_generations == 16 and args.generation_batch_size % args.num_generations == 0
    monkeypatch.chdir(tmp_path)
    model = copy.deepcopy(undecided)
    tokenizer.save_pretrained(tmp_path / "tiny-llama")  # where TRL finds the processing class, offline
    model.config._name_or_path = str(tmp_path / "tiny-llama")
    trainer = ARPOTrainer(model)  # TRL's first line: no args, the env's own tasks
    assert trainer.args.output_dir.endswith("tiny-llama-ARPO") and trainer.args.num_generations == 16
    assert len(trainer.train_dataset) > 0 and "question" in trainer.train_dataset.column_names


def test_a_dataset_whose_rows_have_no_gold_is_refused_before_the_model_loads(tmp_path):
    """A train (or eval) dataset whose rows `row_task` cannot read failed at the first generation step, after the
    model had loaded; a row without a gold it could find (``ground_truth``, ``reward_model``…) trained on reward 0."""
    from datasets import Dataset

    from arpo_algo.training.trainer import ARPOTrainer

    nowhere = str(tmp_path / "no-model")  # never loaded: the rows are read first
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "2+2?"}], "target": "4"}])
    with pytest.raises(ValueError, match=r"ARPOTrainer: train_dataset's first row: a dataset row needs a gold answer "
                                         r"\(answer, .*; its fields: prompt, target$"):
        ARPOTrainer(nowhere, args=config(tmp_path), train_dataset=rows)
    good = Dataset.from_list([{"prompt": [{"role": "user", "content": "2+2?"}], "reward_model": {"ground_truth": "4"}}])
    with pytest.raises(ValueError, match=r"eval_dataset\['hard'\]'s first row: a dataset row needs a question"):
        ARPOTrainer(nowhere, args=config(tmp_path), train_dataset=good,
                    eval_dataset={"hard": Dataset.from_list([{"text": "2+2?", "answer": "4"}])})


@pytest.mark.slow
def test_tool_output_tokens_do_not_change_the_gradient(undecided, tokenizer, tmp_path):
    """The last segment of the completion is a tool result: altering its tokens changes nothing the loss sees.
    With the mask removed (the control) the same alteration does change the gradient."""
    from arpo_algo.training.trainer import ARPOTrainer

    trainer = ARPOTrainer(undecided, args=config(tmp_path, loss_type="dapo"), train_dataset=dataset(),
                          processing_class=tokenizer)
    model_part = tokenizer.encode("<python>print(41 + 1)</python>", add_special_tokens=False)
    tool_part = tokenizer.encode("\n<result>\n42\n</result>\n", add_special_tokens=False)
    prompt = tokenizer.encode("Add one to forty-one.", add_special_tokens=False)

    def grads(tool_ids, masked=True):
        completion = torch.tensor([model_part + tool_ids])
        tool_mask = torch.tensor([[1] * len(model_part) + [0 if masked else 1] * len(tool_ids)])
        inputs = {"prompt_ids": torch.tensor([prompt]), "prompt_mask": torch.ones(1, len(prompt), dtype=torch.long),
                  "completion_ids": completion, "completion_mask": torch.ones_like(completion),
                  "tool_mask": tool_mask, "advantages": torch.tensor([1.0]),
                  "num_items_in_batch": tool_mask.sum()}
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, inputs).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    altered = [(t * 7919 + 13) % len(tokenizer) for t in tool_part]
    assert torch.equal(grads(tool_part), grads(altered))
    assert not torch.allclose(grads(tool_part, masked=False), grads(altered, masked=False))


# The command line, killed and resumed -------------------------------------------------------------------------------
@pytest.mark.slow
def test_arpo_train_killed_midway_resumes_from_its_checkpoint(undecided, tokenizer, tmp_path):
    recipe, _ = write_recipe(tmp_path, undecided, tokenizer)
    cmd = [sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(recipe)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    run = tmp_path / "run"
    deadline = time.monotonic() + 600
    while not (run / "checkpoint-1" / "trainer_state.json").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "training ended before its first checkpoint"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # a hard kill, as by the OOM killer or a lost node
    proc.wait()
    done = json.loads((run / "checkpoint-1" / "trainer_state.json").read_text())["global_step"]
    assert done >= 1 and not (run / "checkpoint-3").exists()
    logged = (run / "rollouts.jsonl").read_text()

    result = subprocess.run([*cmd, "--resume_from_checkpoint", "last"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from" in result.stderr
    # transformers 5.20+ renamed gradient checkpointing and warned at every run, of TRL's default and TRL's own calls
    assert "checkpointing` is deprecated" not in result.stderr, result.stderr[-3000:]
    final = json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())
    assert final["global_step"] == 3
    after = (run / "rollouts.jsonl").read_text()
    kept = [line for line in logged.splitlines() if json.loads(line)["stats"]["step"] <= done]
    assert after.startswith("\n".join(kept)) and len(after) > len(logged)  # appended; the steps after done set aside
    steps = [json.loads(line)["stats"]["step"] for line in after.splitlines()]
    assert steps[-1] == 3 and len(set(collections.Counter(steps).values())) == 1  # each step's trees once
    assert "ARPO finished 3 steps" in result.stdout

    # The run directory is what `arpo view` reads: trees, training curves from metrics.jsonl (steps deduplicated).
    view = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "view", str(run), "--out", str(tmp_path / "r.html")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert view.returncode == 0, view.stderr[-3000:]
    assert (tmp_path / "r.training.png").exists() and (tmp_path / "r.entropy.png").exists()
    from arpo_algo.cli.viewer import read_metrics

    assert [m["step"] for m in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_a_run_that_starts_over_moves_the_earlier_runs_logs_aside(undecided, tokenizer, tmp_path):
    """A second run into the same output_dir without resume_from_checkpoint appended to the first's metrics.jsonl and
    rollouts.jsonl: `arpo view` drew its steps over the first run's and mixed their trees. The earlier logs are moved
    to earlier-runs/TIME/ (kept, and viewable); a resumed run goes on appending."""
    from arpo_algo.cli.viewer import find_source
    from arpo_algo.training.trainer import ARPOTrainer

    run = tmp_path / "run"

    def train():
        ARPOTrainer(copy.deepcopy(undecided), args=config(tmp_path, max_steps=1), train_dataset=dataset(),
                    processing_class=tokenizer).train()

    train()
    first = {name: (run / name).read_text() for name in ("metrics.jsonl", "rollouts.jsonl")}
    train()
    (earlier,) = (run / "earlier-runs").iterdir()
    assert {name: (earlier / name).read_text() for name in first} == first
    assert len((run / "rollouts.jsonl").read_text().splitlines()) == len(first["rollouts.jsonl"].splitlines())
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [
        json.loads(line)["step"] for line in first["metrics.jsonl"].splitlines()]
    assert [p.name for p in find_source(str(run)).rollout_files] == ["rollouts.jsonl"]  # the new run's alone
    assert find_source(str(earlier)).metrics_file == earlier / "metrics.jsonl"


@pytest.mark.slow
def test_a_resumed_run_sets_aside_the_logs_of_the_steps_it_trains_again(undecided, tokenizer, tmp_path):
    """A run resumed from checkpoint-1 trains step 2 again, which the earlier run had logged: its metrics and trees
    were in metrics.jsonl and rollouts.jsonl twice (`arpo view` showed both copies of the step's trees). The lines of
    the steps after the checkpoint, and a line a kill cut short, move to earlier-runs/TIME/: each step is logged once."""
    from arpo_algo.training.trainer import ARPOTrainer

    run = tmp_path / "run"

    def train(resume=None):
        ARPOTrainer(copy.deepcopy(undecided), args=config(tmp_path, max_steps=2, save_strategy="steps", save_steps=1),
                    train_dataset=dataset(), processing_class=tokenizer).train(resume_from_checkpoint=resume)

    def steps(text, tree=False):
        return [(entry["stats"] if tree else entry)["step"] for entry in map(json.loads, text.splitlines())]

    train()
    first = {name: (run / name).read_text() for name in ("metrics.jsonl", "rollouts.jsonl")}
    with open(run / "rollouts.jsonl", "a") as f:
        f.write('{"task": {"question": "cut sho')  # the kill's last line
    train(str(run / "checkpoint-1"))
    (earlier,) = (run / "earlier-runs").iterdir()
    trees = steps(first["rollouts.jsonl"], tree=True)
    assert steps((run / "rollouts.jsonl").read_text(), tree=True) == trees  # step 1's once, then the new step 2's
    moved = (earlier / "rollouts.jsonl").read_text().splitlines()
    assert moved[:-1] == [line for line, step in zip(first["rollouts.jsonl"].splitlines(), trees) if step == 2]
    assert moved[-1] == '{"task": {"question": "cut sho'
    logged = steps((run / "metrics.jsonl").read_text())
    assert sorted(logged) == sorted(steps(first["metrics.jsonl"]))  # 1 and 2, and the end-of-training summary's 2
    assert all(s == 2 for s in steps((earlier / "metrics.jsonl").read_text()))
    from arpo_algo.settings import ConfigError

    # From the checkpoint at max_steps, transformers trained a step more (its check follows each step): refused
    with pytest.raises(ConfigError, match="the checkpoint is at step 2 and max_steps is 2: that run is finished"):
        train(True)  # True: the last checkpoint, as transformers takes it
    assert len(list((run / "earlier-runs").iterdir())) == 1 and not (run / "checkpoint-3").exists()
    from arpo_algo.training.trainer import checkpoint_step

    assert checkpoint_step(str(run), True) == 2
    assert checkpoint_step(str(tmp_path / "nowhere"), True) is None  # transformers says why (it was our traceback)


def test_resuming_from_last_skips_a_checkpoint_the_kill_cut_short(tmp_path, capsys):
    """Killed while saving checkpoint-N, a run leaves it without its trainer_state.json (written last) or its
    weights; `--resume_from_checkpoint last` took it and died on it (or restarted at step 0 on its weights). It now
    takes the newest complete one and says which it skipped."""
    from arpo_algo.training.train import resolve_resume

    def checkpoint(step, state="{}", weights=True):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
        if weights:
            (folder / "model.safetensors").write_bytes(b"weights")
        return folder

    complete = checkpoint(3)
    checkpoint(6, state=None)  # killed after the weights
    checkpoint(9, state='{"global_st')  # killed while writing the state
    checkpoint(12, weights=False)  # (a state with no weights beside it)
    assert resolve_resume("last", str(tmp_path)) == str(complete)
    skipped = capsys.readouterr().err
    assert all(f"checkpoint-{n} is incomplete" in skipped for n in (6, 9, 12))
    # Without the flag the run starts over, and says so: a stopped run started again lost its steps without a word.
    from arpo_algo.training.train import note_starting_over

    assert resolve_resume(None, str(tmp_path)) is None
    note_starting_over(None, str(tmp_path))
    assert capsys.readouterr().err == (f"arpo train: {tmp_path} holds checkpoint-3 of an earlier run; this run "
                                       "starts over from step 0 (--resume_from_checkpoint last goes on from it)\n")
    note_starting_over(None, str(tmp_path / "new"))
    note_starting_over(str(complete), str(tmp_path))  # resuming: nothing to say
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit, match="checkpoint-6 is incomplete"):
        resolve_resume(str(tmp_path / "checkpoint-6"), str(tmp_path))
    assert resolve_resume(str(complete), str(tmp_path)) == str(complete)
    assert resolve_resume("last", str(tmp_path / "nowhere")) is None


@pytest.mark.slow
def test_a_cold_start_that_was_stopped_runs_again(undecided, tokenizer, tmp_path):
    """The README's recipe writes its cold-start model to a folder that exists from the SFT's first moment. Stopped
    there (Ctrl-C), the next `arpo train` took the empty folder for the model and died loading it, until the folder was
    deleted by hand. Now a folder without a finished model runs the cold start again (from its last checkpoint when
    it saved one); a finished one is used as it is."""
    recipe, run = write_recipe(tmp_path, undecided, tokenizer, max_steps=1, save_strategy="'no'")
    sft_model = tmp_path / "sft"
    sft_recipe = tmp_path / "sft.yaml"
    sft_recipe.write_text(f"model_name_or_path: {tmp_path / 'tiny'}\noutput_dir: {sft_model}\nsynthetic_tasks: 2\n"
                          "max_steps: 1\nper_device_train_batch_size: 1\nsave_strategy: 'no'\nreport_to: none\n"
                          "use_cpu: true\ngradient_checkpointing: false\n")
    sft_model.mkdir()  # what a cold start stopped before its end leaves
    cmd = [sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(recipe), "--model_name_or_path",
           str(sft_model), "--cold_start", str(sft_recipe)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"{sft_model} holds no finished model" in first.stderr and (sft_model / "config.json").is_file()
    second = subprocess.run([*cmd, "--output_dir", str(tmp_path / "run2")], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0 and "cold-start" not in second.stderr, second.stderr[-3000:]
    # and it says so (a recipe edited since was not run again, and nothing said that either)
    assert f"arpo train: starting from {sft_model}, made by the cold start {sft_recipe} (delete it to run that " \
        "again)" in second.stderr
    from arpo_algo.training.train import reused_cold_start

    sft_recipe.write_text(sft_recipe.read_text().replace("synthetic_tasks: 2", "synthetic_tasks: 200"))
    assert reused_cold_start(str(sft_model), str(sft_recipe)) == (
        f"arpo train: starting from {sft_model}, which the cold start made from an earlier version of {sft_recipe}: "
        f"delete {sft_model} to run the cold start again on the recipe as it is now")
    assert reused_cold_start(str(tmp_path / "tiny"), str(sft_recipe)) == (
        f"arpo train: starting from {tmp_path / 'tiny'}, which exists: the cold start {sft_recipe} is not run")


@pytest.mark.slow
def test_a_second_train_into_the_same_folder_at_once_is_refused_and_one_of_the_same_cold_start_waits(
        undecided, tokenizer, tmp_path):
    """The README's command run twice at once: the second saved its checkpoints over the first's, appended to its
    logs and moved them aside as an earlier run's; and two runs of one recipe into other folders each ran the cold
    start into the same model folder. Now the second is refused, and a run that needs the cold start under way waits
    for it and starts from the model it made."""
    import stopped_run

    recipe, run = write_recipe(tmp_path, undecided, tokenizer, max_steps=1, save_strategy="'no'")
    sft_model, sft_recipe = tmp_path / "sft", tmp_path / "sft.yaml"
    sft_recipe.write_text(f"model_name_or_path: {tmp_path / 'tiny'}\noutput_dir: {sft_model}\nsynthetic_tasks: 2\n"
                          "max_steps: 1\nper_device_train_batch_size: 1\nsave_strategy: 'no'\nreport_to: none\n"
                          "use_cpu: true\ngradient_checkpointing: false\n")
    cmd = [sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(recipe), "--model_name_or_path",
           str(sft_model), "--cold_start", str(sft_recipe)]
    first = stopped_run.stopped(cmd, "running the cold-start SFT recipe")  # holds run and sft
    try:
        second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        sft = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "sft", "--config", str(sft_recipe)], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)  # and an `arpo sft` into the cold start's
        third = stopped_run.start([*cmd, "--output_dir", str(tmp_path / "run2")], "waiting for it")
    finally:
        _, first_err = stopped_run.resume_and_wait(first)
    _, third_err = third.communicate(timeout=600)
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
    assert f"arpo train: another run is writing to {run} now: wait for it to end" in second.stderr
    assert sft.returncode == 2 and f"arpo sft: another run is writing to {sft_model} now" in sft.stderr, sft.stderr
    assert first.returncode == 0 and third.returncode == 0, (first_err[-3000:], third_err[-3000:])
    assert "running the cold-start" not in third_err and f"starting from {sft_model}, made by the cold start" in third_err
    assert (run / "metrics.jsonl").is_file() and not (run / "earlier-runs").exists()


@pytest.mark.slow
def test_a_folder_held_by_the_run_is_not_waited_for_again_by_it(tmp_path, monkeypatch):
    """A cold start into the run's own output_dir (model_name_or_path and output_dir the same folder) waited for the
    lock its own run held: for ever. Held once per process, and for the cold start's child."""
    from arpo_algo.training.train import HELD_ENV, held_output_dir

    monkeypatch.delenv(HELD_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    run = tmp_path / "run"
    with held_output_dir(str(run)):
        with held_output_dir(str(run)):  # (without the check, ConfigError here; with a wait, as a cold start: a hang)
            assert os.environ[HELD_ENV] == str(run)
        child = subprocess.run([sys.executable, "-c", f"from arpo_algo.training.train import held_output_dir\n"
                                f"with held_output_dir({str(run)!r}): pass"], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
        assert child.returncode == 0, child.stderr  # a cold start's arpo sft: told by the environment
        assert os.environ[HELD_ENV] == str(run)
    assert HELD_ENV not in os.environ


def test_the_cold_start_is_found_beside_the_recipe_and_skipped_for_the_embedded_model(tmp_path, monkeypatch):
    """Run from another folder, the shipped recipe's ``cold_start: examples/recipes/smollm2_sft_cpu.yaml`` was "not
    found"; with ``--model_name_or_path smollm2-135m`` the cold start ran anyway, into a folder ./smollm2-135m that
    nothing then loaded (the embedded model was trained from, the SFT's minutes lost)."""
    from arpo_algo.training.train import beside_recipe, holds_model, recipe_path

    monkeypatch.chdir(tmp_path)
    recipe = str(ROOT / "examples" / "recipes" / "smollm2_cpu.yaml")
    sft = str(ROOT / "examples" / "recipes" / "smollm2_sft_cpu.yaml")
    for given in (recipe, os.path.relpath(recipe)):
        assert recipe_path(["--max_steps", "1", "--config", given]) == given
        assert beside_recipe("examples/recipes/smollm2_sft_cpu.yaml", given) == sft
        assert beside_recipe("smollm2_sft_cpu.yaml", given) == sft
    (tmp_path / "mine.yaml").write_text("max_steps: 1\n")  # the current folder's comes first
    assert beside_recipe("mine.yaml", recipe) == "mine.yaml"
    assert beside_recipe("missing.yaml", recipe) == "missing.yaml"  # run_cold_start says not found
    assert beside_recipe(None, recipe) is None and recipe_path(["--config"]) is None
    assert holds_model("smollm2-135m") and not holds_model("runs/smollm2-sft") and not holds_model(str(tmp_path))


@pytest.mark.parametrize("algorithm", ["dapo", "reinforce_pp"])
@pytest.mark.slow
def test_baselines_run_through_the_same_trainer(algorithm, undecided, tokenizer, tmp_path):
    from arpo_algo.training.trainer import ARPOTrainer

    trainer = ARPOTrainer(copy.deepcopy(undecided), args=config(tmp_path, algorithm=algorithm, max_steps=1,
                                                                dynamic_sampling_rounds=1),
                          train_dataset=dataset(), processing_class=tokenizer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(log["loss"]) and log["arpo/branches_per_question"] == 0  # independent rollouts
    if algorithm == "dapo":
        assert "dapo/groups_replaced" in log and trainer.loss_type == "dapo" and trainer.epsilon_high == 0.28
    (tree,) = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert tree.stats["algorithm"] == algorithm and len(tree.trajectories) == 4


@pytest.mark.slow
def test_dapo_redraws_in_the_steps_one_generation(undecided, tokenizer, tmp_path, monkeypatch):
    """DAPO's redraws of uniform groups run in the step's one generation. Each redraw entered a generation of its
    own: under ZeRO-3 and FSDP 2 entering one gathers the parameters from every process, and a process redraws as
    often as its own groups need, so one that redrew more than another waited in a gather the others never made."""
    from arpo_algo.training import distributed
    from arpo_algo.training.trainer import ARPOTrainer

    entered = []
    enter = distributed.HFGeneration.__enter__
    monkeypatch.setattr(distributed.HFGeneration, "__enter__", lambda gen: (entered.append(gen), enter(gen))[1])
    wrong = {**TASK, "answer": "7"}  # the agent answers 42 or 43: every group's rewards are equal, and redrawn
    from datasets import Dataset

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": wrong["question"]}], **wrong}] * 4)
    trainer = ARPOTrainer(copy.deepcopy(undecided), args=config(tmp_path, algorithm="dapo", max_steps=1,
                                                                dynamic_sampling_rounds=2),
                          train_dataset=rows, processing_class=tokenizer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert log["dapo/groups_uniform"] == 1 and log["dapo/groups_replaced"] == 0  # two redraws, each uniform again
    assert len(entered) == 1


@pytest.mark.slow
def test_an_extra_reward_function_that_gives_infinity_stops_the_step_by_name(undecided, tokenizer, tmp_path):
    """An extra reward of ±inf (a log of 0 in the user's function) is a ValueError naming the function; its group's
    advantages were NaN, and after the optimizer's step every weight of the model was NaN, silently. None (NaN) is
    TRL's "does not apply" and is left to it."""
    from arpo_algo.training.trainer import ARPOTrainer

    def surprisal(completions, **kwargs):
        return [float("-inf")] + [None] * (len(completions) - 1)

    model = copy.deepcopy(undecided)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = ARPOTrainer(model, reward_funcs=[surprisal], args=config(tmp_path, max_steps=1),
                          train_dataset=dataset(), processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"reward function 'surprisal' gave -inf \(completion 0 of the step's batch\)"):
        trainer.train()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_arpo_train_evaluates_held_out_tasks(undecided, tokenizer, tmp_path):
    """--eval_dataset_name: TRL's evaluation rolls out the held-out tasks (before the first step with
    eval_on_start, then every eval_steps); metrics.jsonl records each with its step and time."""
    recipe, run = write_recipe(tmp_path, undecided, tokenizer, max_steps=1, save_strategy="'no'")
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(recipe),
                             "--eval_dataset_name", str(tmp_path / "tasks.jsonl"), "--eval_limit", "2",
                             "--eval_strategy", "steps", "--eval_steps", "1", "--eval_on_start", "true",
                             "--num_generations_eval", "4", "--per_device_eval_batch_size", "4"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [h for h in logs if "eval_reward" in h]
    assert [h["step"] for h in evals] == [0, 1]
    assert all(0.0 <= h["eval_arpo/accuracy"] <= 1.0 and h["eval_arpo/tool_calls_per_trajectory"] > 0
               for h in evals)
    assert all(isinstance(h["time"], float) for h in logs)
    assert sorted(h["time"] for h in logs) == [h["time"] for h in logs]


@pytest.mark.slow
def test_held_out_rollouts_sample_at_the_eval_temperature(undecided, tokenizer, tmp_path):
    """eval_temperature=0: TRL's evaluation rolls out greedily (one answer per question) while training still
    samples at the training temperature; unset, evaluation samples like training (42 or 43)."""
    from arpo_algo.training.trainer import ARPOTrainer

    trainer = ARPOTrainer(copy.deepcopy(undecided), args=config(tmp_path, eval_temperature=0.0),
                          train_dataset=dataset(), processing_class=tokenizer)
    rows = list(dataset(8))

    def distinct(mode):
        with trainer._generator() as generator:
            (tree,) = trainer._roll_out(rows, 8, mode, generator)
        return len({tuple(t.completion_ids) for t in tree.trajectories}), {t.reward for t in tree.trajectories}

    assert distinct("eval")[0] == 1
    trainer.args.eval_temperature = None
    assert distinct("eval")[1] == {0.0, 1.0}
    trainer.args.eval_temperature = 0.0
    assert distinct("train")[1] == {0.0, 1.0}  # training keeps its temperature


def test_generation_with_checkpointing_on_warns_nothing_the_user_cannot_answer(tokenizer):
    """With gradient checkpointing on (TRL's default), TRL turns it off and on around every generation by names
    transformers 5.20+ deprecates: two FutureWarnings in every run that no setting of the user's could answer."""
    import warnings

    from accelerate import Accelerator
    from tiny_agent import tiny_llama
    from trl.models.utils import unwrap_model_for_generation

    from arpo_algo.training.trainer import quiet_trl_deprecations

    model = tiny_llama(tokenizer)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        quiet_trl_deprecations()  # what importing the module and making an ARPOTrainer do
        with unwrap_model_for_generation(model, Accelerator(cpu=True)) as unwrapped:
            assert unwrapped is model
