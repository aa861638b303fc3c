"""What the tool pool's threads cost the decoding loop that runs beside them in the same process.

    python benchmarks/tool_threads.py [--rows 40] [--steps 200] [--layers 30] [--threads 8] [--switch-ms 5,0.5]

A rollout steps its environments (tool calls, forks, closes) in a thread pool of the process that generates, so the
environments' own Python (parsing a turn, talking to the sandbox, formatting its answer) shares the interpreter lock
with the decoding loop. On this 2-core CPU the two mostly compete for cores; on a GPU, where a decoding step is a
short run of Python that launches kernels, they compete for the lock. This benchmark measures it without weights or
data: a decoding loop of a model of SmolLM2-135M's shape (random weights, `--rows` rows after a 200-token prompt,
every step's tokens read back as the generator does) timed alone and then with `--threads` threads stepping real
`ARPO-Math-v0` environments back to back beside it (fork, one Python call, close), for each interpreter switch
interval asked for (`sys.setswitchinterval`), in alternating rounds. The last line reads
``decoding step ms alone <a> beside tool threads <b> env step ms alone <c> beside decoding <d>``: the medians of the
last interval asked for, over its rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import torch

import arpo_env  # noqa: F401
from arpo_algo.generation.hf_generator import cache_argument_name

ACTION = "Let me compute.\n<python>\nx = 17 * 23\nprint(x)\n</python>"


def env_step(env) -> float:
    """Fork `env`, step the fork with one Python call, close it; the step's milliseconds."""
    fork = env.fork()
    began = time.perf_counter()
    fork.step(ACTION)
    took = time.perf_counter() - began
    fork.close()
    return took * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--steps", type=int, default=200, help="decoding steps timed in each phase")
    parser.add_argument("--layers", type=int, default=30, help="SmolLM2-135M has 30")
    parser.add_argument("--threads", type=int, default=8, help="the tool pool's threads (the rollout's default: 8)")
    parser.add_argument("--switch-ms", default="5,0.5",
                        help="interpreter switch intervals to try, in ms (Python's default is 5)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(args.device).eval()
    cache_name = cache_argument_name(model)  # `cache` in transformers 5.24, `past_key_values` before
    envs = []
    for i in range(args.threads):
        env = gym.make("ARPO-Math-v0").unwrapped
        env.reset(seed=i, options={"index": i})
        envs.append(env)
    alone_env = [env_step(envs[0]) for _ in range(20)]  # also waits for the sandbox's start at reset

    @torch.inference_mode()
    def decode() -> float:
        """The median milliseconds of a decoding step."""
        cache = DynamicCache()
        ids = torch.randint(0, config.vocab_size, (args.rows, 200), device=args.device)
        out = model(input_ids=ids, use_cache=True, **{cache_name: cache})
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        token.tolist()
        times = []
        for _ in range(args.steps):
            began = time.perf_counter()
            out = model(input_ids=token, use_cache=True, **{cache_name: cache})
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            token.tolist()  # the generator reads every step's tokens
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1e3

    decode()  # warm-up
    intervals = [float(ms) / 1e3 for ms in args.switch_ms.split(",")]
    default = sys.getswitchinterval()
    results: dict[float, list[tuple[float, float, float]]] = {s: [] for s in intervals}
    try:
        for round_ in range(args.rounds):
            for interval in intervals:
                sys.setswitchinterval(interval)
                alone = decode()
                latencies: list[float] = []
                stop = threading.Event()

                def pump(pool: ThreadPoolExecutor) -> None:
                    i = 0
                    while not stop.is_set():
                        futures = [pool.submit(env_step, envs[(i + j) % len(envs)]) for j in range(args.threads)]
                        latencies.extend(f.result() for f in futures)
                        i += args.threads

                with ThreadPoolExecutor(args.threads) as pool:
                    feeder = threading.Thread(target=pump, args=(pool,))
                    feeder.start()
                    beside = decode()
                    stop.set()
                    feeder.join()
                env_ms = statistics.median(latencies)
                results[interval].append((alone, beside, env_ms))
                print(f"round {round_ + 1}, switch interval {interval * 1e3:g} ms: decoding step {alone:.1f} ms "
                      f"alone, {beside:.1f} ms beside {args.threads} tool threads ({beside / alone:.2f}x); "
                      f"{len(latencies)} env steps, {env_ms:.1f} ms each (median)", flush=True)
    finally:
        sys.setswitchinterval(default)
        for env in envs:
            env.close()
    alone, beside, env_ms = (statistics.median(r[i] for r in results[intervals[-1]]) for i in range(3))
    print(f"decoding step ms alone {alone:.1f} beside tool threads {beside:.1f} env step ms alone "
          f"{statistics.median(alone_env):.1f} beside decoding {env_ms:.1f}")


if __name__ == "__main__":
    main()
