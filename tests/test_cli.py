"""The arpo command line as a user runs it (a subprocess), on a tiny model saved to disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from tiny_agent import tiny_llama

    from arpo_algo.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_arpo_rollout_writes_trees(tiny_model_dir, tmp_path):
    out = tmp_path / "trees.jsonl"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "rollout", "--model", str(tiny_model_dir), "--env", "ARPO-Math-v0",
           "--dataset", "arithmetic:10:3", "--tasks", "2", "--algo", "arpo", "-M", "3", "-N", "2",
           "--max-new-tokens", "8", "--max-completion-tokens", "64", "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and all(len(json.loads(line)["trajectories"]) == 3 for line in lines)
    assert "2 tasks, 6 trajectories" in result.stdout and "arpo rollouts" in result.stderr


def test_unknown_env_is_a_clear_error():
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "rollout", "--env", "ARPO-Nope-v0"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode != 0 and "ARPO-Nope" in result.stderr
