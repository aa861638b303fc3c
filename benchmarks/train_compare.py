"""ARPO vs GRPO (or any of the baselines) on the procedural arithmetic task, from the same start, seed and steps.

    python benchmarks/train_compare.py [--steps 6] [--algorithms arpo grpo] [--out runs/compare]

    python benchmarks/train_compare.py --reuse        # table and plot again from the runs in --out

Each algorithm is one ``arpo train`` run of `examples/recipes/smollm2_cpu.yaml` (the cold-start SFT checkpoint is
made first when missing) with only ``--algorithm`` changed. Per step: reward, accuracy, tool calls (total over the
step's trajectories), tokens generated and branches per question; saved as ``compare.csv``, ``compare.md`` and
``compare.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples/recipes/smollm2_cpu.yaml"


def run(algorithm: str, out: Path, steps: int, extra: list[str], reuse: bool = False) -> list[dict]:
    run_dir = out / algorithm
    metrics = run_dir / "metrics.jsonl"
    if reuse and metrics.exists():
        print(f"=== {algorithm}: reusing {metrics}")
        return [json.loads(line) for line in metrics.read_text().splitlines() if '"reward"' in line]
    if metrics.exists():
        metrics.unlink()  # a fresh comparison
    cmd = [sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(RECIPE), "--algorithm", algorithm,
           "--output_dir", str(run_dir), "--max_steps", str(steps), "--save_strategy", "no", *extra]
    print(f"\n=== {algorithm}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return [json.loads(line) for line in metrics.read_text().splitlines() if '"reward"' in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--algorithms", nargs="+", default=["arpo", "grpo"])
    parser.add_argument("--out", default=str(ROOT / "runs/compare"))
    parser.add_argument("--reuse", action="store_true", help="rebuild the table and plot from runs already in --out")
    parser.add_argument("extra", nargs="*", help="more arpo train flags, after --")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    per_traj = 8  # trajectories per step: the recipe's per_device_train_batch_size × gradient_accumulation_steps
    results = {a: run(a, out, args.steps, args.extra, args.reuse) for a in args.algorithms}

    rows = []
    for algorithm, logs in results.items():
        for h in logs:
            rows.append({"algorithm": algorithm, "step": h["step"], "reward": h["reward"],
                         "accuracy": h.get("arpo/accuracy"), "format_valid": h.get("arpo/format_valid"),
                         "tool_calls": h.get("arpo/tool_calls_per_trajectory", 0) * per_traj,
                         "branches_per_question": h.get("arpo/branches_per_question"),
                         "tokens_generated": h.get("arpo/tokens_generated")})
    with open(out / "compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| step | " + " | ".join(f"{a} reward | {a} accuracy | {a} tool calls | {a} tokens generated"
                                     for a in results) + " |",
             "|---|" + "---|---|---|---|" * len(results)]
    for step in range(1, args.steps + 1):
        cells = []
        for algorithm in results:
            r = next((r for r in rows if r["algorithm"] == algorithm and r["step"] == step), None)
            cells += ([f"{r['reward']:+.3f}", f"{r['accuracy']:.2f}", f"{r['tool_calls']:.0f}",
                       f"{r['tokens_generated']:.0f}"] if r else ["-"] * 4)
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    totals = {a: sum(r["tool_calls"] for r in rows if r["algorithm"] == a) for a in results}
    tokens = {a: sum(r["tokens_generated"] or 0 for r in rows if r["algorithm"] == a) for a in results}
    lines.append("\ntotal tool calls: " + ", ".join(f"{a} {t:.0f}" for a, t in totals.items()))
    lines.append("total tokens generated: " + ", ".join(f"{a} {t:.0f}" for a, t in tokens.items()))
    table = "\n".join(lines)
    (out / "compare.md").write_text(table + "\n")
    print("\n" + table)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, key, label in zip(axes, ("reward", "accuracy", "tool_calls", "tokens_generated"),
                              ("reward", "accuracy", "tool calls per step", "tokens generated per step")):
        for algorithm in results:
            pts = [(r["step"], r[key]) for r in rows if r["algorithm"] == algorithm and r[key] is not None]
            ax.plot(*zip(*pts), marker="o", label=algorithm)
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    print(f"\nsaved {out / 'compare.csv'}, {out / 'compare.md'}, {out / 'compare.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
