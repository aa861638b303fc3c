"""The research benchmarks' machinery on a tiny scale: the comparison runs end to end on a CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_comparison_dry_runs_with_a_tiny_model(tmp_path):
    """``benchmarks/train_compare.py --preset tiny``: teacher traces in the real sandbox, SFT from scratch of a model
    built from a config, a held-out evaluation, one real ARPOTrainer step per arm, partial results after every step
    and evaluation, the table, the plot and the last line."""
    out = tmp_path / "compare"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks/train_compare.py"), "--preset", "tiny", "--out",
                          str(out), "--resamples", "50"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"heldout accuracy grpo \S+ arpo \S+ arpo-beta0 \S+; ARPO-GRPO \S+ CI \S+ \S+ over 1 seeds",
                        last), last
    rows = [json.loads(line) for line in (out / "partial.jsonl").read_text().splitlines()]
    assert rows[0] == {**rows[0], "event": "traces"} and rows[0]["count"] >= 6  # a teacher out of calls is left out
    assert [r["event"] for r in rows if r["event"] == "sft"] and rows[-1]["event"] in ("step", "eval")
    for arm in ("grpo", "arpo", "arpo-beta0"):
        steps = [r for r in rows if r.get("arm") == arm and r["event"] == "step"]
        evals = [r for r in rows if r.get("arm") == arm and r["event"] == "eval"]
        assert [r["step"] for r in steps] == [1] and [r["step"] for r in evals] == [1]
        assert len(evals[0]["per_task"]) == 3 and all(0 <= a <= 1 for a in evals[0]["per_task"])
    assert (out / "cold-start" / "config.json").is_file()
    assert (out / "train_compare.png").stat().st_size > 1000
    assert "| arpo-beta0 |" in (out / "train_compare.md").read_text()
