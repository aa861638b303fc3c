"""The paper's observation on its own protocol: is the entropy of the model's first tokens after each tool result
higher than at the start of its response?

    python benchmarks/entropy_after_tools.py           # 32 tasks per suite, 2 samples each: about 28 minutes
    python benchmarks/entropy_after_tools.py --quick   # 8 tasks per suite: about 8 minutes

The cold start (`benchmarks/_policy.py`) rolls out its own multi-turn episodes at T = 1, on four suites: the procedural
arithmetic, the same with 40 % of the results faulty (an interrupted cell or a stale number), the noisy chains (two
operations, a quarter of the results faulty) and GSM8K's test questions (from ``../shared/data/eval``). Every trajectory
is scored again by one forward pass (`benchmarks/_rescore.py`), which gives each token's normalised entropy by both
estimators: top-10 (the reference's) and exact (the whole vocabulary). For each trajectory, H_start is the sum over the
first k = 20 tokens of the response, and H_after(t) the sum over the first k tokens after tool result t; each tool round
is a pair (H_after(t), H_start) of the same trajectory.

Printed per suite, estimator and round: mean H_start, mean H_after, the ratio of the means and the paired mean
difference, each with a 95 % bootstrap interval that resamples tasks. Saved: ``OUT/entropy_after_tools.md``, the
rounds as JSONL, and ``OUT/entropy_after_tools.png``. The last line (all suites, top-10, every round) reads
``after/start entropy <r> CI <lo> <hi> over <n> tool rounds``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
from _policy import cold_start
from _rescore import ESTIMATORS, prompt_cache, result_ends, token_entropies, window
from _stats import cluster_bootstrap, mean
from tqdm import tqdm

import arpo_env  # noqa: F401
from arpo_algo.core.config import RolloutConfig
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import generation_device, load_model
from arpo_algo.rollout.scheduler import GRPORollout

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"arithmetic": lambda n, data: {"dataset": f"arithmetic:{n}:777"},
          "noisy arithmetic": lambda n, data: {"dataset": f"arithmetic:{n}:777:3:40"},
          "noisy chain": lambda n, data: {"dataset": f"noisy:{n}:777:2"},
          "gsm8k": lambda n, data: {"dataset": "gsm8k", "data_dir": data}}


def rounds_of(suite: str, trees: list, model, k: int) -> list[dict]:
    """One record per (trajectory, tool round): its task, round number and both windows by both estimators."""
    records = []
    for t, tree in enumerate(tqdm(trees, desc=f"{suite}: scoring again", unit="tree", leave=False)):
        cached = prompt_cache(model, tree.trajectories[0].prompt_ids)
        for j, tr in enumerate(tree.trajectories):
            entropies = token_entropies(model, cached, tr.completion_ids)
            for r, end in enumerate(result_ends(tr), 1):
                record = {"suite": suite, "task": t, "trajectory": j, "round": r}
                for name in ESTIMATORS:
                    record[f"start_{name}"] = window(entropies[name], tr.mask, 0, k)
                    record[f"after_{name}"] = window(entropies[name], tr.mask, end, k)
                if record["after_top10"] is not None and record["start_top10"] is not None:
                    records.append(record)
    return records


def ratio(records: list[dict], estimator: str) -> float:
    start = mean([r[f"start_{estimator}"] for r in records])
    return mean([r[f"after_{estimator}"] for r in records]) / start if start else float("nan")


def difference(records: list[dict], estimator: str) -> float:
    return mean([r[f"after_{estimator}"] - r[f"start_{estimator}"] for r in records])


def by_task(records: list[dict]) -> list[list[dict]]:
    """The records as clusters: a suite's task is one draw of the bootstrap."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["suite"], r["task"]), []).append(r)
    return list(groups.values())


def flat(clusters: list[list[dict]]) -> list[dict]:
    return [r for c in clusters for r in c]


