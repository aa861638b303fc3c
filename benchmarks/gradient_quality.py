"""At equal budget, is ARPO's gradient estimate closer to the true gradient than GRPO's?

    python benchmarks/gradient_quality.py           # 6 tasks, reference of 16 samples each, 3 replicates: ~30 min
    python benchmarks/gradient_quality.py --quick   # 2 tasks, reference of 6, 1 replicate: about 6 minutes

The policy is the cold start on noisy arithmetic (`benchmarks/_policy.py`). Gradients are taken with respect to a few
weights only, to keep backward passes cheap: the last transformer block's attention output and MLP down
projections (1.2 M of 135 M weights); a trajectory's score vector is the gradient of the log-probability of
its own tokens (tool output excluded), and a batch's estimate is Σ advantage × score over its trajectories, with
GRPO's group advantages (reward − group mean) / (group std + 1e-4); ARPO's are "soft" (plain GRPO over the tree's
M trajectories, shared prefixes included in each).

* **Reference**: `--ref-samples` independent GRPO samples of each task (T = 1). Its reliability is reported: the
  cosine between the estimates of its two halves, and, by Spearman-Brown, that of a reference twice as large.
* **Replicates**: per replicate the same tasks and rollout seed for GRPO (M), ARPO (M, N = M/2, α 0.5, β 0.2) and ARPO
  with β = 0 (random branching). ARPO's tree shares prefixes, so it spends fewer tokens and tool calls than M
  independent samples: GRPO is compared at equal *trajectories* (all M), equal *tokens* and equal *tool calls*
  (its first samples, in a seeded order, as close as they come to what ARPO's tree spent on that task, at least
  2).
* **Intervals**: cosine differences with a 95 % bootstrap that resamples tasks and replicates.

Writes ``OUT/gradient_quality.md``, ``OUT/gradient_quality.json`` and ``OUT/gradient_quality.png``. The last line
reads ``cosine ARPO-GRPO <d> CI <lo> <hi>; ARPO-random <d2> CI <lo2> <hi2> over <n> replicates`` (ARPO against
GRPO at equal tokens, and against random branching).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _policy import FAMILY, cold_start
from _rescore import completion_logits, prompt_cache
from tqdm import tqdm

import arpo_env  # noqa: F401
from arpo_algo.core.config import RolloutConfig
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import generation_device, load_model
from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout

ROOT = Path(__file__).resolve().parents[1]
ARMS = ["ARPO", "ARPO beta 0", "GRPO equal trajectories", "GRPO equal tokens", "GRPO equal tool calls"]


def chosen_weights(model) -> list[torch.nn.Parameter]:
    """The last block's attention output and MLP down projections; every other weight is frozen. Nothing before
    them depends on them, so a prompt's cache, computed once per task without gradients, gives exact gradients."""
    for p in model.parameters():
        p.requires_grad_(False)
    layer = model.model.layers[-1]
    chosen = [layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight]
    for w in chosen:
        w.requires_grad_(True)
    return chosen


def scores(model, weights, tree) -> list[np.ndarray]:
    """∇ log π(each trajectory's own tokens) with respect to `weights`, flattened, one per trajectory of `tree`."""
    cached = prompt_cache(model, tree.trajectories[0].prompt_ids)
    out = []
    for trajectory in tree.trajectories:
        logp = torch.log_softmax(completion_logits(model, cached, trajectory.completion_ids), -1)
        ids = torch.tensor(trajectory.completion_ids, device=logp.device)
        mask = torch.tensor(trajectory.mask, device=logp.device, dtype=logp.dtype)
        grads = torch.autograd.grad((logp.gather(1, ids[:, None])[:, 0] * mask).sum(), weights)
        out.append(torch.cat([g.reshape(-1) for g in grads]).cpu().numpy().astype(np.float32))
    return out


def advantages(rewards: list[float]) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std(ddof=1) + 1e-4) if len(r) > 1 else np.zeros_like(r)


def estimate(scores: list[np.ndarray], rewards: list[float]) -> np.ndarray:
    return sum(a * s for a, s in zip(advantages(rewards), scores)) if scores else 0


def own(tree) -> tuple[int, int]:
    """(generated tokens, tool calls) a tree spent: shared prefixes counted once."""
    starts = {n.id: n.start for n in tree.nodes}
    tokens = calls = 0
    for tr in tree.trajectories:
        start = starts[tr.node]
        tokens += sum(tr.mask[start:])
        calls += sum(1 for s in tr.segments if s["kind"] == "tool" and s["start"] >= start)
    return tokens, calls


