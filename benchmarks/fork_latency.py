"""Fork vs restore-by-replay vs a fresh env, at histories of 1, 16 and 64 cells.

    python benchmarks/fork_latency.py [--repeats 20]

Each history is a realistic mix of cells a math agent runs (numpy, sympy, plain loops). For each length it times,
side by side in one run:

* fork:    ``env.unwrapped.fork()`` plus the branch's first cell (the forked interpreter answers);
* fork():  the ``fork()`` call alone: what the caller waits for (the copy finishes starting on its own, and its first
           cell waits for that; a rollout makes its forks in the tool pool, off the critical path, anyway);
* answered: ``fork()`` and then the wait for the parent's worker to answer that it has forked: what ``fork()``
           cost when it waited for that answer (before the answer was left to the parent's next request);
* started: ``fork()`` and then the sandbox's ``start()``, which waits until the copy is up and has greeted: what
           ``fork()`` cost when it waited for that (before the copy's start-up was left to its first cell);
* replay:  ``restore(snapshot)`` into a new env plus the same first cell (the E2B path, and the cross-process one);
* fresh:   a new env's first cell (a clean interpreter, no state: the floor for any approach).

It prints p50/p95 in milliseconds and the replay/fork ratio. The claim to check: fork stays flat as history grows,
and is far cheaper than replay once the history is long.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym

import arpo_env  # noqa: F401

CELLS = [
    "import numpy as np\na{i} = np.random.default_rng({i}).normal(size=50_000).cumsum()\nfloat(a{i}[-1])",
    "import sympy as sp\nx = sp.Symbol('x')\ne{i} = sp.expand((x + {i}) ** 10)\nsp.degree(e{i})",
    "t{i} = sum(k * k for k in range(30_000))\nt{i}",
    "import sympy as sp\nsol{i} = sp.solve(sp.Symbol('y') ** 2 - {i} - 1, sp.Symbol('y'))\nsol{i}",
]
PROBE = "<python>print('ok')</python>"


def build(history: int):
    env = gym.make("ARPO-Math-v0", max_tool_calls=history + 10, max_turns=history + 10, max_chars=10**7)
    env.reset(options={"question": "benchmark", "answer": "0"})
    for i in range(history):
        env.unwrapped.step("<python>" + CELLS[i % len(CELLS)].format(i=i) + "</python>")
    return env


def timed(fn, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        cleanup = fn()
        samples.append((time.perf_counter() - start) * 1000)
        cleanup()
    return samples


def answered_then_closed(child):
    """The untimed cleanup of a fork: the copy answers a cell (so no start-up is left to overlap the next sample),
    then closes."""
    def cleanup():
        child.step(PROBE)
        child.close()
    return cleanup


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--histories", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()

    warm = build(1)  # start the template once, so no row pays for it
    warm.close()
    rows = []
    for history in args.histories:
        env = build(history)
        snapshot = env.unwrapped.snapshot()

        def fork():
            child = env.unwrapped.fork()
            child.step(PROBE)
            return child.close

        def fork_call():
            return answered_then_closed(env.unwrapped.fork())

        def fork_answered():
            child = env.unwrapped.fork()
            env.unwrapped.tools["python"]._slot.process.answered()
            return answered_then_closed(child)

        def fork_started():
            child = env.unwrapped.fork()
            child.tools["python"].start()
            return answered_then_closed(child)

        def replay():
            other = gym.make("ARPO-Math-v0", max_tool_calls=history + 10, max_turns=history + 10, max_chars=10**7)
            other.unwrapped.restore(snapshot)
            other.unwrapped.step(PROBE)
            return other.close

        def fresh():
            other = gym.make("ARPO-Math-v0")
            other.reset(options={"question": "benchmark", "answer": "0"})
            other.unwrapped.step(PROBE)
            return other.close

        replay_repeats = max(3, args.repeats // (4 if history >= 64 else 2))
        f, c = timed(fork, args.repeats), timed(fork_call, args.repeats)
        a, st = timed(fork_answered, args.repeats), timed(fork_started, args.repeats)
        r, n = timed(replay, replay_repeats), timed(fresh, args.repeats)
        rows.append((history, f, c, a, st, r, n))
        env.close()
        print(f"history {history:>3}: fork p50 {pct(f, .5):7.1f} ms | fork() p50 {pct(c, .5):6.1f} ms | "
              f"answered p50 {pct(a, .5):6.1f} ms | started p50 {pct(st, .5):6.1f} ms | "
              f"replay p50 {pct(r, .5):8.1f} ms | fresh p50 {pct(n, .5):6.1f} ms", flush=True)

    print("\n| cells | fork p50 | fork p95 | fork() p50 | answered p50 | started p50 | fork() / answered | "
          "replay p50 | replay p95 | fresh p50 | fresh p95 | replay / fork |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for history, f, c, a, st, r, n in rows:
        print(f"| {history} | {pct(f, .5):.1f} | {pct(f, .95):.1f} | {pct(c, .5):.1f} | {pct(a, .5):.1f} | "
              f"{pct(st, .5):.1f} | {pct(c, .5) / pct(a, .5):.2f} | {pct(r, .5):.1f} | {pct(r, .95):.1f} | "
              f"{pct(n, .5):.1f} | {pct(n, .95):.1f} | {pct(r, .5) / pct(f, .5):.1f}x |")
    first, last = rows[0][1], rows[-1][1]
    print(f"\nfork p50 at {rows[-1][0]} cells / at {rows[0][0]} cell: {pct(last, .5) / pct(first, .5):.2f}x "
          f"(flat means close to 1); mean fork {statistics.mean(last):.1f} ms")


if __name__ == "__main__":
    main()
