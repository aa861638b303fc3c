"""The cold-start policy the research benchmarks measure: SmolLM2-135M-Instruct after ``arpo sft`` on scripted
teacher traces of a noisy procedural family (`arpo_env.datasets.procedural`, `arpo_env.faults`), made once and
reused.

The traces come from the laptop SFT recipe (`examples/recipes/smollm2_sft_cpu.yaml`): 40 teacher episodes of seed 1
whose Python really runs in the sandbox and whose faulty results the teacher notices and retries. Held-out tasks in
the benchmarks come from other seeds.

The default family is three-term arithmetic with 40 % of the results faulty, the main job's task. After this cold
start SmolLM2-135M answers about a third of those tasks, and rewards differ within most groups. A cold start on
noisy-chain traces (``noisy:2``: two operations, two to four calls) answered none of 32 held-out samples: a few
minutes of SFT on a CPU do not teach a 135M model to carry results from call to call. ``--family noisy:2`` measures
them anyway; `benchmarks/train_compare.py --preset h200` trains a model on them long enough, on a GPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SFT_RECIPE = ROOT / "examples/recipes/smollm2_sft_cpu.yaml"
FAMILY = "arithmetic:3:40"
"""Three terms, 40 % of the results faulty: one Python call an episode, more where the model runs a cell again."""


def cold_start(family: str = FAMILY, out: Path | None = None) -> Path:
    """The folder of the cold start on `family` traces, made by ``arpo sft`` the first time (about 5 minutes on 2
    cores)."""
    target = out or ROOT / "runs" / f"cold-start-{family.replace(':', '')}"
    if (target / "config.json").is_file():
        return target
    cmd = [sys.executable, "-m", "arpo_algo.cli", "sft", "--config", str(SFT_RECIPE), "--synthetic_family", family,
           "--output_dir", str(target)]
    print(f"=== cold start (once): arpo {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return target