def rollout(engine_cls, model, tokenizer, dataset: str, tasks: int, config: RolloutConfig, label: str) -> list:
    engine = engine_cls(HFGenerator(model, tokenizer),
                        lambda: gym.make("ARPO-Math-v0", dataset=dataset, max_tool_calls=6).unwrapped, config)
    bar = tqdm(total=tasks, desc=label, unit="tree", leave=False)
    trees = engine.run(list(range(tasks)), on_tree=lambda i, tree: bar.update(1))
    bar.close()
    return trees


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--ref-samples", type=int, default=16, help="GRPO samples per task for the reference")
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("-M", type=int, default=4, help="trajectories per task in each estimate")
    parser.add_argument("--family", default=FAMILY)
    parser.add_argument("--task-seed", type=int, default=5151)
    parser.add_argument("--model", default=None)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="2 tasks, 6 reference samples, 1 replicate")
    parser.add_argument("--out", default=None, help="runs/gradient_quality (runs/gradient_quality-quick)")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.ref_samples, args.replicates, args.M = 2, 6, 1, 4
    out = Path(args.out or ROOT / ("runs/gradient_quality-quick" if args.quick else "runs/gradient_quality"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    model, tokenizer = load_model(str(args.model or cold_start(args.family)), device=generation_device())
    weights = chosen_weights(model)
    name, _, level = args.family.partition(":")
    dataset = f"{name}:{args.tasks}:{args.task_seed}" + (f":{level}" if level else "")
    common = dict(entropy_k=20, max_new_tokens=96, max_completion_tokens=1024)

    def task_estimates(trees, vectors) -> list[np.ndarray]:
        return [estimate(v, [tr.reward for tr in tree.trajectories]) for v, tree in zip(vectors, trees)]

    # The reference, and its two halves
    ref_trees = rollout(GRPORollout, model, tokenizer, dataset, args.tasks,
                        RolloutConfig(num_generations=args.ref_samples, seed=10_000, **common), "reference rollouts")
    halves: list[list[np.ndarray]] = [[], []]
    reference = []
    for tree in tqdm(ref_trees, desc="reference gradients", unit="task"):
        vectors = scores(model, weights, tree)
        rewards = [tr.reward for tr in tree.trajectories]
        half = len(vectors) // 2
        halves[0].append(estimate(vectors[:half], rewards[:half]))
        halves[1].append(estimate(vectors[half:], rewards[half:]))
        reference.append(estimate(vectors, rewards))
    split = cosine(sum(halves[0]), sum(halves[1]))
    reliability = 2 * split / (1 + split) if split > -1 else float("nan")

    per: dict[str, list[list[np.ndarray]]] = {arm: [] for arm in ARMS}  # [replicate][task]
    spent: dict[str, list[tuple[int, int]]] = {arm: [] for arm in ARMS}
    groups: dict[str, list[list[float]]] = {arm: [] for arm in ARMS[:3]}
    for r in range(args.replicates):
        seed = 100 + r
        arpo = rollout(ARPORollout, model, tokenizer, dataset, args.tasks,
                       RolloutConfig(num_generations=args.M, num_global=args.M // 2, seed=seed, **common),
                       f"replicate {r + 1}/{args.replicates}: ARPO")
        rand = rollout(ARPORollout, model, tokenizer, dataset, args.tasks,
                       RolloutConfig(num_generations=args.M, num_global=args.M // 2, beta=0.0, seed=seed, **common),
                       f"replicate {r + 1}/{args.replicates}: ARPO beta 0")
        grpo = rollout(GRPORollout, model, tokenizer, dataset, args.tasks,
                       RolloutConfig(num_generations=args.M, seed=seed, **common),
                       f"replicate {r + 1}/{args.replicates}: GRPO")
        grpo_vectors = [scores(model, weights, tree) for tree in grpo]  # also cut to ARPO's spend below
        for arm, trees in (("ARPO", arpo), ("ARPO beta 0", rand), ("GRPO equal trajectories", grpo)):
            vectors = grpo_vectors if trees is grpo else [scores(model, weights, tree) for tree in trees]
            per[arm].append(task_estimates(trees, vectors))
            spent[arm] += [own(t) for t in trees]
            groups[arm] += [[tr.reward for tr in t.trajectories] for t in trees]
        order = random.Random(seed)
        by_tokens, by_calls = [], []
        for tree, target, vectors in zip(grpo, arpo, grpo_vectors):
            picked = list(range(len(vectors)))
            order.shuffle(picked)
            trs = [tree.trajectories[i] for i in picked]
            shuffled = [vectors[i] for i in picked]
            tokens, calls = own(target)
            for budget, index, into, arm in ((tokens, 0, by_tokens, "GRPO equal tokens"),
                                             (calls, 1, by_calls, "GRPO equal tool calls")):
                used, n = [0, 0], 0
                while n < len(trs) and (n < 2 or abs(used[index] + _cost(trs[n])[index] - budget)
                                        < abs(used[index] - budget)):  # the closest to the budget, over or under
                    used = [u + c for u, c in zip(used, _cost(trs[n]))]
                    n += 1
                into.append(estimate(shuffled[:n], [tr.reward for tr in trs[:n]]))
                spent[arm].append(tuple(used))
        per["GRPO equal tokens"].append(by_tokens)
        per["GRPO equal tool calls"].append(by_calls)
        print(f"replicate {r + 1}: cosine " + ", ".join(
            f"{arm} {cosine(sum(per[arm][-1]), sum(reference)):+.3f}" for arm in ARMS), flush=True)

    # Gram matrices: every cosine of a resample is a sum over them
    ref_gram = np.array([[a @ b for b in reference] for a in reference])
    grams = {arm: [(np.array([[a @ b for b in rep] for a in rep]), np.array([[a @ b for b in reference] for a in rep]))
                   for rep in per[arm]] for arm in ARMS}

    def cos_of(arm: str, reps: list[int], tasks: list[int]) -> float:
        idx = np.asarray(tasks)
        ref_norm = np.sqrt(ref_gram[np.ix_(idx, idx)].sum())
        values = []
        for r in reps:
            own_gram, cross = grams[arm][r]
            values.append(cross[np.ix_(idx, idx)].sum() / (np.sqrt(own_gram[np.ix_(idx, idx)].sum()) * ref_norm
                                                            + 1e-30))
        return float(np.mean(values))

    rng = random.Random(0)
    all_reps, all_tasks = list(range(args.replicates)), list(range(args.tasks))
    draws = [([rng.randrange(args.replicates) for _ in all_reps], [rng.randrange(args.tasks) for _ in all_tasks])
             for _ in range(args.resamples)]

    def ci(stat) -> tuple[float, float, float]:
        values = sorted(stat(reps, tasks) for reps, tasks in draws)
        return stat(all_reps, all_tasks), values[int(0.025 * (len(values) - 1))], values[int(0.975 * (len(values)
                                                                                                      - 1))]

    results = {arm: ci(lambda reps, tasks, a=arm: cos_of(a, reps, tasks)) for arm in ARMS}
    diffs = {arm: ci(lambda reps, tasks, a=arm: cos_of("ARPO", reps, tasks) - cos_of(a, reps, tasks))
             for arm in ARMS[1:]}
    wall = time.perf_counter() - started

    def mean_spent(arm: str, i: int) -> float:
        return float(np.mean([s[i] for s in spent[arm]]))

    lines = [f"{args.tasks} held-out tasks ({dataset}); reference {args.ref_samples} GRPO samples per task; "
             f"{args.replicates} replicates, M={args.M}; weights: the last block's o_proj and down_proj "
             f"({sum(w.numel() for w in weights) / 1e6:.1f} M); {wall / 60:.0f} min", "",
             f"reference split-half cosine {split:.3f}; reliability of the full reference (Spearman-Brown) "
             f"{reliability:.3f}", "",
             "| estimate | cosine to the reference (95 % CI) | ARPO minus this (95 % CI) | tokens per task | "
             "tool calls per task |", "|---|---|---|---:|---:|"]
    for arm in ARMS:
        diff = "—" if arm == "ARPO" else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*diffs[arm])
        lines.append(f"| {arm} | {results[arm][0]:.3f} [{results[arm][1]:.3f}, {results[arm][2]:.3f}] | {diff} | "
                     f"{mean_spent(arm, 0):.0f} | {mean_spent(arm, 1):.1f} |")
    lines += ["", "| rollout | mean reward | groups with varied rewards |", "|---|---:|---:|"]
    for arm, seen in groups.items():
        lines.append(f"| {arm.removesuffix(' equal trajectories')} | {np.mean([r for g in seen for r in g]):.3f} | "
                     f"{np.mean([len(set(g)) > 1 for g in seen]):.0%} |")
    table = "\n".join(lines)
    (out / "gradient_quality.md").write_text(table + "\n")
    (out / "gradient_quality.json").write_text(json.dumps({
        "split_half": split, "reliability": reliability, "cosine": results, "arpo_minus": diffs,
        "spent": {a: spent[a] for a in ARMS}, "args": vars(args), "wall_s": wall}, indent=1))
    plot(results, diffs, out / "gradient_quality.png")
    print("\n" + table)
    print(f"\ntable, numbers and plot in {out}/")
    d, lo, hi = diffs["GRPO equal tokens"]
    d2, lo2, hi2 = diffs["ARPO beta 0"]
    print(f"cosine ARPO-GRPO {d:.3f} CI {lo:.3f} {hi:.3f}; ARPO-random {d2:.3f} CI {lo2:.3f} {hi2:.3f} "
          f"over {args.replicates} replicates")


def _cost(trajectory) -> tuple[int, int]:
    return sum(trajectory.mask), sum(1 for s in trajectory.segments if s["kind"] == "tool")


def plot(results: dict, diffs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, data, title in ((left, results, "cosine to the reference gradient"),
                            (right, diffs, "ARPO minus each (paired)")):
        names = list(data)
        est = [data[n][0] for n in names]
        ax.errorbar(range(len(names)), est, yerr=[[e - data[n][1] for e, n in zip(est, names)],
                                                  [data[n][2] - e for e, n in zip(est, names)]], fmt="o", capsize=4)
        ax.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_title(title + " (95 % CI)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
