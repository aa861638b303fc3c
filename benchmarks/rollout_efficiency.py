"""ARPO vs GRPO at equal M on the same tasks and model: tokens generated, tokens encoded, tool calls, wall time.

    python benchmarks/rollout_efficiency.py [--tasks 4] [-M 8] [-N 4]

Both algorithms run through the same engine and the transformers generator, with the same seed. ARPO's branches
share their prefix with the path they split from: the prompt and everything up to the tool result are neither
generated nor encoded again (the branch starts from its parent's key/value cache). GRPO samples M independent
trajectories. The model is SmolLM2-135M-Instruct after a short imitation warm-up on scripted arithmetic episodes
(`benchmarks/_warmup.py`), so that it calls tools at all; the tasks are held-out arithmetic problems.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
from _warmup import warmed_model

import arpo_env  # noqa: F401
from arpo_algo.hf_generator import HFGenerator
from arpo_algo.rollout import ARPORollout, GRPORollout, RolloutConfig


def run(cls, model, tokenizer, tasks, config):
    generator = HFGenerator(model, tokenizer)
    engine = cls(generator, lambda: gym.make("ARPO-Math-v0", dataset="arithmetic:1000:777").unwrapped, config)
    start = time.perf_counter()
    trees = engine.run(tasks)
    wall = time.perf_counter() - start
    trajectories = [t for tree in trees for t in tree.trajectories]
    return {
        "generated": generator.stats.generated_tokens,
        "encoded": generator.stats.prefill_tokens,
        "tool calls": engine.tool_calls,
        "wall s": wall,
        "branches": sum(tree.branches for tree in trees),
        "trajectories": len(trajectories),
        "mean reward": sum(t.reward for t in trajectories) / len(trajectories),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("-M", "--num-generations", type=int, default=8)
    parser.add_argument("-N", "--num-global", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model, tokenizer = warmed_model()
    config = RolloutConfig(num_generations=args.num_generations, num_global=args.num_global,
                           max_new_tokens=args.max_new_tokens, max_completion_tokens=512, seed=args.seed)
    tasks = list(range(args.tasks))
    arpo = run(ARPORollout, model, tokenizer, tasks, config)
    grpo = run(GRPORollout, model, tokenizer, tasks, config)

    print(f"\n{args.tasks} tasks, M={args.num_generations}, N={args.num_global}, Z={config.branch_factor}, "
          f"alpha={config.alpha}, beta={config.beta}, seed={args.seed}\n")
    print("| metric | ARPO | GRPO | ARPO / GRPO |")
    print("|---|---:|---:|---:|")
    for key in ("generated", "encoded", "tool calls", "wall s", "branches", "trajectories", "mean reward"):
        a, g = arpo[key], grpo[key]
        ratio = f"{a / g:.2f}" if g and key not in ("branches", "mean reward") else "—"
        fmt = "{:.2f}" if isinstance(a, float) else "{}"
        print(f"| {key} | {fmt.format(a)} | {fmt.format(g)} | {ratio} |")
    saved_gen = 1 - arpo["generated"] / grpo["generated"]
    saved_enc = 1 - arpo["encoded"] / grpo["encoded"]
    print(f"\nARPO generated {saved_gen:.0%} fewer tokens and encoded {saved_enc:.0%} fewer tokens than GRPO "
          f"for the same {arpo['trajectories']} trajectories.")


if __name__ == "__main__":
    main()
