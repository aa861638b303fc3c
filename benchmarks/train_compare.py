"""The experiment: does ARPO learn more per tool call than GRPO? GRPO, ARPO and ARPO with β = 0 (random branching),
from one cold start, over seeds, scored on held-out tasks sampled at T = 1, with intervals.

    python benchmarks/train_compare.py                      # preset h200 on a GPU (within 9 minutes), cpu without
    python benchmarks/train_compare.py --preset cpu         # the laptop cold start on noisy arithmetic: about an hour
    python benchmarks/train_compare.py --quick              # preset cpu, 32 held-out tasks, 2 steps: ~20 minutes, 17 GB
    python benchmarks/train_compare.py --preset tiny        # the dry run of the GPU preset on a CPU: about a minute
    python benchmarks/train_compare.py --traces traces.jsonl  # teacher traces made elsewhere (arpo_algo.training.sft)

Presets:
* **h200**: a Llama of 384 hidden units and 6 layers built from a config and trained from scratch (SFT) on 3,000
  teacher traces of noisy chains (`noisy:2`: two operations, a quarter of the results faulty, which the teacher
  notices and runs again), then 12 steps of each arm × 3 seeds, 16 tasks × M = 8 a step; 128 held-out tasks × 4
  samples. Nothing is downloaded: the tokenizer is SmolLM2's (the embedded package, or ``--tokenizer`` a folder)
  and the traces are played by the scripted teacher in the real sandbox (or read from ``--traces``).
* **cpu**: SmolLM2-135M-Instruct after the laptop cold start (`benchmarks/_policy.py`, noisy arithmetic), 4 steps
  of each arm × 1 seed, 2 tasks × M = 4 a step (the main job's sizes); 128 held-out tasks × 2 samples.
* **tiny**: the h200 preset's machinery at toy size, for the test suite.

What is measured:
1. **Held-out accuracy**: held-out tasks of seed 99, several samples each at T = 1; a task's accuracy is the share of
   its samples that answer right (format valid and correct). Measured on the cold start once, then every
   ``eval_every`` steps of every run.
2. **Runs**: for each seed and arm, `ARPOTrainer` (TRL's GRPOTrainer underneath) from the cold start, the same tasks
   per step and the same M; only the algorithm and β change. Training reward is not compared: ARPO's groups are
   branched from format-valid prefixes, so its training reward is higher before any learning. Each step logs the
   tool calls it ran (a shared prefix's once), so accuracy is read against cumulative tool calls as well as steps.

After every step and every evaluation one line goes to ``OUT/partial.jsonl``, so a run cut short keeps what it did.
At the end: ``OUT/train_compare.md`` (held-out accuracy per arm at the start and the end, each with a 95 % bootstrap
interval over tasks and seeds; the paired change from the cold start and the paired difference between arms) and
``OUT/train_compare.png`` (accuracy against steps and against cumulative tool calls). The last line reads
``heldout accuracy grpo <a> arpo <b> arpo-beta0 <c>; ARPO-GRPO <d> CI <lo> <hi> over <n> seeds``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from _stats import cluster_bootstrap, mean

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"grpo": {"algorithm": "grpo"}, "arpo": {"algorithm": "arpo", "branch_beta": 0.2},
        "arpo-beta0": {"algorithm": "arpo", "branch_beta": 0.0}}
PRESETS = {
    "h200": dict(hidden=384, layers=6, traces=3000, sft_epochs=3, sft_batch=32, sft_lr=1e-3, seeds=[0, 1, 2],
                 steps=12, tasks_per_step=16, M=8, lr=2e-5, eval_tasks=128, eval_samples=4, eval_every=4,
                 max_new_tokens=48, max_completion=512, family="noisy:2"),
    "cpu": dict(model="cold start", seeds=[0], steps=4, tasks_per_step=2, M=4, lr=1e-5, eval_tasks=128,
                eval_samples=2, eval_every=4, max_new_tokens=64, max_completion=320, family="arithmetic:3:40"),
    "tiny": dict(hidden=32, layers=2, traces=8, sft_epochs=1, sft_batch=4, sft_lr=1e-3, seeds=[0], steps=1,
                 tasks_per_step=2, M=4, lr=1e-4, eval_tasks=3, eval_samples=2, eval_every=1, max_new_tokens=12,
                 max_completion=160, family="noisy:2"),
}


class Log:
    """``OUT/partial.jsonl``: one line per event, written and flushed as it happens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict] = []
        path.write_text("")

    def __call__(self, **row) -> None:
        row["time_s"] = round(time.perf_counter() - START, 1)
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


