"""Shared fixtures: the development data in ../shared/data and process accounting for the sandbox."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in the tests loads from a hub: fail at once, never wait on it
DATA = Path(os.environ.get("ARPO_TEST_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "eval").is_dir():
        pytest.skip(f"development data not found at {DATA} (set ARPO_TEST_DATA)")
    return DATA


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in process group `pgid`, read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:
            members.append((int(entry), fields[0]))
    return members


def assert_hidden_from_the_sandbox(env_kwargs: dict, path, env_id: str = "ARPO-Math-v0") -> None:
    """A cell of ``gym.make(env_id, **env_kwargs)`` that reads `path` (a file of answers) is refused, and reads none."""
    import gymnasium as gym

    import arpo_env  # noqa: F401

    env = gym.make(env_id, **env_kwargs).unwrapped
    try:
        env.reset(seed=0)
        obs, *_ = env.step(f"<python>print(open({str(path)!r}).read())</python>")
        assert "is hidden from the sandbox" in obs and '"answer"' not in obs, obs
    finally:
        env.close()


def wait_until(predicate, seconds: float = 10.0) -> bool:
    """Poll `predicate` until it holds (process exits are asynchronous); never a timing assertion."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer, from the embedded package (offline)."""
    from arpo_algo.generation.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def agent(tokenizer):
    """A tiny Llama taught the scripted episode (define x, print x + 1, answer 42) by Adam steps."""
    import gymnasium as gym
    from tiny_agent import episode_ids, teach, tiny_llama

    import arpo_env  # noqa: F401

    model = tiny_llama(tokenizer)
    env = gym.make("ARPO-Math-v0").unwrapped
    prompt, completion = episode_ids(tokenizer, env)
    env.close()
    assert teach(model, prompt, completion) < 0.05
    return model


@pytest.fixture(scope="session")
def undecided(tokenizer):
    """A tiny Llama that is sure up to its last tool result, then answers 42 or 43: mixed rewards, and entropy that
    rises after a tool result."""
    import gymnasium as gym
    from tiny_agent import undecided_agent

    import arpo_env  # noqa: F401

    env = gym.make("ARPO-Math-v0").unwrapped
    model = undecided_agent(tokenizer, env)
    env.close()
    return model
