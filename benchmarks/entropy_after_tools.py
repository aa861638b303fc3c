"""The paper's observation on SmolLM2: token entropy right after a tool result vs at the start of the response.

    python benchmarks/entropy_after_tools.py [--episodes 32] [-k 20] [--out benchmarks/entropy_after_tools.png]

For each task, the scripted teacher runs its Python call in the real sandbox. The untouched SmolLM2-135M-Instruct
then generates k tokens twice: at the start of its response (context: the prompt), and right after the tool result
(context: prompt, the call, the ``<result>``). The generator records the exact normalised entropy (full
distribution, divided by ln|V|) of each generated token. The script prints the mean by token position for both
windows, the overall means and their ratio, and saves the curves as a PNG.
"""

from __future__ import annotations

import argparse
import statistics

import gymnasium as gym

import arpo_env  # noqa: F401
from arpo_algo.generator import SamplingParams
from arpo_algo.hf_generator import HFGenerator
from arpo_algo.models import load_model, prompt_ids
from arpo_env.procedural import arithmetic_tasks, scripted_episode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/entropy_after_tools.png")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    generator = HFGenerator(model, tokenizer)
    generator.seed(args.seed)
    env = gym.make("ARPO-Math-v0").unwrapped
    starts, afters = [], []
    for task in arithmetic_tasks(args.episodes, seed=args.seed + 50):
        episode = scripted_episode(env, task)
        prompt = prompt_ids(tokenizer, episode["messages"])
        action, observation = episode["segments"][0][1], episode["segments"][1][1]
        starts.append(generator.new_path(prompt))
        afters.append(generator.new_path(prompt + tokenizer.encode(action + observation, add_special_tokens=False)))
    env.close()
    params = SamplingParams(max_new_tokens=args.k, temperature=1.0, entropy_k=args.k)
    start_segments = generator.generate(starts, params)
    after_segments = generator.generate(afters, params)

    def by_position(segments):
        return [statistics.mean(s.entropies[i] for s in segments if len(s.entropies) > i)
                for i in range(args.k) if any(len(s.entropies) > i for s in segments)]

    start_curve, after_curve = by_position(start_segments), by_position(after_segments)
    start_mean = statistics.mean(e for s in start_segments for e in s.entropies)
    after_mean = statistics.mean(e for s in after_segments for e in s.entropies)
    print(f"{args.model}, {args.episodes} episodes, first {args.k} generated tokens, entropy / ln|V|\n")
    print("| token | start of response | after tool result |")
    print("|---:|---:|---:|")
    for i, (a, b) in enumerate(zip(start_curve, after_curve), 1):
        print(f"| {i} | {a:.4f} | {b:.4f} |")
    print(f"\nmean entropy: start {start_mean:.4f}, after tool result {after_mean:.4f} "
          f"(after / start = {after_mean / start_mean:.2f}x)")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(start_curve) + 1), start_curve, marker="o", label="start of response")
    ax.plot(range(1, len(after_curve) + 1), after_curve, marker="s", label="after a tool result")
    ax.set_xlabel("generated token position")
    ax.set_ylabel("entropy / ln |V|")
    ax.set_title(f"{args.model}: entropy of the first {args.k} tokens ({args.episodes} episodes)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")


if __name__ == "__main__":
    main()
