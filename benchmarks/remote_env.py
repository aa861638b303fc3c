"""An env over the wire against the same env in process: step and fork latency, and throughput under concurrency.

    python benchmarks/remote_env.py [--quick]

It starts a real `arpo serve` on 127.0.0.1 and, side by side in one run, times:

* step:  one ``<python>`` cell of an episode (a small computation), in process and through `RemoteEnv`;
* fork:  a usable fork: ``fork()`` and the copy's first cell answered, in process and remotely (the copy is a new
         session on the server, its interpreter a live fork). Each is timed after a step of the parent and a pause
         that stands for the model's turn (20 ms), as in a rollout; with the sandbox's ``fork_ahead`` too, which
         forks a copy after each cell, during that pause, for the next fork to take;
* steps per second with 1, 8 and 64 concurrent sessions, each stepping real cells from its own thread.

It prints p50/p99 in milliseconds, the remote/local ratios and the throughput; its last line reads
``remote/local step p50 <r1> fork p50 <r2> ms <f>; 64 sessions <s> steps/s``: the ratios with the default sandbox,
and ``<f>``, the in-process usable fork's p50 in milliseconds with ``fork_ahead``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym

import arpo_env  # noqa: F401
from arpo_env.remote.client import RemoteEnv

ROOT = Path(__file__).resolve().parents[1]
CELL = "<python>t = sum(k * k for k in range(2_000))\nprint(t % 97)</python>"
TASK = {"question": "benchmark", "answer": "0"}


MODEL_TURN_S = 0.02


def start_server(token: str, env_kwargs: str = "{}") -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ARPO_SERVE_TOKEN": token, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "arpo_algo.cli", "serve", "--port", str(port), "--env_ids",
                                "ARPO-Math-v0", "--max_sessions", "200", "--env_kwargs", env_kwargs], env=env,
                               stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("arpo serve did not start")


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def budget() -> dict:
    return {"max_tool_calls": 10_000, "max_turns": 10_000, "max_chars": 10**8}


AHEAD = '{"sandbox_options": {"fork_ahead": true}}'



def time_steps(env, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        env.step(CELL)
        out.append((time.perf_counter() - start) * 1000)
    return out


def time_forks(env, n: int) -> list[float]:
    out = []
    for _ in range(n):
        env.step(CELL)  # the parent's tool step, then the model's turn, untimed
        time.sleep(MODEL_TURN_S)
        start = time.perf_counter()
        child = env.fork()
        child.step(CELL)
        out.append((time.perf_counter() - start) * 1000)
        child.close()
    return out


def throughput(url: str, sessions: int, seconds: float) -> float:
    """Steps per second of `sessions` remote sessions stepping cells at once, each from its own thread."""
    envs = [RemoteEnv(url, "ARPO-Math-v0", **budget()) for _ in range(sessions)]
    for env in envs:
        env.reset(seed=0, options=TASK)
        env.step(CELL)  # the interpreter is up
    counts = [0] * sessions
    stop = threading.Event()

    def work(i: int) -> None:
        while not stop.is_set():
            envs[i].step(CELL)
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(sessions)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    for env in envs:
        env.close()
    return sum(counts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter throughput windows")
    parser.add_argument("--repeats", type=int, default=None, help="steps and forks timed (default 200; quick 40)")
    parser.add_argument("--seconds", type=float, default=None, help="each throughput window (default 20; quick 5)")
    args = parser.parse_args()
    repeats = args.repeats or (40 if args.quick else 200)
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    token = secrets.token_urlsafe(24)
    os.environ["ARPO_SERVE_TOKEN"] = token
    process, url = start_server(token)
    ahead_process, ahead_url = start_server(token, AHEAD)
    try:
        envs = {"local": gym.make("ARPO-Math-v0", **budget()).unwrapped,
                "local, fork_ahead": gym.make("ARPO-Math-v0", sandbox_options={"fork_ahead": True},
                                              **budget()).unwrapped,
                "remote": RemoteEnv(url, "ARPO-Math-v0", **budget()),
                "remote, fork_ahead": RemoteEnv(ahead_url, "ARPO-Math-v0", **budget())}
        for env in envs.values():  # warm: interpreters up, caches filled
            env.reset(seed=0, options=TASK)
            time_steps(env, 5)
            time_forks(env, 3)
        figures = {}
        for name, env in envs.items():
            print(f"{name}: timing {repeats} steps and {repeats} forks", file=sys.stderr, flush=True)
            figures[name] = {"step": time_steps(env, repeats), "fork": time_forks(env, repeats)}
            env.close()
        ahead_process.terminate()
        print(f"{'':27}{'p50 ms':>10}{'p99 ms':>10}")
        for what in ("step", "fork"):
            for name in envs:
                samples = figures[name][what]
                print(f"{what} {name:22}{statistics.median(samples):10.2f}{percentile(samples, 0.99):10.2f}")
        rates = {}
        for sessions in (1, 8, 64):
            print(f"throughput: {sessions} sessions for {seconds:g} s", file=sys.stderr, flush=True)
            rates[sessions] = throughput(url, sessions, seconds)
            print(f"{sessions:3} sessions {rates[sessions]:8.1f} steps/s")
    finally:
        for p in (process, ahead_process):
            p.terminate()
            p.wait(30)
    step_ratio = statistics.median(figures["remote"]["step"]) / statistics.median(figures["local"]["step"])
    fork_ratio = statistics.median(figures["remote"]["fork"]) / statistics.median(figures["local"]["fork"])
    local_fork = statistics.median(figures["local, fork_ahead"]["fork"])
    print(f"remote/local step p50 {step_ratio:.2f} fork p50 {fork_ratio:.2f} ms {local_fork:.2f}; "
          f"64 sessions {rates[64]:.0f} steps/s")


if __name__ == "__main__":
    main()
