"""The E2B backend behind the same protocol (live: needs E2B_API_KEY and network; skipped otherwise)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.live


def test_without_a_key_the_error_is_clear(monkeypatch):
    from arpo_env.tools.e2b import E2BSandbox

    monkeypatch.delenv("E2B_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="E2B_API_KEY"):
        E2BSandbox()


def test_without_the_package_the_error_comes_when_the_env_is_made(monkeypatch):
    """With a key but without the e2b package, every Python call failed with a message, and the run went on."""
    import importlib.util

    import gymnasium as gym

    import arpo_env  # noqa: F401

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "e2b_code_interpreter" else find_spec(name, *a))
    with pytest.raises(RuntimeError, match=r"needs the e2b extra: pip install 'arpo\[e2b\]'"):
        gym.make("ARPO-Math-v0", sandbox="e2b", sandbox_options={"api_key": "a key"})


@pytest.mark.skipif(not os.environ.get("E2B_API_KEY"), reason="E2B_API_KEY not set")
def test_e2b_fork_and_restore_by_replay():
    pytest.importorskip("e2b_code_interpreter")
    import gymnasium as gym

    import arpo_env  # noqa: F401

    env = gym.make("ARPO-Math-v0", sandbox="e2b")
    env.reset(options={"question": "q", "answer": "42"})
    env.step("<python>x = 41</python>")
    child = env.unwrapped.fork()
    child.step("<python>x = 0</python>")
    assert "42" in env.unwrapped.step("<python>x + 1</python>")[0]
    assert "1" in child.step("<python>x + 1</python>")[0]
    child.close()
    env.close()
