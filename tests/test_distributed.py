"""Training on two processes: ``accelerate launch --multi_gpu --num_processes 2`` on the CPU (gloo), the real
`arpo train`.

Each process rolls out its own trees (a tree never spans processes); TRL gathers the rewards of every process and
our advantages are taken over each tree's own group; the main process writes every process's trees and the
gathered metrics; a checkpoint written by two processes resumes on two processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_agent import write_recipe

from arpo_algo.advantages import grpo_advantages
from arpo_algo.tree import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def launch(recipe: Path, *flags: str, cwd: Path) -> subprocess.CompletedProcess:
    # accelerate's --cpu launcher starts several CPU processes only through mpirun; its torchrun launcher
    # (--multi_gpu) starts them anywhere, and with use_cpu each one trains on the CPU over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "arpo_algo.cli", "train", "--config", str(recipe), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def test_two_processes_train_log_every_rank_and_resume(undecided, tokenizer, tmp_path):
    recipe, run = write_recipe(tmp_path, undecided, tokenizer, tasks=16, max_steps=2, save_steps=2,
                               max_completion_length=300)
    first = launch(recipe, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    trees = list(read_jsonl(run / "rollouts.jsonl"))
    # one tree per process per step, both processes' trees in the one log
    assert len(trees) == 4, [t.stats for t in trees]
    assert sorted((t.stats["step"], t.stats["rank"]) for t in trees) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for tree in trees:
        assert len(tree.trajectories) == 4  # M trajectories, all on the process that rolled the tree out
        rewards = np.array([t.reward for t in tree.trajectories])
        expected = grpo_advantages(rewards.reshape(1, -1), scale="group").reshape(-1)
        got = np.array([t.reward_parts["advantage"] for t in tree.trajectories])
        np.testing.assert_allclose(got, expected, atol=1e-5)  # advantages over this tree's own group
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m, step in zip(steps, (1, 2)):
        # metrics are over both processes: the step's accuracy is the mean over its 8 trajectories
        rolled = [t for t in trees if t.stats["step"] == step]
        accuracy = np.mean([bool(t.reward_parts.get("correct")) for tree in rolled for t in tree.trajectories])
        assert m["arpo/accuracy"] == pytest.approx(accuracy, abs=1e-6)
        tool_calls = np.mean([t.tool_calls for tree in rolled for t in tree.trajectories])
        assert m["arpo/tool_calls_per_trajectory"] == pytest.approx(tool_calls, abs=1e-6)
    assert (run / "checkpoint-2" / "trainer_state.json").exists()

    second = launch(recipe, "--max_steps", "3", "--save_steps", "3", "--resume_from_checkpoint", "last",
                    cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resuming from" in second.stderr
    assert json.loads((run / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    trees = list(read_jsonl(run / "rollouts.jsonl"))
    assert sorted((t.stats["step"], t.stats["rank"]) for t in trees)[-2:] == [(3, 0), (3, 1)]
