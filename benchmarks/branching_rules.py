"""Does entropy steer branching to where outcomes diverge? Branching rules scored on the same trees, paired.

    python benchmarks/branching_rules.py            # 48 held-out noisy tasks, M = 8, N = 2: about 30 minutes
    python benchmarks/branching_rules.py --quick    # 8 tasks: about 6 minutes (after the cold start, made once)

The cold start (`benchmarks/_policy.py`: SmolLM2-135M-Instruct after ``arpo sft`` on teacher traces of a noisy family,
three-term arithmetic whose Python results are an interrupted cell or a stale number 40 % of the time) rolls out
held-out tasks of that family at T = 1 with N = 2 global samples and M = 8, branching at *every* tool step while a task
has room (α = 1, β = 0). Every branch point is then a pair of siblings: the path that went on and the child that
re-sampled its turn after the same tool result. Every trajectory is scored again by one forward pass
(`benchmarks/_rescore.py`), which gives at each branch point ΔH by both estimators (top-10, the reference's; exact, the
whole vocabulary) and both timings (the k tokens right after the result, the paper's; *lagged*, after the result before
it, the reference code's).

Measured:
* **Do siblings' rewards differ more where ΔH is high?** The slope of "siblings differ" (0 or 1) on ΔH, a linear
  probability fit, with a 95 % bootstrap interval that resamples tasks (a task's branch points are one draw).
* **Which rule finds mixed-outcome pairs most cheaply?** Every rule P = clip(0.5 + β·ΔH), β ∈ {−0.2, 0, 0.2, 0.5}
  (β = 0 is random branching at P = 0.5), and β = 0.2 on the lagged ΔH, is scored on the same trees: a branch point
  counts with the probability that the rule would have made it (its P times the P of every branch its path came
  from), and so do the tokens its child generated. Mixed pairs per 1,000 generated tokens = expected mixed pairs /
  expected tokens (the N global paths' tokens included), with intervals over tasks, and the paired difference of
  each rule against β = 0. A rule that branches more gets more pairs per token from the global paths' tokens
  alone, so the table also gives the branches each rule makes per point and its yield per 1,000 tokens of its
  branches: there, a rule beats β = 0 only by choosing where to branch.

``--reuse`` makes the tables again from the trees and points a run left in ``--out``.

Writes ``OUT/trees.jsonl``, ``OUT/points.jsonl`` (one line per branch point), ``OUT/branching_rules.md`` and
``OUT/branching_rules.png``. The last line reads
``siblings differ slope <b> CI <lo> <hi> over <n> branch points; mixed pairs per 1k tokens beta 0.2 <x> beta 0 <y>``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym
from _policy import FAMILY, cold_start
from _rescore import prompt_cache, result_ends, token_entropies, window
from _stats import cluster_bootstrap, interval, mean, slope
from tqdm import tqdm

import arpo_env  # noqa: F401
from arpo_algo.core.branching import branch_probability
from arpo_algo.core.config import RolloutConfig
from arpo_algo.core.tree import read_jsonl, write_jsonl
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import generation_device, load_model
from arpo_algo.rollout.scheduler import ARPORollout

ROOT = Path(__file__).resolve().parents[1]
ALPHA = 0.5
RULES = [("beta -0.2", -0.2, "after"), ("beta 0", 0.0, "after"), ("beta 0.2", 0.2, "after"),
         ("beta 0.5", 0.5, "after"), ("beta 0.2 lagged", 0.2, "lagged")]


def branch_points(trees: list, model, k: int) -> list[dict]:
    """One record per sibling pair: the task, ΔH by estimator and timing, whether the rewards differ, the child's
    generated tokens and the branch nodes its parent path came from."""
    points = []
    for t, tree in enumerate(tqdm(trees, desc="scoring trajectories again", unit="tree")):
        by_node = {tr.node: tr for tr in tree.trajectories}
        nodes = {n.id: n for n in tree.nodes}
        cached = prompt_cache(model, tree.trajectories[0].prompt_ids)
        scored = {tr.node: token_entropies(model, cached, tr.completion_ids) for tr in tree.trajectories}
        for node in tree.nodes:
            if node.kind != "branch" or node.parent not in by_node or node.id not in by_node:
                continue
            parent, child = by_node[node.parent], by_node[node.id]
            ends = [e for e in result_ends(parent) if e <= node.start]
            record = {"task": t, "step": node.step, "start": node.start, "differ": parent.reward != child.reward,
                      "rewards": [parent.reward, child.reward],
                      "child_tokens": sum(child.mask[node.start:]),
                      "ancestors": [a for a in tree.ancestors(node.parent) if nodes[a].kind == "branch"]}
            for name, entropies in scored[parent.node].items():
                h0 = window(entropies, parent.mask, 0, k)
                after = window(entropies, parent.mask, node.start, k)
                lagged = window(entropies, parent.mask, ends[-2], k) if len(ends) >= 2 else None
                record[f"dh_{name}"] = after - h0 if None not in (after, h0) else None
                record[f"dh_{name}_lagged"] = lagged - h0 if None not in (lagged, h0) else None
            record["id"] = node.id
            points.append(record)
    return points


def rule_yield(points: list[dict], root_tokens: dict[int, int], beta: float, timing: str, estimator: str,
               tasks: list[int], roots: bool = True) -> float:
    """Expected mixed pairs per 1,000 generated tokens under P = clip(α + β·ΔH) on `tasks` (repeats allowed); with
    `roots` False, per 1,000 tokens of the branches alone (what a rule pays for the pairs it makes)."""
    key = f"dh_{estimator}" + ("_lagged" if timing == "lagged" else "")
    by_task: dict[int, list[dict]] = {}
    for p in points:
        by_task.setdefault(p["task"], []).append(p)
    mixed = tokens = 0.0
    for t in tasks:
        chosen = {p["id"]: branch_probability(ALPHA, beta, p[key]) for p in by_task.get(t, [])}
        for p in by_task.get(t, []):
            weight = chosen[p["id"]]
            for a in p["ancestors"]:
                weight *= chosen.get(a, 1.0)
            mixed += weight * p["differ"]
            tokens += weight * p["child_tokens"]
        tokens += root_tokens[t] if roots else 0
    return 1000 * mixed / tokens if tokens else float("nan")


def expected_branches(points: list[dict], beta: float, timing: str, estimator: str) -> float:
    """Branches per branch point a rule would make, on average (the same weighting as `rule_yield`)."""
    key = f"dh_{estimator}" + ("_lagged" if timing == "lagged" else "")
    chosen = {(p["task"], p["id"]): branch_probability(ALPHA, beta, p[key]) for p in points}
    total = 0.0
    for p in points:
        weight = chosen[p["task"], p["id"]]
        for a in p["ancestors"]:
            weight *= chosen.get((p["task"], a), 1.0)
        total += weight
    return total / len(points) if points else float("nan")


def plot(points: list[dict], rows: list[tuple], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for estimator, color in (("top10", "#4c72b0"), ("exact", "#dd8452")):
        xs = sorted(p[f"dh_{estimator}"] for p in points if p[f"dh_{estimator}"] is not None)
        if len(xs) < 4:
            continue
        edges = [xs[int(i * (len(xs) - 1) / 4)] for i in range(5)]
        centres, rates = [], []
        for lo, hi in zip(edges, edges[1:]):
            inside = [p["differ"] for p in points if p[f"dh_{estimator}"] is not None and lo <= p[f"dh_{estimator}"]
                      <= hi]
            centres.append((lo + hi) / 2)
            rates.append(mean(inside))
        left.plot(centres, rates, marker="o", color=color, label=f"{estimator} ΔH (quartile bins)")
    left.set(title="siblings whose rewards differ, by ΔH", xlabel="ΔH at the branch point", ylabel="share differing")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    names = [r[0] for r in rows]
    est = [r[1] for r in rows]
    right.errorbar(range(len(rows)), est, yerr=[[e - r[2] for e, r in zip(est, rows)],
                                                [r[3] - e for e, r in zip(est, rows)]], fmt="o", capsize=4)
    right.set_xticks(range(len(rows)), names, rotation=20, fontsize=8)
    right.set(title="mixed-outcome pairs per 1,000 generated tokens (95 % CI)", ylabel="pairs / 1k tokens")
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=48, help="held-out tasks (at least 48 for the published run)")
    parser.add_argument("--family", default=FAMILY, help="procedural family of the cold start and the tasks")
    parser.add_argument("--task-seed", type=int, default=4242, help="seed of the held-out tasks (traces: seed 1)")
    parser.add_argument("--model", default=None, help="a model folder (default: the noisy-chain cold start)")
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="8 tasks")
    parser.add_argument("--reuse", action="store_true", help="the tables again from the trees and points in --out")
    parser.add_argument("--out", default=None, help="runs/branching_rules (runs/branching_rules-quick)")
    args = parser.parse_args()
    if args.quick:
        args.tasks = 8
    out = Path(args.out or ROOT / ("runs/branching_rules-quick" if args.quick else "runs/branching_rules"))
    out.mkdir(parents=True, exist_ok=True)

    name, _, level = args.family.partition(":")
    dataset = f"{name}:{args.tasks}:{args.task_seed}" + (f":{level}" if level else "")
    start = time.perf_counter()
    if args.reuse:  # the tables again from the trees and branch points a run left in --out
        trees = list(read_jsonl(out / "trees.jsonl"))
        points = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
        args.tasks = len(trees)
    else:
        model, tokenizer = load_model(str(args.model or cold_start(args.family)), device=generation_device())
        config = RolloutConfig(num_generations=8, num_global=2, branch_factor=2, alpha=1.0, beta=0.0,
                               entropy_k=args.k, max_new_tokens=96, max_completion_tokens=1024, seed=args.seed)
        engine = ARPORollout(HFGenerator(model, tokenizer),
                             lambda: gym.make("ARPO-Math-v0", dataset=dataset, max_tool_calls=6).unwrapped, config)
        bar = tqdm(total=args.tasks, desc="rollouts (trees)", unit="tree")
        trees = engine.run(list(range(args.tasks)), on_tree=lambda i, tree: bar.update(1))
        bar.close()
        write_jsonl(trees, out / "trees.jsonl", append=False)
        points = branch_points(trees, model, args.k)
        with open(out / "points.jsonl", "w") as f:
            for p in points:
                f.write(json.dumps(p) + "\n")
    wall = time.perf_counter() - start
    if not points:
        raise SystemExit("no branch point: the model never called a tool")

    root_tokens = {t: sum(sum(tr.mask) for tr in tree.trajectories if tree.nodes[tr.node].kind == "global")
                   for t, tree in enumerate(trees)}
    tasks = sorted(root_tokens)

    def slope_on(key: str):
        return lambda sample: slope([(p[key], float(p["differ"])) for t in sample for p in points
                                     if p["task"] == t and p[key] is not None])

    lines = [f"{args.tasks} held-out tasks ({dataset}), M=8, N=2, branching at every tool step with room, T=1, "
             f"k={args.k}, seed {args.seed}; {len(points)} branch points, "
             f"{sum(p['differ'] for p in points)} with differing sibling rewards; {wall:.0f} s", "",
             "| ΔH | slope of 'siblings differ' on ΔH (95 % CI over tasks) | branch points |", "|---|---|---:|"]
    slopes = {}
    for estimator in ("top10", "exact"):
        for timing in ("", "_lagged"):
            key = f"dh_{estimator}{timing}"
            slopes[key] = cluster_bootstrap(tasks, slope_on(key), args.resamples, args.seed)
            n = sum(p[key] is not None for p in points)
            lines.append(f"| {estimator}{' lagged' if timing else ''} | {interval(*slopes[key])} | {n} |")
    lines += ["", "| rule (P = clip(0.5 + β·ΔH), top-10 ΔH) | branches per point | mixed pairs per 1k tokens (95 % "
                  "CI) | minus β = 0 (paired, 95 % CI) | per 1k branch tokens (95 % CI) | minus β = 0 (paired) |",
              "|---|---:|---|---|---|---|"]
    rows = []
    for label, beta, timing in RULES:
        ci = cluster_bootstrap(tasks, lambda s, b=beta, tm=timing: rule_yield(points, root_tokens, b, tm, "top10", s),
                               args.resamples, args.seed)
        diff = cluster_bootstrap(tasks, lambda s, b=beta, tm=timing: rule_yield(points, root_tokens, b, tm, "top10", s)
                                 - rule_yield(points, root_tokens, 0.0, "after", "top10", s), args.resamples, args.seed)
        own = cluster_bootstrap(tasks, lambda s, b=beta, tm=timing: rule_yield(points, root_tokens, b, tm, "top10", s,
                                                                              roots=False), args.resamples, args.seed)
        own_diff = cluster_bootstrap(
            tasks, lambda s, b=beta, tm=timing: rule_yield(points, root_tokens, b, tm, "top10", s, roots=False)
            - rule_yield(points, root_tokens, 0.0, "after", "top10", s, roots=False), args.resamples, args.seed)
        rows.append((label, *ci))
        baseline = beta == 0 and timing == "after"
        lines.append(f"| {label} | {expected_branches(points, beta, timing, 'top10'):.2f} | {interval(*ci)} | "
                     f"{'—' if baseline else interval(*diff)} | {interval(*own)} | "
                     f"{'—' if baseline else interval(*own_diff)} |")
    table = "\n".join(lines)
    (out / "branching_rules.md").write_text(table + "\n")
    plot(points, rows, out / "branching_rules.png")
    print("\n" + table)
    print(f"\ntrees, points, table and plot in {out}/")
    b, lo, hi = slopes["dh_top10"]
    x = next(r[1] for r in rows if r[0] == "beta 0.2")
    y = next(r[1] for r in rows if r[0] == "beta 0")
    print(f"siblings differ slope {b:.3f} CI {lo:.3f} {hi:.3f} over {len(points)} branch points; "
          f"mixed pairs per 1k tokens beta 0.2 {x:.3f} beta 0 {y:.3f}")


if __name__ == "__main__":
    main()
