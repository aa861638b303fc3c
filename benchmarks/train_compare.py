"""The experiment: ARPO vs GRPO (and DAPO) from one cold start, at the same trajectories per step, over seeds.

    python benchmarks/train_compare.py            # ARPO and GRPO x 3 seeds x 4 steps: about 25 minutes on 2 cores
    python benchmarks/train_compare.py --algorithms arpo grpo dapo   # and DAPO: three runs more, about 12 minutes
    python benchmarks/train_compare.py --quick    # ARPO and GRPO, one seed, 2 steps: about 7 minutes
    python benchmarks/train_compare.py --reuse    # table and plot again from the runs in --out

Running it again goes on where it stopped: a run that reached its last step is reused, an unfinished one restarts.

Task: the chained word problems (`arpo_env.datasets.procedural.chain_tasks`, ``chain:N:SEED:STEPS``): a number goes through
LEVEL operations in turn, and the model must carry each printed result into its next Python call. The cold start
(`arpo sft`, `examples/recipes/smollm2_sft_cpu.yaml` with ``--synthetic_family chain:LEVEL+1``, 40 teacher traces
of seed 1, one operation longer than the RL tasks; in ``OUT/cold-start-chainLEVEL+1``) is made once and shared by
every run. Training tasks are of seed 0, held-out tasks of seed 99.

Each (algorithm, seed) is one ``arpo train`` run of `examples/recipes/smollm2_cpu.yaml` with the same M (4
trajectories per question) and 8 trajectories per step; only ``--algorithm`` and ``--seed`` change. Held-out
accuracy (TRL's evaluation: --eval-tasks held-out questions, rolled out greedily by default: --eval-temperature 0,
--eval-samples 1) is measured before the first step and every --eval-every steps (by default: before and after
training). A greedy evaluation of the cold start is the same for every run, so it is made once, by the first run,
and shared as every run's step 0. Per step: reward, the share of groups whose rewards differ
(1 - frac_reward_zero_std), tool calls per trajectory, tokens generated, wall time. Writes ``experiment.csv`` (every
step of every run), ``experiment.md`` (mean ± standard deviation over seeds) and ``experiment.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples/recipes/smollm2_cpu.yaml"
SFT_RECIPE = ROOT / "examples/recipes/smollm2_sft_cpu.yaml"
PER_STEP = 8  # trajectories per step: the recipe's per_device_train_batch_size x gradient_accumulation_steps
M = 4


def cold_start(out: Path, level: int) -> Path:
    """SFT on 40 teacher traces of ``level`` operations (one more than the RL tasks by default: measured on 16
    held-out two-step tasks, greedy, a cold start on three-step traces answers 25% of them, one on two-step traces
    12.5%; the longer traces teach the model to keep carrying results)."""
    model = out / f"cold-start-chain{level}"
    if (model / "config.json").is_file():
        return model
    cmd = [sys.executable, "-m", "arpo_algo.cli", "sft", "--config", str(SFT_RECIPE), "--synthetic_family",
           f"chain:{level}", "--output_dir", str(model)]
    print(f"\n=== cold start: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return model


def train(algorithm: str, seed: int, model: Path, out: Path, args: argparse.Namespace, eval_on_start: bool
          ) -> list[dict]:
    run_dir = out / f"{algorithm}-seed{seed}"
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        logs = [json.loads(line) for line in metrics.read_text().splitlines()]
        last = [h for h in logs if h.get("step") == args.steps]
        finished = any("reward" in h for h in last) and (args.steps % args.eval_every > 0
                                                         or any("eval_reward" in h for h in last))
        if args.reuse or finished:
            print(f"=== {algorithm} seed {seed}: reusing {metrics}" + ("" if finished else " (unfinished)"))
            return logs
        metrics.unlink()  # an unfinished run starts again
    cmd = [sys.executable, "-m", "arpo_algo.cli", "train", "--config", str(RECIPE), "--algorithm", algorithm,
           "--seed", str(seed), "--model_name_or_path", str(model), "--output_dir", str(run_dir),
           "--dataset_name", f"chain:2000:0:{args.level}", "--max_tool_calls", str(args.level + 1),
           "--max_steps", str(args.steps), "--save_strategy", "no", "--num_generations", str(M),
           "--eval_dataset_name", f"chain:{args.eval_tasks}:99:{args.level}", "--eval_strategy", "steps",
           "--eval_steps", str(args.eval_every), "--eval_on_start",
           str(eval_on_start).lower(), "--num_generations_eval",
           str(args.eval_samples), "--eval_temperature", str(args.eval_temperature), "--per_device_eval_batch_size",
           str(eval_batch(args)), *args.extra]
    print(f"\n=== {algorithm} seed {seed}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def eval_batch(args: argparse.Namespace) -> int:
    """Held-out rollouts per evaluation batch: all of them up to 16 (one batched rollout), in whole questions."""
    total = args.eval_tasks * args.eval_samples
    return total if total <= 16 else args.eval_samples * max(1, 16 // args.eval_samples)


def rows_of(algorithm: str, seed: int, logs: list[dict]) -> list[dict]:
    """One row per training step, with the held-out accuracy measured at that step (before it, for step 0). A
    step's wall time is TRL's ``step_time`` (rollouts, scoring and the update; not the evaluations)."""
    evals = {h["step"]: h for h in logs if "eval_reward" in h}
    heldout = {step: h.get("eval_arpo/accuracy") for step, h in evals.items()}
    rows = [{"algorithm": algorithm, "seed": seed, "step": 0, "heldout_accuracy": heldout[0]}] if 0 in evals else []
    for h in (h for h in logs if "reward" in h):
        rows.append({"algorithm": algorithm, "seed": seed, "step": h["step"], "reward": h["reward"],
                     "accuracy": h.get("arpo/accuracy"),
                     "groups_with_varied_rewards": 1 - h.get("frac_reward_zero_std", 0.0),
                     "tool_calls_per_trajectory": h.get("arpo/tool_calls_per_trajectory"),
                     "tokens_generated": h.get("arpo/tokens_generated"),
                     "step_seconds": round(h["step_time"], 1) if h.get("step_time") is not None else None,
                     "heldout_accuracy": heldout.get(h["step"])})
    return rows


def mean_sd(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):,.{digits}f} ± {sd:,.{digits}f}"


def table(rows: list[dict], algorithms: list[str], seeds: list[int], steps: int) -> str:
    def pick(algorithm: str, step: int, key: str) -> list[float]:
        return [r[key] for r in rows if r["algorithm"] == algorithm and r["step"] == step and r.get(key) is not None]

    lines = [f"Mean ± standard deviation over seeds {', '.join(map(str, seeds))}; {PER_STEP} trajectories per step "
             f"(M={M}).", "", "| step | " + " | ".join(f"{a} reward | {a} held-out acc." for a in algorithms) + " |",
             "|---|" + "---|---|" * len(algorithms)]
    for step in range(0, steps + 1):
        cells = []
        for a in algorithms:
            cells += [mean_sd(pick(a, step, "reward")), mean_sd(pick(a, step, "heldout_accuracy"))]
        if any(c != "-" for c in cells):
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += ["", "| per run, over all its steps | " + " | ".join(algorithms) + " |",
              "|---|" + "---|" * len(algorithms)]

    def per_run(key: str, total: bool = False, digits: int = 3) -> list[str]:
        out = []
        for a in algorithms:
            vals = []
            for seed in seeds:
                xs = [r[key] for r in rows if r["algorithm"] == a and r["seed"] == seed and r["step"] > 0
                      and r.get(key) is not None]
                if xs:
                    vals.append(sum(xs) if total else statistics.mean(xs))
            out.append(mean_sd(vals, digits))
        return out

    def final_heldout(a: str) -> list[float]:
        vals = []
        for seed in seeds:
            xs = sorted((r["step"], r["heldout_accuracy"]) for r in rows if r["algorithm"] == a and r["seed"] == seed
                        and r.get("heldout_accuracy") is not None)
            if xs:
                vals.append(xs[-1][1] - xs[0][1])
        return vals

    lines += ["| mean reward | " + " | ".join(per_run("reward")) + " |",
              "| held-out accuracy, last − first | " + " | ".join(mean_sd(final_heldout(a)) for a in algorithms)
              + " |",
              "| groups with varied rewards (share, mean over steps) | " + " | ".join(
                  per_run("groups_with_varied_rewards")) + " |",
              "| tool calls per trajectory | " + " | ".join(per_run("tool_calls_per_trajectory")) + " |",
              "| tokens generated (total) | " + " | ".join(per_run("tokens_generated", total=True, digits=0)) + " |",
              "| wall seconds per step | " + " | ".join(per_run("step_seconds", digits=1)) + " |"]
    varied = [r for r in rows if r["step"] > 0 and r.get("groups_with_varied_rewards") is not None]
    share = sum(r["groups_with_varied_rewards"] > 0 for r in varied) / max(1, len(varied))
    lines += ["", f"steps with frac_reward_zero_std < 1: {share:.0%} of {len(varied)}"]
    return "\n".join(lines)


def plot(rows: list[dict], algorithms: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    keys = [("reward", "reward"), ("heldout_accuracy", "held-out accuracy"),
            ("tool_calls_per_trajectory", "tool calls / trajectory"), ("tokens_generated", "tokens generated / step")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6))
    for ax, (key, label) in zip(axes, keys):
        for a in algorithms:
            steps = sorted({r["step"] for r in rows if r["algorithm"] == a and r.get(key) is not None})
            if not steps:
                continue
            means, sds = [], []
            for s in steps:
                xs = [r[key] for r in rows if r["algorithm"] == a and r["step"] == s and r.get(key) is not None]
                means.append(statistics.mean(xs))
                sds.append(statistics.stdev(xs) if len(xs) > 1 else 0.0)
            line, = ax.plot(steps, means, marker="o", label=a)
            ax.fill_between(steps, [m - d for m, d in zip(means, sds)], [m + d for m, d in zip(means, sds)],
                            color=line.get_color(), alpha=0.2)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("mean ± sd over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["arpo", "grpo"], help="add dapo for the third")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=4, help="steps between held-out evaluations")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out questions")
    parser.add_argument("--eval-samples", type=int, default=1, help="samples per held-out question")
    parser.add_argument("--eval-temperature", type=float, default=0.0, help="0: greedy (then one sample is enough)")
    parser.add_argument("--level", type=int, default=2, help="operations per word problem (tool calls needed)")
    parser.add_argument("--cold-start-level", type=int, default=None,
                        help="operations per cold-start trace (default: --level + 1)")
    parser.add_argument("--quick", action="store_true", help="arpo and grpo, one seed, 2 steps, 8 held-out tasks")
    parser.add_argument("--out", default=None, help="runs/experiment (runs/experiment-quick with --quick)")
    parser.add_argument("--reuse", action="store_true", help="rebuild the table and plot from runs already in --out")
    parser.add_argument("extra", nargs="*", help="more arpo train flags, after --")
    args = parser.parse_args()
    if args.quick:
        args.algorithms, args.seeds, args.steps, args.eval_every, args.eval_tasks = ["arpo", "grpo"], [0], 2, 2, 8
    out = Path(args.out or ROOT / ("runs/experiment-quick" if args.quick else "runs/experiment"))
    out.mkdir(parents=True, exist_ok=True)
    cold_level = args.cold_start_level or args.level + 1
    model = out / f"cold-start-chain{cold_level}" if args.reuse else cold_start(out, cold_level)
    rows = []
    greedy = args.eval_temperature == 0  # then the cold start's evaluation is the same for every run: made once
    start = None
    for seed in args.seeds:
        for algorithm in args.algorithms:
            logs = train(algorithm, seed, model, out, args, eval_on_start=not (greedy and rows))
            if greedy:
                start = start or next((h for h in logs if "eval_reward" in h and h["step"] == 0), None)
                if start and not any("eval_reward" in h and h["step"] == 0 for h in logs):
                    logs = [start] + logs
            rows += rows_of(algorithm, seed, logs)
    fields = ["algorithm", "seed", "step", "reward", "accuracy", "heldout_accuracy", "groups_with_varied_rewards",
              "tool_calls_per_trajectory", "tokens_generated", "step_seconds"]
    with open(out / "experiment.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    text = table(rows, args.algorithms, args.seeds, args.steps)
    (out / "experiment.md").write_text(text + "\n")
    plot(rows, args.algorithms, out / "experiment.png")
    print("\n" + text)
    print(f"\nsaved {out / 'experiment.csv'}, {out / 'experiment.md'}, {out / 'experiment.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
