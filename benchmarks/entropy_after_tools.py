"""The paper's observation, measured: token entropy right after a tool result vs at the start of the response.

    python benchmarks/entropy_after_tools.py [--episodes 24] [-k 20]
        [--models smollm2-135m runs/experiment/cold-start-chain3] [--data-dir ../shared/data/eval]
        [--out runs/entropy_after_tools.png]

Suites, each with real tool output in the context:
* **gsm8k** — GSM8K test questions; the first calculation of the reference solution (its ``<<48/2=24>>``
  annotation) is run as a Python call in the real sandbox;
* **qa** — HotpotQA questions; the question is searched in the shipped corpus (BM25), and the observation is the
  real search result;
* **chain** — the procedural chained word problems (`arpo_env.datasets.procedural`): the teacher's first call.

For each model and episode, the model generates k tokens twice (temperature 1): at the start of its response
(context: the prompt) and right after the tool result (context: prompt, the call, the result). The generator records
the exact normalised entropy (full distribution, divided by ln|V|) of each generated token. Printed: the mean per
suite and model for both windows and their ratio; saved: the mean-by-position curves, one panel per suite.
A model folder that does not exist (the cold start before it is made) is skipped with a note.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

import gymnasium as gym
from tqdm import tqdm

import arpo_env  # noqa: F401
from arpo_algo.generation.hf_generator import HFGenerator
from arpo_algo.generation.models import generation_device, load_model, prompt_ids
from arpo_algo.generation.protocol import SamplingParams

ROOT = Path(__file__).resolve().parents[1]


def episodes(suite: str, n: int, data_dir: str) -> list[tuple[list[dict], str, str]]:
    """(prompt messages, the agent's tool call, the real observation) for `n` tasks of `suite`."""
    from arpo_env.datasets.procedural import teacher_action

    out = []
    if suite == "gsm8k":  # the reference solutions' calculator annotations are in the raw records
        import json

        env = gym.make("ARPO-Math-v0", dataset="gsm8k", data_dir=data_dir).unwrapped
        first_step = {}
        with open(Path(data_dir) / "gsm8k" / "test.jsonl", encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                found = re.search(r"<<([^=>]+)=", record["answer"])
                if found:
                    first_step[record["question"].strip()] = found.group(1)
        calls = [(task, f"<think>First I compute {first_step[task.question]}.</think>\n"
                        f"<python>print({first_step[task.question]})</python>")
                 for task in env.tasks if task.question in first_step][:n]
    elif suite == "qa":
        env = gym.make("ARPO-QA-v0", dataset="hotpotqa", data_dir=data_dir).unwrapped
        calls = [(task, f"<think>I will search for this.</think>\n<search>{task.question}</search>")
                 for task in env.tasks[:n]]
    else:
        env = gym.make("ARPO-Math-v0", dataset=f"chain:{n}:77:2").unwrapped
        calls = [(task, teacher_action(task, [])) for task in env.tasks]
    try:
        for task, action in calls:
            _, info = env.reset(options={"question": task.question, "answer": task.answer, "kind": task.kind})
            observation, *_ = env.step(action)
            out.append((info["messages"], action, observation))
    finally:
        env.close()
    return out


def measure(model_name: str, suites: dict[str, list], k: int, seed: int) -> dict[str, dict]:
    model, tokenizer = load_model(model_name, device=generation_device())  # the GPU where there is one
    generator = HFGenerator(model, tokenizer)
    generator.seed(seed)
    params = SamplingParams(max_new_tokens=k, temperature=1.0, entropy_k=k)
    results = {}
    for suite, eps in tqdm(suites.items(), desc=f"{Path(model_name).name}: suites", unit="suite"):
        starts, afters = [], []
        for messages, action, observation in eps:
            prompt = prompt_ids(tokenizer, messages)
            starts.append(generator.new_path(prompt))
            afters.append(generator.new_path(prompt + tokenizer.encode(action + observation,
                                                                       add_special_tokens=False)))
        start, after = generator.generate(starts, params), generator.generate(afters, params)
        results[suite] = {"start": [s.entropies for s in start], "after": [s.entropies for s in after]}
    return results


def curve(entropies: list[list[float]], k: int) -> list[float]:
    return [statistics.mean(e[i] for e in entropies if len(e) > i) for i in range(k)
            if any(len(e) > i for e in entropies)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("-k", type=int, default=20)
    parser.add_argument("--models", nargs="+",
                        default=["smollm2-135m", str(ROOT / "runs/experiment/cold-start-chain3")])
    parser.add_argument("--suites", nargs="+", default=["gsm8k", "qa", "chain"])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared/data/eval"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/entropy_after_tools.png")
    args = parser.parse_args()

    suites = {s: episodes(s, args.episodes, args.data_dir) for s in args.suites}
    models = [m for m in args.models if m == "smollm2-135m" or Path(m).exists()]
    for m in set(args.models) - set(models):
        print(f"skipped {m}: not found (python benchmarks/train_compare.py makes the cold start)")
    results = {m: measure(m, suites, args.k, args.seed) for m in models}

    print(f"\nfirst {args.k} generated tokens, entropy / ln|V|, {args.episodes} episodes per suite\n")
    print("| suite | model | start of response | after tool result | after / start |")
    print("|---|---|---:|---:|---:|")
    for suite in suites:
        for m in models:
            r = results[m][suite]
            start = statistics.mean(e for es in r["start"] for e in es)
            after = statistics.mean(e for es in r["after"] for e in es)
            print(f"| {suite} | {Path(m).name} | {start:.4f} | {after:.4f} | {after / start:.2f}x |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(suites), figsize=(5 * len(suites), 3.8), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        for m in models:
            r = results[m][suite]
            line, = ax.plot(range(1, args.k + 1)[:len(curve(r["start"], args.k))], curve(r["start"], args.k),
                            linestyle="--", label=f"{Path(m).name}: start")
            ax.plot(range(1, args.k + 1)[:len(curve(r["after"], args.k))], curve(r["after"], args.k),
                    color=line.get_color(), label=f"{Path(m).name}: after tool")
        ax.set_title(suite)
        ax.set_xlabel("generated token position")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("entropy / ln |V|")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"plot saved to {args.out}")


if __name__ == "__main__":
    main()