def plot(records: list[dict], suites: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(suites), figsize=(4.5 * len(suites), 3.8), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        mine = [r for r in records if r["suite"] == suite]
        for estimator, color in (("top10", "#4c72b0"), ("exact", "#dd8452")):
            rounds = sorted({r["round"] for r in mine})
            diffs = [difference([r for r in mine if r["round"] == n], estimator) for n in rounds]
            counts = [sum(r["round"] == n for r in mine) for n in rounds]
            ax.plot(rounds, diffs, marker="o", color=color, label=f"{estimator}")
            for x, y, c in zip(rounds, diffs, counts):
                ax.annotate(str(c), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
        ax.axhline(0, color="grey", lw=0.8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(title=f"{suite}: H_after(t) − H_start (paired)", xlabel="tool round t (labels: rounds measured)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("entropy difference (sum over k tokens)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=32, help="tasks per suite")
    parser.add_argument("--samples", type=int, default=2, help="trajectories per task")
    parser.add_argument("--suites", nargs="+", default=list(SUITES), choices=list(SUITES), metavar="SUITE",
                        help=f"of {', '.join(SUITES)}")
    parser.add_argument("--model", default=None, help="a model folder (default: the noisy-chain cold start)")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/eval"))
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="8 tasks per suite")
    parser.add_argument("--out", default=None, help="runs/entropy_after_tools (runs/entropy_after_tools-quick)")
    args = parser.parse_args()
    if args.quick:
        args.tasks = 8
    out = Path(args.out or ROOT / ("runs/entropy_after_tools-quick" if args.quick else "runs/entropy_after_tools"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    source = str(args.model or cold_start())
    model, tokenizer = load_model(source, device=generation_device())
    # a turn needs only its first k tokens measured: 96 tokens a turn and 512 a trajectory keep long GSM8K turns short
    config = RolloutConfig(num_generations=args.samples, temperature=1.0, entropy_k=args.k, max_new_tokens=96,
                           max_completion_tokens=512, seed=args.seed)
    records = []
    for suite in args.suites:
        kwargs = SUITES[suite](args.tasks, args.data_dir)
        engine = GRPORollout(HFGenerator(model, tokenizer),
                             lambda kw=kwargs: gym.make("ARPO-Math-v0", max_tool_calls=4, **kw).unwrapped, config)
        bar = tqdm(total=args.tasks, desc=f"{suite}: rollouts", unit="task")
        trees = engine.run(list(range(args.tasks)), on_tree=lambda i, tree: bar.update(1))
        bar.close()
        records += rounds_of(suite, trees, model, args.k)
    if not records:
        raise SystemExit("no tool round: the model never called a tool")
    with open(out / "rounds.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")

    lines = [f"model {Path(source).name}; {args.tasks} tasks per suite, {args.samples} samples each, "
             f"T=1, k={args.k}; intervals: 95 % bootstrap over tasks; {(time.perf_counter() - started) / 60:.0f} min",
             "", "| suite | estimator | rounds | H_start | H_after | after / start (95 % CI) | "
                 "after − start, paired (95 % CI) |", "|---|---|---:|---:|---:|---|---|"]

    def row(label: str, chosen: list[dict], estimator: str) -> str:
        clusters = by_task(chosen)
        r = cluster_bootstrap(clusters, lambda s: ratio(flat(s), estimator), args.resamples, args.seed)
        d = cluster_bootstrap(clusters, lambda s: difference(flat(s), estimator), args.resamples, args.seed)
        return (f"| {label} | {estimator} | {len(chosen)} | {mean([x[f'start_{estimator}'] for x in chosen]):.3f} | "
                f"{mean([x[f'after_{estimator}'] for x in chosen]):.3f} | {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}] | "
                f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] |")

    for suite in args.suites:
        mine = [r for r in records if r["suite"] == suite]
        for estimator in ESTIMATORS:
            if mine:
                lines.append(row(suite, mine, estimator))
    for estimator in ESTIMATORS:
        lines.append(row("all", records, estimator))
    lines += ["", "| suite | round | rounds measured | after − start, top-10 (95 % CI) |", "|---|---:|---:|---|"]
    for suite in args.suites:
        for n in sorted({r["round"] for r in records if r["suite"] == suite}):
            chosen = [r for r in records if r["suite"] == suite and r["round"] == n]
            d = cluster_bootstrap(by_task(chosen), lambda s: difference(flat(s), "top10"), args.resamples, args.seed)
            lines.append(f"| {suite} | {n} | {len(chosen)} | {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}] |")
    table = "\n".join(lines)
    (out / "entropy_after_tools.md").write_text(table + "\n")
    plot(records, args.suites, out / "entropy_after_tools.png")
    print("\n" + table)
    print(f"\nrounds, table and plot in {out}/")
    r, lo, hi = cluster_bootstrap(by_task(records), lambda s: ratio(flat(s), "top10"), args.resamples, args.seed)
    print(f"after/start entropy {r:.3f} CI {lo:.3f} {hi:.3f} over {len(records)} tool rounds")


if __name__ == "__main__":
    main()
