"""ARPO vs GRPO at equal M on the same tasks and model: tokens generated and encoded, tool calls, wall time, peak
memory and the share of wall time spent in the environments and tools.

    python benchmarks/rollout_efficiency.py [--tasks 8] [-M 8] [-N 4] [--backend hf] [--schedule continuous]
                                            [--repeats 1] [--seed 0] [--spare-samples 2] [--min-spare-samples 1]
                                            [--speculative-branches]
                                            [--default-kernel] [--family arithmetic] [--device cuda]
                                            [--warmup-steps 8] [--warmup-lr 2e-5]
    python benchmarks/rollout_efficiency.py --family chain:3 --warmup-steps 24 --warmup-lr 5e-5   # 3 calls a task
    .venv-vllm/bin/python benchmarks/rollout_efficiency.py --backend vllm    # vLLM (CPU build or GPU)

Each algorithm runs in its own child process (so that each has its own peak memory), one after the other; with
``--repeats N`` they alternate N times and the run with the median wall time of each is reported (the 2-core machine's
wall times moved by ±15% between runs of identical trees). The last
line reads ``ARPO/GRPO wall <r1> tokens generated <r2> tokens encoded <r3> env share <s>``: the three ratios, and
ARPO's env + tool share of its rollout wall time.

Both algorithms run through the same engine and generator, with the same seed. ARPO's branches share their prefix with
the path they split from: the prompt and everything up to the tool result are neither generated nor encoded again (the
branch starts from its parent's key/value cache, or vLLM's prefix cache). GRPO samples M independent trajectories; they
share only their task's prompt, which both algorithms encode once per task. What is encoded is broken down in rows of
its own: the prompts, the tool results appended to paths, and the notices (the env's answer to a turn without a tool
call: a tag left open when a turn ran out of tokens, a spent budget), which cost tokens like a tool result; "encoded" is
those, plus one token each time a path resumes, less what was appended to paths stopped before they resumed. On the
transformers backend (``--backend hf``) paths join and leave one running batch (continuous batching; ``--schedule
lockstep``: all waiting paths generate in one batch per round; the linear layers run on oneDNN-packed weights,
`arpo_algo.generation.packed_linear`, or with ``--default-kernel`` on PyTorch's default kernel); on vLLM (``--backend vllm``)
every path is its own request, resubmitted the moment its tool result is back, and tool calls overlap generation
(`arpo_algo.rollout`). "env s" is the environments' time on the rollout's critical path (what generation waited for);
"tool s" the env steps' own time, summed, overlapped or not. "decode steps" counts the decoding steps one after the
other (on vLLM, the engine steps that sampled tokens), the rollout's critical path whatever the batch width (its wall
time follows the steps and, less, their width: on a 2-core CPU a step with 16 rows costs about twice one with a single
row, `benchmarks/step_cost.py`); the spare rows are ARPO's spare samples (`RolloutConfig.spare_samples` and
`min_spare_samples`): started, taken as top-ups, and the tokens and tool calls of those it discarded (counted in
"generated" and "tool calls" too); the speculative rows are ARPO's speculative branches (``--speculative-branches``: started with
the segment their decision is taken on, kept if it branches), with the tokens of those dropped (counted in "generated"
too). "longest trajectory" and "mean trajectory" are the model tokens of one trajectory, its shared prefix included: a
trajectory's tokens are sampled one after another, so the longest is a floor under "decode steps" that no schedule can
go below (ARPO's branches are made after tool calls, so its trees hold more of the long, tool-using paths than GRPO's
independent samples). vLLM's engine start-up is not counted, and "peak MB" is the benchmark process's own (vLLM's engine
core runs in a process of its own). On a GPU (``--device cuda``, the default where CUDA is there; transformers
backend) one forward runs before the clock starts, so that CUDA's start-up is not counted either, and "GPU peak MB" is
the most the GPU held. Likewise the environments' per-process start-up (the sandbox's template process, which
imports numpy and sympy, and the scoring workers: about a second, two on a cold disk) runs before the clock, in one
scripted episode of another seed ("env start-up s", not in the wall; ``--cold-env`` leaves it to the rollout's first
tool calls, as before 2026-11-28): a training run pays it once, not every step, and on a GPU, where the first tool
calls come about a second in, whether they found it done decided the env share of a pair (H200: 0.003–0.16 for the
same trees).
The model is SmolLM2-135M-Instruct after a short imitation warm-up on scripted episodes of the task family
(`benchmarks/_warmup.py`), so that it calls tools at all; the tasks are held-out problems of that family
(``--family``, `arpo_env.datasets.procedural`). On ``arithmetic`` one Python call solves a task, so a trajectory makes about
one tool call and a branch shares little; on ``chain:3`` (a number goes through three operations, one call each,
each reading the last one's printed result) a trajectory makes two to three, the regime of the paper (3–6 calls),
and its warm-up needs more steps (24 at 5e-5: at 8 steps at 2e-5 most chain trajectories break the format)."""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import subprocess
import sys
import time

