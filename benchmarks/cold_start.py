"""Before and after the cold start: format-valid rate, tool-call rate and accuracy of SmolLM2-135M-Instruct.

    python benchmarks/cold_start.py [--data-dir ../shared/data/eval] [--gsm8k 50] [--procedural 30]

Runs the SFT recipe (`examples/recipes/smollm2_sft_cpu.yaml`) first when its output is missing, then plays
held-out procedural arithmetic tasks (seed 2; SFT used seed 1) and the first GSM8K test questions as real episodes
(greedy decoding, the local Python sandbox) with the model before and after SFT, and prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def evaluate(model: str, env_kwargs: dict, n_tasks: int, max_new_tokens: int, label: str) -> dict[str, float]:
    import gymnasium as gym
    from tqdm.auto import tqdm

    import arpo_env  # noqa: F401
    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.generation.models import generation_device, load_model
    from arpo_algo.rollout.scheduler import GRPORollout

    loaded, tokenizer = load_model(model, device=generation_device())  # the GPU where there is one
    config = RolloutConfig(num_generations=1, num_global=1, max_new_tokens=max_new_tokens,
                           max_completion_tokens=3 * max_new_tokens, temperature=0.0, branching=False)
    with tqdm(total=n_tasks, desc=label, unit="episode") as bar:
        engine = GRPORollout(HFGenerator(loaded, tokenizer), lambda: gym.make("ARPO-Math-v0", **env_kwargs).unwrapped,
                             config, progress=bar.update)
        trees = engine.run(list(range(n_tasks)))  # one generation batch: every episode advances together
    trajectories = [t for tree in trees for t in tree.trajectories]
    n = len(trajectories)
    return {"format valid": sum(bool(t.reward_parts.get("format_ok")) for t in trajectories) / n,
            "used a tool": sum(t.tool_calls > 0 for t in trajectories) / n,
            "accuracy": sum(bool(t.reward_parts.get("correct")) for t in trajectories) / n,
            "tool calls / episode": sum(t.tool_calls for t in trajectories) / n}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sft-recipe", default=str(ROOT / "examples/recipes/smollm2_sft_cpu.yaml"))
    parser.add_argument("--sft-model", default=str(ROOT / "runs/smollm2-sft"), help="SFT output (made if missing)")
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/eval"), help="folder with gsm8k/")
    parser.add_argument("--gsm8k", type=int, default=50)
    parser.add_argument("--procedural", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per turn")
    args = parser.parse_args()

    if not (Path(args.sft_model) / "config.json").is_file():
        from arpo_algo.training.sft import run_sft_recipe

        print(f"no SFT model at {args.sft_model}: running {args.sft_recipe} first", file=sys.stderr)
        run_sft_recipe(args.sft_recipe, output_dir=args.sft_model)
    suites = {f"procedural (held out, {args.procedural})": ({"dataset": f"arithmetic:{args.procedural}:2"},
                                                              args.procedural)}
    if (Path(args.data_dir) / "gsm8k").is_dir():
        suites[f"GSM8K (first {args.gsm8k})"] = ({"dataset": "gsm8k", "data_dir": args.data_dir}, args.gsm8k)
    else:
        print(f"GSM8K skipped: no gsm8k/ under {args.data_dir} (give --data-dir)", file=sys.stderr)
    rows = []
    for suite, (env_kwargs, n) in suites.items():
        for stage, model in (("before SFT", args.model), ("after SFT", args.sft_model)):
            rows.append((suite, stage, evaluate(model, env_kwargs, n, args.max_new_tokens, f"{suite} {stage}")))
    metrics = list(rows[0][2])
    print("\n| tasks | model | " + " | ".join(metrics) + " |")
    print("|---|---|" + "---|" * len(metrics))
    for suite, stage, values in rows:
        cells = [f"{values[m]:.0%}" if m != "tool calls / episode" else f"{values[m]:.2f}" for m in metrics]
        print(f"| {suite} | {stage} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
