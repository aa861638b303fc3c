"""Training on two processes: ``accelerate launch --multi_gpu --num_processes 2`` on the CPU (gloo), the real
`arpo train`.

Each process rolls out its own trees (a tree never spans processes); TRL gathers the rewards of every process and
our advantages are taken over each tree's own group; the main process writes every process's trees and the
gathered metrics; a checkpoint written by two processes resumes on two processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_agent import write_recipe

from arpo_algo.core.advantages import grpo_advantages
from arpo_algo.core.tree import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def run_group(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run` of a launcher and every process it starts: on a timeout the whole group is killed (killing
    the launcher alone left its workers waiting on each other after the test had failed)."""
    process = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def launch(recipe: Path, *flags: str, cwd: Path) -> subprocess.CompletedProcess:
    # accelerate's --cpu launcher starts several CPU processes only through mpirun; its torchrun launcher
    # (--multi_gpu) starts them anywhere, and with use_cpu each one trains on the CPU over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "-m", "arpo_algo.cli", "train", "--config", str(recipe), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return run_group(cmd, cwd, env, timeout=900)


@pytest.mark.slow
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


@pytest.mark.slow
def test_fsdp2_rollouts_of_unequal_length_then_a_step_together(tmp_path):
    """ARPO's rollouts from a model sharded by FSDP 2 on two gloo processes, the second taking more decoding steps
    than the first (`tests/fsdp_rollout.py`). Each FSDP 2 unit gathered its parameters at every forward, so the
    first process to finish matched the other's gather with its training step's ("Is there a distributed collective
    mismatch in your code?") and both failed; on the CPU's packed weights the first step failed already (the
    weights were shards). Under `fsdp2_unsharded` each process draws the very tokens the model draws unsharded, and
    the training step after it runs together, on the sharded parameters again."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--standalone",
           str(ROOT / "tests" / "fsdp_rollout.py"), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "tests")}
    done = run_group(cmd, tmp_path, env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    lengths = [max(len(ids) for ids in report["plain"]) for report in reports]
    assert lengths[1] > lengths[0], lengths  # the second process decoded for longer
    for report in reports:
        assert report["sharded"] == report["unpacked"] == report["plain"]
        assert report["sharded_again"] and report["grad_finite"]
        assert report["settings_restored"]  # each unit reshards after its forwards again, as it did
    assert reports[0]["loss"] == pytest.approx(reports[1]["loss"])  # one model, on both processes


@pytest.mark.parametrize("setting, problem", [
    (dict(zero3=True, gather=False), "ds3_gather_for_generation"),
    (dict(fsdp=1), "FSDP 2"),
    (dict(zero3=True, gather=True), None),
    (dict(fsdp=2), None),
    (dict(fsdp=1, vllm=True), None),
    (dict(fsdp=1, processes=1), None),
])
def test_settings_whose_forwards_are_collectives_are_refused(setting, problem):
    """Where every forward is a collective (ZeRO-3 without gathering for generation, FSDP 1), processes that decode
    for different numbers of steps wait on each other for ever: refused before training, with what to set."""
    from types import SimpleNamespace

    from arpo_algo.training.distributed import lockstep_problem

    dist = SimpleNamespace(is_zero3=setting.get("zero3", False), fsdp_version=setting.get("fsdp"))
    got = lockstep_problem(dist, setting.get("gather", True), setting.get("vllm", False), setting.get("processes", 2))
    assert (got is None) if problem is None else (problem in got)


FSDP_ON_CPU = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: SHARDED_STATE_DICT
mixed_precision: 'no'
num_machines: 1
num_processes: 2
"""


@pytest.mark.slow
def test_fsdp_config_without_a_gpu_is_refused_or_said(undecided, tokenizer, tmp_path):
    """accelerate runs FSDP on GPUs only. On a machine without one, `accelerate launch --config_file` an FSDP config
    started two processes that never joined: each trained alone, both "finished", their checkpoints saved over each
    other's and their logs appended to the same files. That is refused before the model loads; with use_cpu they join
    over gloo, as plain data parallelism, and a warning says so, once."""
    config = tmp_path / "fsdp.yaml"
    config.write_text(FSDP_ON_CPU)
    recipe, run = write_recipe(tmp_path, undecided, tokenizer, tasks=8, max_steps=1, save_steps=1,
                               max_completion_length=300, use_cpu="false")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
           "-m", "arpo_algo.cli", "train", "--config", str(recipe)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    refused = run_group(cmd, tmp_path, env, timeout=600)
    assert refused.returncode != 0
    assert "2 processes were launched, but accelerate did not join them" in refused.stderr
    assert "use_cpu: true" in refused.stderr
    assert not run.exists()

    joined = run_group(cmd + ["--use_cpu", "true"], tmp_path, env, timeout=600)
    assert joined.returncode == 0, joined.stderr[-4000:]
    assert joined.stderr.count("FSDP was asked for, but accelerate runs FSDP on GPUs only") == 1
    assert sorted(t.stats["rank"] for t in read_jsonl(run / "rollouts.jsonl")) == [0, 1]  # one launch, two ranks