import gymnasium as gym
from _warmup import family_spec, family_tasks, warmed_model, warmed_path, warmed_ready

import arpo_env  # noqa: F401
from arpo_algo.core.config import add_rollout_flags, from_flags
from arpo_algo.rollout.scheduler import ARPORollout, GRPORollout
from arpo_env.datasets.procedural import scripted_episode


def make_generator(backend: str, block_size: int | None = None, schedule: str = "continuous", steps_per_poll: int = 8,
                   default_kernel: bool = False, warm: dict | None = None, device: str = "cpu"):
    """The warmed-up model behind the chosen backend (vLLM loads the same weights from the warm-up's folder, so the
    transformers model is only loaded to make that folder the first time). `warm`: `warmed_model`'s arguments;
    `device`: where the transformers backend runs."""
    warm = warm or {}
    if backend == "hf":
        from arpo_algo.generation.hf_generator import HFGenerator

        model, tokenizer = warmed_model(**warm)
        return HFGenerator(model.to(device), tokenizer, continuous=schedule == "continuous",
                           steps_per_poll=steps_per_poll, packed_weights=False if default_kernel else None)
    if not warmed_ready(**warm):
        warmed_model(**warm)
    return vllm_generator(str(warmed_path(**warm)), block_size)


def vllm_generator(model: str, block_size: int | None = None):
    """vLLM's engine on a model folder as the benchmarks run it: float32, a 2 GiB KV cache on the CPU, eager mode
    there (no CUDA graphs to capture)."""
    import os

    import torch

    from arpo_algo.generation.vllm_generator import VLLMGenerator

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    extra = {} if block_size is None else {"block_size": block_size}
    return VLLMGenerator.from_pretrained(model, dtype="float32", max_model_len=2048, gpu_memory_utilization=0.3,
                                         enforce_eager=not torch.cuda.is_available(), **extra)


def dataset(family: str) -> str:
    """The held-out tasks of a family (seed 777; the warm-up draws from seed 1234)."""
    return family_spec(family, 1000, 777)


def warm_cuda(generator) -> None:
    """On a GPU, one forward before the clock starts: CUDA's start-up (its libraries' handles, the first kernels'
    loading, about a second) is not the rollout's."""
    model = getattr(generator, "model", None)
    if model is None or next(model.parameters()).device.type != "cuda":
        return
    import torch

    with torch.no_grad():
        model(input_ids=torch.ones(2, 8, dtype=torch.long, device="cuda"), use_cache=True)
    torch.cuda.synchronize()


def warm_envs(family: str) -> float:
    """One scripted episode of `family` (a task of another seed) in an env like the rollout's, so that what the envs
    start once per process (the sandbox's template, the scoring workers) is up before the clock; returns its
    seconds."""
    start = time.perf_counter()
    env = gym.make("ARPO-Math-v0", dataset=dataset(family)).unwrapped
    try:
        scripted_episode(env, family_tasks(family, 1, 4321)[0])
    finally:
        env.close()
    return time.perf_counter() - start


