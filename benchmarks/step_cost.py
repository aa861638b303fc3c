"""What one decoding step costs, by the number of rows (paths) in the running batch, on either backend.

    python benchmarks/step_cost.py [--model smollm2-135m] [--rows 1,2,4,8,12,16,20,24,32] [--steps 24] [--rounds 2]
    .venv-vllm/bin/python benchmarks/step_cost.py --backend vllm    # vLLM's engine steps (CPU build or GPU)

The rollout's wall time on this backend is its decoding steps times what each costs. Where a step's cost hardly
depends on its rows (reading the weights dominates it, as on a GPU at small batches), wider batches are free and
what counts is the number of steps: spare samples and speculative branches, which take rows to save steps, pay.
Where the cost grows with the rows (a CPU past a few rows), every extra row costs too: they pay less or not at all.
This benchmark measures which case a machine is in, with the generator the rollout uses
(`arpo_algo.generation.hf_generator.HFGenerator`: its batch, cache, sampling and entropy window), on a math task's real prompt,
every row a fork of it at the same length. For each width it times the steps after the first few (end of sequence is
ignored, so no row leaves) and prints the median milliseconds a step and a row. It times two generators side by side,
in alternating rounds: the default one, whose linear layers run on oneDNN-packed weights where PyTorch has oneDNN
(`arpo_algo.generation.packed_linear`), and one with PyTorch's default linear kernel (``packed_weights=False``); the last column
is the second's time over the first's. The last line reads ``step ms <t> at 1 row <t> at 2 rows …``, the default
generator's figure for each width asked for.

With ``--backend vllm`` it times vLLM's engine steps instead, the way `arpo_algo.generation.vllm_generator.VLLMGenerator`
drives the engine (float32, prefix caching, processed log-probs, the top-10 log-probabilities of every token, 32-token
KV blocks on the CPU): `rows` requests of the same prompt, each its own, end of sequence ignored; the steps that encode
the prompts are not timed. There is one generator, so the default-kernel columns are left out.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import gymnasium as gym
import torch
from tqdm import tqdm

import arpo_env  # noqa: F401
from arpo_algo.generation.hf_generator import HFGenerator, _Batch, _Seq
from arpo_algo.generation.models import load_model, prompt_ids
from arpo_algo.generation.protocol import SamplingParams


def step_times(gen: HFGenerator, prompt: list[int], rows: int, steps: int, warm: int = 3) -> list[float]:
    """Seconds of each decoding step of one batch of `rows` forks of the prompt, after `warm` untimed steps."""
    root = gen.new_path(prompt)
    gen.encode([root])
    params = SamplingParams(max_new_tokens=steps + warm + 1, temperature=1.0, top_p=1.0, stop=(), entropy_k=20)
    batch = _Batch(gen)
    times = []
    with gen.decoding():
        batch.join([_Seq(gen.fork(root), params) for _ in range(rows)])
        for i in range(steps + warm):
            began = time.perf_counter()
            batch.step()
            if i >= warm:
                times.append(time.perf_counter() - began)
    return times


_request_ids = itertools.count()


def task_prompt(tokenizer) -> list[int]:
    """The token ids of a math task's real prompt (the env's first task, chat template applied)."""
    env = gym.make("ARPO-Math-v0")
    _, info = env.reset(seed=0)
    env.close()
    return prompt_ids(tokenizer, info["messages"])


def last_line(medians: dict[int, float], widths: list[int]) -> str:
    return "step ms " + " ".join(f"{medians[r] * 1000:.1f} at {r} row{'s' if r > 1 else ''}" for r in widths)


def vllm_step_times(gen, prompt: list[int], rows: int, steps: int, warm: int = 3) -> list[float]:
    """Seconds of each engine step that sampled a token for `rows` requests of the prompt, after `warm` of them."""
    from vllm import SamplingParams as VLLMParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    engine = gen.llm.llm_engine
    top = SamplingParams().entropy_top_logprobs
    sampling = VLLMParams(max_tokens=steps + warm + 1, temperature=1.0, top_p=1.0, logprobs=top,
                          ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    for _ in range(rows):
        engine.add_request(f"step-cost-{next(_request_ids)}", TokensPrompt(prompt_token_ids=list(prompt)), sampling)
    times: list[float] = []
    sampled = 0
    while engine.has_unfinished_requests():
        began = time.perf_counter()
        outputs = engine.step()
        took = time.perf_counter() - began
        if len(outputs) == rows and all(out.outputs[0].token_ids for out in outputs):
            sampled += 1  # every row sampled in this step (the prompts' steps, and the last, are left out)
            if warm < sampled <= warm + steps:
                times.append(took)
    return times


def vllm_main(args: argparse.Namespace, widths: list[int]) -> None:
    import os

    import torch
    import vllm
    from rollout_efficiency import vllm_generator

    from arpo_algo.generation.models import resolve

    gen = vllm_generator(resolve(args.model))
    prompt = task_prompt(gen.tokenizer)
    medians = {}
    per_round = max(1, args.steps // args.rounds)
    for rows in tqdm(widths, desc="widths"):
        times: list[float] = []
        for _ in range(args.rounds):
            times += vllm_step_times(gen, prompt, rows, per_round)
        medians[rows] = statistics.median(times)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    print(f"\n{args.model}, float32, vLLM {vllm.__version__} ({device}), prompt of {len(prompt)} tokens, "
          f"{per_round * args.rounds} timed engine steps per width, top-{SamplingParams().entropy_top_logprobs} "
          "log-probs\n")
    print(f"| rows | ms a step | ms a row | vs {widths[0]} row{'s' if widths[0] > 1 else ''} |")
    print("|---:|---:|---:|---:|")
    for rows in widths:
        ms = medians[rows] * 1000
        print(f"| {rows} | {ms:.1f} | {ms / rows:.1f} | {medians[rows] / medians[widths[0]]:.2f} |")
    print()
    print(last_line(medians, widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,2,4,8,12,16,20,24,32", help="batch widths, comma-separated")
    parser.add_argument("--steps", type=int, default=24, help="timed steps per width (in all, over the rounds)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating rounds of the two generators per width (this machine's speed drifts)")
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                        help="the transformers generator (default) or vLLM's engine")
    args = parser.parse_args()
    widths = [int(w) for w in args.rows.split(",")]
    if args.backend == "vllm":
        vllm_main(args, widths)
        return

    model, tokenizer = load_model(args.model, dtype="float32")
    gen = HFGenerator(model, tokenizer)
    plain = HFGenerator(model, tokenizer, packed_weights=False)
    gen.eos_ids = plain.eos_ids = []  # no row leaves: every step is as wide as asked
    prompt = task_prompt(tokenizer)

    medians, plain_medians = {}, {}
    per_round = max(1, args.steps // args.rounds)
    for rows in tqdm(widths, desc="widths"):
        times: list[float] = []
        plain_times: list[float] = []
        for _ in range(args.rounds):
            times += step_times(gen, prompt, rows, per_round)
            plain_times += step_times(plain, prompt, rows, per_round)
        medians[rows], plain_medians[rows] = statistics.median(times), statistics.median(plain_times)
    print(f"\n{args.model}, float32, {torch.get_num_threads()} threads, prompt of {len(prompt)} tokens, "
          f"{per_round * args.rounds} timed steps per width and generator, linear layers "
          f"{'on oneDNN-packed weights' if gen.packed_weights else 'on the default kernel (no oneDNN here)'}\n")
    print(f"| rows | ms a step | ms a row | vs {widths[0]} row{'s' if widths[0] > 1 else ''} "
          "| default kernel, ms a step | default / packed |")
    print("|---:|---:|---:|---:|---:|---:|")
    first = medians[widths[0]]
    for rows in widths:
        ms = medians[rows] * 1000
        print(f"| {rows} | {ms:.1f} | {ms / rows:.1f} | {medians[rows] / first:.2f} | {plain_medians[rows] * 1000:.1f} "
              f"| {plain_medians[rows] / medians[rows]:.2f} |")
    print()
    print(last_line(medians, widths))


if __name__ == "__main__":
    main()