START = time.perf_counter()


def build_model(tokenizer, hidden: int, layers: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=max(2, hidden // 64),
                         num_key_value_heads=max(1, hidden // 128), max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    return LlamaForCausalLM(config)


def teacher_traces(args) -> list[dict]:
    if args.traces:
        return [json.loads(line) for line in Path(args.traces).read_text().splitlines() if line.strip()]
    from arpo_algo.training.sft import synthetic_records

    return synthetic_records(args.p["traces"], seed=1, family=args.p["family"], progress=True)


def sft(model, tokenizer, records: list[dict], p: dict, device: str, log: Log) -> None:
    """Next-token loss on the teacher's own tokens (prompt and tool output masked), AdamW, cosine decay."""
    from arpo_algo.training.sft import tokenize

    rows = [tokenize(r, tokenizer) for r in records]
    data = [(r["input_ids"], [t if m else -100 for t, m in zip(r["input_ids"], r["assistant_masks"])]) for r in rows]
    steps = max(1, p["sft_epochs"] * len(data) // p["sft_batch"])
    opt = torch.optim.AdamW(model.parameters(), lr=p["sft_lr"], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, p["sft_lr"], total_steps=steps, pct_start=0.05)
    rng = random.Random(0)
    model.train()
    for step in range(steps):
        batch = rng.sample(data, min(p["sft_batch"], len(data)))
        width = max(len(i) for i, _ in batch)
        ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in batch], device=device)
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch], device=device)
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i, _ in batch], device=device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            print(f"cold start: step {step + 1}/{steps} loss {loss.item():.3f}", flush=True)
            log(event="sft", step=step + 1, steps=steps, loss=loss.item())
    model.eval()


def heldout(model, tokenizer, p: dict, dataset: str) -> list[float]:
    """Each held-out task's share of right answers over its samples at T = 1."""
    import gymnasium as gym

    from arpo_algo.core.config import RolloutConfig
    from arpo_algo.generation.hf_generator import HFGenerator
    from arpo_algo.rollout.scheduler import GRPORollout

    was_training = model.training
    model.eval()
    generator = HFGenerator(model, tokenizer)
    config = RolloutConfig(num_generations=p["eval_samples"], temperature=1.0, max_new_tokens=p["max_new_tokens"],
                           max_completion_tokens=p["max_completion"], seed=12345)
    engine = GRPORollout(generator, lambda: gym.make("ARPO-Math-v0", dataset=dataset, max_tool_calls=6).unwrapped,
                         config)
    try:
        trees = engine.run(list(range(p["eval_tasks"])))
    finally:
        generator.close()
    model.train(was_training)
    return [mean([float(tr.reward_parts.get("format_ok", False) and tr.reward_parts.get("score", 0) >= 1)
                  for tr in tree.trajectories])
            for tree in trees]


