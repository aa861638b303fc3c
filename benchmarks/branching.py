"""Does branching follow entropy? ΔH and P at every tool step of ARPO rollouts of the embedded model.

    python benchmarks/branching.py [--tasks 8] [-M 8] [-N 4] [--out runs/branching]

SmolLM2-135M-Instruct after the short imitation warm-up of `benchmarks/_warmup.py` (so that it calls tools) rolls
out ARPO on held-out procedural arithmetic tasks with the paper's α = 0.5, β = 0.2, k = 20. At every tool step
the engine records ΔH (H after the result − H₀, each the sum of the k tokens' normalised entropies:
`arpo_algo.core.entropy`) and P = clip(α + β·ΔH). This prints their distribution, how often the engine branched for low
and for high ΔH, and, for comparison, the P the old definition (ΔH as a difference of *means*, k times smaller)
would have given on the same tokens. A histogram of ΔH and P against ΔH are saved as a PNG. The last line reads
``P min <x> median <y> max <z> over <n> tool steps``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import gymnasium as gym
from _warmup import warmed_model

import arpo_env  # noqa: F401
from arpo_algo.core.branching import branch_probability
from arpo_algo.core.config import add_rollout_flags, from_flags
from arpo_algo.core.tree import write_jsonl
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import generation_device
from arpo_algo.rollout.scheduler import ARPORollout


def quantiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"min {min(values):+.3f}  q1 {q[0]:+.3f}  median {q[1]:+.3f}  q3 {q[2]:+.3f}  max {max(values):+.3f}"


def plot(decisions: list[dict], alpha: float, beta: float, k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dh = [d["delta_h"] for d in decisions]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.hist(dh, bins=30, color="#4c72b0")
    left.axvline(0, color="grey", lw=0.8)
    left.set(title="ΔH at tool steps", xlabel=f"ΔH (sum over k={k} tokens, normalised by ln|V|)", ylabel="tool steps")
    branched = [d for d in decisions if d["branched"]]
    kept = [d for d in decisions if not d["branched"]]
    right.scatter([d["delta_h"] for d in kept], [d["p"] for d in kept], s=12, color="#999999", label="no branch")
    right.scatter([d["delta_h"] for d in branched], [d["p"] for d in branched], s=12, color="#c44e52",
                  label="branched")
    right.scatter(dh, [branch_probability(alpha, beta, x / k) for x in dh], s=4, color="#55a868",
                  label="old scale (mean): P")
    right.set(title=f"P = clip({alpha} + {beta}·ΔH)", xlabel="ΔH", ylabel="P", ylim=(-0.02, 1.02))
    right.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    add_rollout_flags(parser, skip=("branching", "max_tool_workers"), defaults={"num_generations": 8, "num_global": 4, "max_new_tokens": 64, "max_completion_tokens": 512})
    parser.add_argument("--out", default="runs/branching", help="folder for the trees (JSONL) and the plot")
    args = parser.parse_args()

    model, tokenizer = warmed_model()
    model = model.to(generation_device() or "cpu")  # the GPU where there is one
    config = from_flags(args)
    engine = ARPORollout(HFGenerator(model, tokenizer),
                         lambda: gym.make("ARPO-Math-v0", dataset="arithmetic:1000:777").unwrapped, config)
    start = time.perf_counter()
    trees = engine.run(list(range(args.tasks)))
    wall = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(trees, out / "trees.jsonl", append=False)

    decisions = [d for tree in trees for t in tree.trajectories for d in t.decisions]
    if not decisions:
        raise SystemExit("no tool step was taken: the model never called a tool")
    dh = [d["delta_h"] for d in decisions]
    p = [d["p"] for d in decisions]
    old_p = [branch_probability(config.alpha, config.beta, x / config.entropy_k) for x in dh]
    median = statistics.median(dh)
    low = [d for d in decisions if d["delta_h"] <= median]
    high = [d for d in decisions if d["delta_h"] > median]
    rate = lambda ds: sum(d["branched"] for d in ds) / len(ds) if ds else float("nan")  # noqa: E731
    print(f"\n{args.tasks} tasks, M={config.num_generations}, N={config.num_global}, Z={config.branch_factor}, "
          f"alpha={config.alpha}, beta={config.beta}, k={config.entropy_k}, seed={args.seed}; {wall:.0f} s")
    print(f"trajectories {sum(len(t.trajectories) for t in trees)}, branches {sum(t.branches for t in trees)}, "
          f"tool steps with a decision {len(decisions)}")
    print(f"ΔH  {quantiles(dh)}")
    print(f"P   {quantiles(p)}")
    print(f"P with the old mean scale on the same tokens: min {min(old_p):.3f} max {max(old_p):.3f}")
    print(f"branched at {rate(low):.0%} of the {len(low)} steps with ΔH <= median ({median:+.3f}) "
          f"and {rate(high):.0%} of the {len(high)} steps above it")
    summary = {"decisions": len(decisions), "delta_h": dh, "p": p, "branch_rate_low": rate(low),
               "branch_rate_high": rate(high), "wall_s": wall, "config": vars(args)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(decisions, config.alpha, config.beta, config.entropy_k, out / "branching.png")
    print(f"trees, summary and plot: {out}/trees.jsonl, summary.json, branching.png")
    print(f"P min {min(p):.3f} median {statistics.median(p):.3f} max {max(p):.3f} over {len(p)} tool steps")


if __name__ == "__main__":
    main()
