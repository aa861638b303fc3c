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