def train_arm(arm: str, seed: int, cold: Path, tokenizer, p: dict, device: str, out: Path, log: Log,
              train_spec: str, eval_spec: str) -> None:
    from transformers import AutoModelForCausalLM, TrainerCallback

    from arpo_algo.training.config import ARPOConfig
    from arpo_algo.training.trainer import ARPOTrainer
    from arpo_env.integrations.trl_dataset import task_dataset

    model = AutoModelForCausalLM.from_pretrained(cold).to(device)
    spent = {"tool_calls": 0.0}

    class Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                spent["tool_calls"] += logs.get("arpo/tool_calls", 0.0)
                log(event="step", arm=arm, seed=seed, step=state.global_step, reward=logs["reward"],
                    tool_calls=spent["tool_calls"], tokens=logs.get("arpo/tokens_generated"),
                    varied=1 - logs.get("frac_reward_zero_std", 0.0))
                print(f"{arm} seed {seed}: step {state.global_step}/{p['steps']} reward {logs['reward']:+.3f} "
                      f"tool calls so far {spent['tool_calls']:.0f}", flush=True)

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % p["eval_every"] == 0 or state.global_step == p["steps"]:
                per_task = heldout(kw["model"], tokenizer, p, eval_spec)
                log(event="eval", arm=arm, seed=seed, step=state.global_step, tool_calls=spent["tool_calls"],
                    per_task=per_task, accuracy=mean(per_task))
                print(f"{arm} seed {seed}: held-out accuracy {mean(per_task):.3f} at step {state.global_step}",
                      flush=True)

    config = ARPOConfig(output_dir=str(out / f"{arm}-seed{seed}"), num_generations=p["M"], num_global=p["M"] // 2,
                        per_device_train_batch_size=p["M"] * p["tasks_per_step"], gradient_accumulation_steps=1,
                        max_steps=p["steps"], learning_rate=p["lr"], max_new_tokens_per_turn=p["max_new_tokens"],
                        max_completion_length=p["max_completion"], temperature=1.0, beta=0.0, logging_steps=1,
                        report_to="none", save_strategy="no", seed=seed, env_id="ARPO-Math-v0",
                        env_kwargs={"dataset": train_spec, "max_tool_calls": 6}, use_cpu=device == "cpu",
                        bf16=device == "cuda", gradient_checkpointing=False, **ARMS[arm])
    trainer = ARPOTrainer(model, args=config, train_dataset=task_dataset("ARPO-Math-v0", dataset=train_spec),
                          processing_class=tokenizer, callbacks=[Progress()])
    trainer.train()
    del trainer, model
    if device == "cuda":
        torch.cuda.empty_cache()


def report(log: Log, arms: list[str], seeds: list[int], out: Path, resamples: int) -> str:
    start = next(r["per_task"] for r in log.rows if r["event"] == "eval" and r["arm"] == "cold start")
    final = {}
    for arm in arms:
        for seed in seeds:
            evals = [r for r in log.rows if r["event"] == "eval" and r["arm"] == arm and r["seed"] == seed]
            if evals:
                final[arm, seed] = evals[-1]["per_task"]
    tasks = range(len(start))
    clusters = [(seed, t) for seed in seeds for t in tasks]

    def acc(arm: str):
        return lambda sample: mean([final[arm, s][t] for s, t in sample if (arm, s) in final])

    lines = [f"held-out accuracy (share of right answers, {len(start)} tasks); 95 % bootstrap over tasks and seeds "
             f"{', '.join(map(str, seeds))}", "",
             "| arm | end of training | change from the cold start (paired) | tool calls in training (mean) |",
             "|---|---|---|---:|"]
    s0 = cluster_bootstrap(list(tasks), lambda sample: mean([start[t] for t in sample]), resamples)
    lines.append(f"| cold start | {s0[0]:.3f} [{s0[1]:.3f}, {s0[2]:.3f}] | — | 0 |")
    results = {}
    for arm in arms:
        if not any(a == arm for a, _ in final):
            continue
        end = cluster_bootstrap(clusters, acc(arm), resamples)
        gain = cluster_bootstrap(clusters, lambda sample, a=arm: mean([final[a, s][t] - start[t] for s, t in sample
                                                                       if (a, s) in final]), resamples)
        calls = mean([r["tool_calls"] for r in log.rows if r["event"] == "eval" and r["arm"] == arm
                      and r["step"] == max(x["step"] for x in log.rows if x["event"] == "eval" and x["arm"] == arm)])
        results[arm] = end
        lines.append(f"| {arm} | {end[0]:.3f} [{end[1]:.3f}, {end[2]:.3f}] | {gain[0]:+.3f} [{gain[1]:+.3f}, "
                     f"{gain[2]:+.3f}] | {calls:.0f} |")
    diff = (math.nan, math.nan, math.nan)
    if "arpo" in results and "grpo" in results:
        diff = cluster_bootstrap(clusters, lambda sample: mean([final["arpo", s][t] - final["grpo", s][t]
                                                                for s, t in sample if ("arpo", s) in final
                                                                and ("grpo", s) in final]), resamples)
        lines += ["", f"ARPO − GRPO at the end, paired by seed and task: {diff[0]:+.3f} [{diff[1]:+.3f}, "
                      f"{diff[2]:+.3f}]"]
    plot(log, arms, out / "train_compare.png")
    table = "\n".join(lines)
    (out / "train_compare.md").write_text(table + "\n")
    print("\n" + table, flush=True)
    get = {arm: results.get(arm, (math.nan,))[0] for arm in ARMS}
    return (f"heldout accuracy grpo {get['grpo']:.3f} arpo {get['arpo']:.3f} arpo-beta0 {get['arpo-beta0']:.3f}; "
            f"ARPO-GRPO {diff[0]:.3f} CI {diff[1]:.3f} {diff[2]:.3f} over {len(seeds)} seeds")