def run(cls, generator, tasks, config, family: str = "arithmetic", cold_env: bool = False):
    engine = cls(generator, lambda: gym.make("ARPO-Math-v0", dataset=dataset(family)).unwrapped, config)
    warm_cuda(generator)
    env_startup = 0.0 if cold_env else warm_envs(family)
    start = time.perf_counter()
    trees = engine.run(tasks)
    wall = time.perf_counter() - start
    trajectories = [t for tree in trees for t in tree.trajectories]
    return {
        "generated": generator.stats.generated_tokens,
        "encoded": generator.stats.prefill_tokens,
        "prompt tokens": engine.prompt_tokens,
        "tool result tokens": engine.observation_tokens["tool results"],
        "notices": engine.notices,
        "notice tokens": engine.observation_tokens["notices"],
        "tool calls": engine.tool_calls,
        "wall s": wall,
        "env s": engine.env_seconds,
        "env share": engine.env_seconds / wall,
        "env start-up s": env_startup,
        "tool s": engine.step_seconds,
        "decode steps": generator.stats.decode_steps,
        "branches": sum(tree.branches for tree in trees),
        "top-ups": sum(n.kind == "topup" for tree in trees for n in tree.nodes),
        "spares started": engine.spares["started"],
        "spares taken": engine.spares["taken"],
        "spare tokens discarded": engine.spares["discarded_tokens"],
        "spare tool calls discarded": engine.spares["discarded_tool_calls"],
        "speculative started": engine.speculative["started"],
        "speculative kept": engine.speculative["kept"],
        "speculative tokens discarded": generator.stats.speculative_tokens,
        "trajectories": len(trajectories),
        "longest trajectory": max(sum(t.mask) for t in trajectories),
        "mean trajectory": sum(sum(t.mask) for t in trajectories) / len(trajectories),
        "mean reward": sum(t.reward for t in trajectories) / len(trajectories),
    }


def median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (the lower middle one for an even count)."""
    return sorted(runs, key=lambda r: r["wall s"])[(len(runs) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    add_rollout_flags(parser, skip=("branching", "max_tool_workers"), defaults={"num_generations": 8, "num_global": 4, "max_new_tokens": 64, "max_completion_tokens": 512})
    parser.add_argument("--family", default="arithmetic",
                        help="the procedural tasks, and the warm-up's: arithmetic[:TERMS] (one Python call solves "
                             "a task) or chain[:STEPS] (one call per step, each reading the last one's result)")
    warm = inspect.signature(warmed_model).parameters  # the warm-up's own defaults
    parser.add_argument("--warmup-steps", type=int, default=warm["steps"].default,
                        help="the imitation warm-up's optimizer steps (default %(default)s)")
    parser.add_argument("--warmup-lr", type=float, default=warm["lr"].default,
                        help="the imitation warm-up's learning rate (default %(default)s)")
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--device", default=None,
                        help="transformers backend: where the model runs (default: cuda where there is a GPU, else "
                             "cpu)")
    parser.add_argument("--schedule", choices=["continuous", "lockstep"], default="continuous",
                        help="transformers backend: continuous batching (the default) or lock-step rounds")
    parser.add_argument("--steps-per-poll", type=int, default=8,
                        help="transformers backend, continuous: decoding steps between two looks at the paths "
                             "(a path that ended waits for the poll's end, its tool call overlaps the next poll)")
    parser.add_argument("--default-kernel", action="store_true",
                        help="transformers backend: linear layers on PyTorch's default kernel, not on oneDNN-packed "
                             "weights (arpo_algo.generation.packed_linear)")
    parser.add_argument("--block-size", type=int, default=None,
                        help="vLLM's KV-cache block (tokens); the prefix cache shares whole blocks only")
    parser.add_argument("--cold-env", action="store_true",
                        help="leave the envs' per-process start-up (the sandbox's template, the scoring workers) to "
                             "the rollout's first tool calls, inside the wall (by default it runs before the clock)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each algorithm this many times, alternating, and report the median wall time "
                             "(the trees are the same each time on the transformers backend; the wall times vary)")
    parser.add_argument("--only", choices=["arpo", "grpo"],
                        help="run one arm alone, once, in this process, and print its figures as one RESULT JSON "
                        "line (what the side-by-side run starts for each arm and run)")
    args = parser.parse_args()
    config = from_flags(args)
    tasks = list(range(args.tasks))
    if args.device is None:
        from arpo_algo.generation.models import generation_device

        args.device = generation_device() or "cpu"

    if args.only:
        generator = make_generator(args.backend, args.block_size, args.schedule, args.steps_per_poll,
                                   args.default_kernel,
                                   {"family": args.family, "steps": args.warmup_steps, "lr": args.warmup_lr},
                                   args.device)
        result = run(ARPORollout if args.only == "arpo" else GRPORollout, generator, tasks, config, args.family,
                     args.cold_env)
        generator.close()
        result["peak MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if args.backend == "hf" and args.device.startswith("cuda"):
            import torch

            result["GPU peak MB"] = torch.cuda.max_memory_allocated() / 2**20
        print("RESULT " + json.dumps(result), flush=True)
        return

    runs: dict[str, list[dict]] = {"arpo": [], "grpo": []}
    for repeat in range(args.repeats):
        for algo in ("arpo", "grpo"):
            print(f"=== {algo}" + (f" ({repeat + 1} of {args.repeats})" if args.repeats > 1 else ""), flush=True)
            out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--only", algo], check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            runs[algo].append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    arpo, grpo = (median_run(runs[a]) for a in ("arpo", "grpo"))
    if args.repeats > 1:
        for algo in ("arpo", "grpo"):
            print(f"{algo} wall s per run: " + ", ".join(f"{r['wall s']:.1f}" for r in runs[algo]))

    if args.backend == "vllm":
        block = f" (block size {args.block_size})" if args.block_size else ""
    elif args.schedule == "continuous":
        block = f" (continuous, {args.steps_per_poll} steps a poll)"
    else:
        block = " (lockstep)"
    if args.backend == "hf" and args.default_kernel:
        block = block[:-1] + ", default linear kernel)"
    if args.backend == "hf":
        block = block[:-1] + f", {args.device})"
    print(f"\n{args.backend} backend{block}, {args.tasks} {args.family} tasks, M={args.num_generations}, "
          f"N={args.num_global}, Z={config.branch_factor}, "
          f"alpha={config.alpha}, beta={config.beta}, "
          f"spare samples={config.min_spare_samples}-{config.spare_samples}, "
          f"speculative branches={'on' if config.speculative_branches else 'off'}"
          + (f" (min keep {config.speculative_min_keep:g})" if config.speculative_branches else "")
          + (", envs started in the wall" if args.cold_env else "") + f", seed={args.seed}\n")
    print("| metric | ARPO | GRPO | ARPO / GRPO |")
    print("|---|---:|---:|---:|")
    for key in ("generated", "encoded", "prompt tokens", "tool result tokens", "notices", "notice tokens",
                "tool calls", "wall s", "decode steps", "env s", "env share", "tool s", "env start-up s",
                "peak MB", "GPU peak MB", "branches", "top-ups", "spares started", "spares taken",
                "spare tokens discarded", "spare tool calls discarded", "speculative started", "speculative kept",
                "speculative tokens discarded", "trajectories", "longest trajectory", "mean trajectory", "mean reward"):
        if key not in arpo:
            continue
        a, g = arpo[key], grpo[key]
        ratio = f"{a / g:.2f}" if g and key not in ("branches", "mean reward", "env share") else "—"
        fmt = "{:.2f}" if isinstance(a, float) else "{}"
        print(f"| {key} | {fmt.format(a)} | {fmt.format(g)} | {ratio} |")
    print(f"\nARPO/GRPO wall {arpo['wall s'] / grpo['wall s']:.2f} tokens generated "
          f"{arpo['generated'] / grpo['generated']:.2f} tokens encoded {arpo['encoded'] / grpo['encoded']:.2f} "
          f"env share {arpo['env share']:.3f}")


if __name__ == "__main__":
    main()