def plot(log: Log, arms: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = next(r for r in log.rows if r["event"] == "eval" and r["arm"] == "cold start")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for arm in arms:
        evals = [r for r in log.rows if r["event"] == "eval" and r["arm"] == arm]
        steps = sorted({r["step"] for r in evals})
        if not steps:
            continue
        ys = [start["accuracy"]] + [mean([r["accuracy"] for r in evals if r["step"] == s]) for s in steps]
        calls = [0.0] + [mean([r["tool_calls"] for r in evals if r["step"] == s]) for s in steps]
        axes[0].plot([0] + steps, ys, marker="o", label=arm)
        axes[1].plot(calls, ys, marker="o", label=arm)
    axes[0].set(xlabel="training step", ylabel="held-out accuracy (mean over seeds)")
    axes[1].set(xlabel="tool calls run in training (cumulative)", ylabel="held-out accuracy")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(PRESETS), default=None, help="h200 with a GPU, cpu without")
    parser.add_argument("--quick", action="store_true", help="preset cpu with 32 held-out tasks and 2 steps")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default: the preset's")
    parser.add_argument("--steps", type=int, default=None, help="default: the preset's")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="a tokenizer folder, or the embedded name")
    parser.add_argument("--traces", default=None, help="JSONL teacher traces (default: played here)")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--out", default=None, help="runs/train_compare-PRESET")
    args = parser.parse_args(argv)
    args.preset = args.preset or ("cpu" if args.quick or not torch.cuda.is_available() else "h200")
    args.p = dict(PRESETS[args.preset])
    if args.quick:
        args.p.update(eval_tasks=32, steps=2, eval_every=2)
    args.p.update({k: v for k, v in (("seeds", args.seeds), ("steps", args.steps)) if v is not None})
    p = args.p
    out = Path(args.out or ROOT / f"runs/train_compare-{args.preset}{'-quick' if args.quick else ''}")
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "partial.jsonl")
    device = "cuda" if torch.cuda.is_available() else "cpu"

    from transformers import AutoModelForCausalLM

    import arpo_env  # noqa: F401
    from arpo_algo.generation.models import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    name, _, level = p["family"].partition(":")
    train_spec, eval_spec = f"{name}:5000:0:{level}", f"{name}:{p['eval_tasks']}:99:{level}"
    if p.get("model") == "cold start":  # the laptop cold start, made once by `arpo sft`
        from _policy import cold_start

        cold = cold_start(p["family"])
        model = AutoModelForCausalLM.from_pretrained(cold).to(device)
    else:
        records = teacher_traces(args)
        log(event="traces", count=len(records))
        model = build_model(tokenizer, p["hidden"], p["layers"]).to(device)
        print(f"model: {sum(w.numel() for w in model.parameters()) / 1e6:.1f} M weights on {device}; "
              f"{len(records)} teacher traces", flush=True)
        sft(model, tokenizer, records, p, device, log)
        cold = out / "cold-start"
        model.save_pretrained(cold)
        tokenizer.save_pretrained(cold)
    per_task = heldout(model, tokenizer, p, eval_spec)
    log(event="eval", arm="cold start", seed=None, step=0, tool_calls=0.0, per_task=per_task, accuracy=mean(per_task))
    print(f"cold start: held-out accuracy {mean(per_task):.3f}", flush=True)
    del model
    for seed in p["seeds"]:
        for arm in args.arms:
            train_arm(arm, seed, cold, tokenizer, p, device, out, log, train_spec, eval_spec)
    print(report(log, args.arms, p["seeds"], out, args.resamples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
