r"""Pathological answers never hang or crash scoring: each is scored within its bound from a worker thread, through
the environment and through the TRL reward function, and the process goes on scoring ordinary answers after."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import gymnasium as gym
import pytest

import arpo_env  # noqa: F401
from arpo_env import rewards
from arpo_env.scoring import math_equivalence
from arpo_env.scoring.math_equivalence import MATH_EQUAL_TARGET
from arpo_env.scoring.worker_pool import BoundExceeded, pool

BOUND_S = 2.0
PATHOLOGICAL = {
    "power tower": "9^{9^{9^{9}}}",
    "taller tower": "2^{2^{2^{2^{2^{2}}}}}",
    "huge power of ten": "10^{10^{10}}",
    "huge factorial": "1000000!",
    "nested braces": "{" * 5000 + "1" + "}" * 5000,
    "nested braces, too long to look at": "{" * 15_000 + "1" + "}" * 15_000,  # tractable.intractable leaves it: bounded
    "nested roots": "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "200,000 digits": "9" * 200_000,
    "division by zero": "\\frac{1}{0}",
    "huge matrix": "\\begin{pmatrix}" + "\\\\".join(["&".join(["1"] * 300)] * 300) + "\\end{pmatrix}",
}


def in_thread(fn):
    """Run `fn` in a worker thread (as the rollout engine does) and return its result; a hang fails the test."""
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(BOUND_S + 120)  # the bound, plus a worker's start-up on a busy machine: a liveness check
    assert not thread.is_alive(), "scoring hung"
    return box["value"]


@pytest.fixture(autouse=True)
def short_bound(monkeypatch):
    monkeypatch.setenv("ARPO_SCORE_TIMEOUT", str(BOUND_S))


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_answers_through_the_env_in_a_thread(name):
    env = gym.make("ARPO-Math-v0", tools=()).unwrapped
    env.reset(options={"question": "q", "answer": "42"})
    _, reward, terminated, _, info = in_thread(lambda: env.step(f"<answer>\\boxed{{{PATHOLOGICAL[name]}}}</answer>"))
    assert terminated and reward == 0.0 and info["reward_parts"]["format_ok"]
    env.reset(options={"question": "q", "answer": "42"})  # and the env goes on
    assert env.step("<answer>\\boxed{42}</answer>")[1] == 1.0
    env.close()


@pytest.mark.parametrize("name", list(PATHOLOGICAL))
def test_pathological_answers_through_the_trl_reward_in_a_thread(name):
    completion = f"<answer>\\boxed{{{PATHOLOGICAL[name]}}}</answer>"
    assert in_thread(lambda: rewards.math_reward(["q"], [completion], answer=["42"])) == [0.0]
    assert in_thread(lambda: rewards.math_reward(["q"], ["<answer>\\boxed{6 \\cdot 7}</answer>"],
                                                 answer=["42"])) == [1.0]


@pytest.mark.slow
def test_an_overrunning_call_is_cut_and_its_worker_replaced():
    with pytest.raises(BoundExceeded):
        pool().call(MATH_EQUAL_TARGET, "9^{9^{9^{9}}}", ["1"], timeout_s=0.5)
    assert pool().call(MATH_EQUAL_TARGET, "\\frac{1}{2}", ["0.5"]) is True


def test_scoring_survives_the_thread_that_started_its_workers():
    """Rollouts step envs in short-lived thread pools: a worker started from one must outlive it (the kernel's
    parent-death signal is per thread), and the next pool's calls must still be scored, not lost to a broken pipe."""
    from concurrent.futures import ThreadPoolExecutor

    from arpo_env.scoring.worker_pool import WorkerPool

    own = WorkerPool(size=1)
    for _ in range(3):  # a new pool of threads each round, as each rollout makes
        with ThreadPoolExecutor(2) as threads:
            assert list(threads.map(lambda a: own.call(MATH_EQUAL_TARGET, a, ["0.5"]), ["1/2", "\\frac{1}{2}"])) == \
                [True, True]
    own.close()


@pytest.mark.slow
def test_an_episode_starts_its_scoring_workers_before_its_first_answer():
    """A scoring worker imports sympy and math-verify (a second here, several on a machine's first run): started at
    reset, they are up by the time the first answer comes, and that answer is scored on them."""
    code = ("import time, gymnasium as gym, arpo_env\n"
            "from arpo_env.scoring.worker_pool import pool\n"
            "env = gym.make('ARPO-Math-v0').unwrapped\n"
            "env.reset(options={'question': 'q', 'answer': '1'})\n"
            "deadline = time.monotonic() + 120\n"
            "while len(pool().workers) < pool().size and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n"
            "up = len(pool().workers)\n"
            "_, reward, *_ = env.step('<answer>\\\\boxed{\\\\frac{2}{2}}</answer>')\n"  # not the same string: math-verify
            "print(up, pool().size, len(pool().workers), reward)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "2", "2", "1.0"], out.stdout


def test_an_answer_far_longer_than_every_gold_is_not_equal_without_asking_math_verify(monkeypatch):
    """math-verify's time grows with the answer (3,000 characters of "a1 a1 …" took it 1 s of a scoring worker, 21,000
    took 3.5 s): a policy fallen into long garbage answers held the workers that long for each. Answers within
    `FAR_LONGER` times the longest gold (or under `MIN_FAR_LONGER` characters) still go to it."""
    import arpo_env.scoring.worker_pool

    asked = []
    real = arpo_env.scoring.worker_pool.pool
    monkeypatch.setattr(arpo_env.scoring.worker_pool, "pool", lambda *args: asked.append(args) or real(*args))
    monkeypatch.setattr(math_equivalence, "_verdicts", type(math_equivalence._verdicts)())  # none kept from the tests before
    assert not math_equivalence.math_equal("a1 " * 1000, "42") and not asked
    assert not math_equivalence.math_equal("1+" * 600 + "1", ["42", "7"]) and not asked
    assert math_equivalence.math_equal("+".join(["1"] * 101), "101") and len(asked) == 1  # 201 characters: math-verify's
    gold = "+".join(["2"] * 50)  # 99 characters: answers up to 1,980 are math-verify's
    answer = " + ".join(["1"] * 100) + " + " + "+".join(["0"] * 600)  # 1,599 characters
    assert math_equivalence.math_equal(answer, gold) and len(asked) == 2


@pytest.mark.slow
def test_the_same_answer_is_decided_once_however_many_samples_end_on_it(monkeypatch, caplog):
    """The samples of a group often end on the same answer: one that takes math-verify its whole bound held a worker
    that long for each (16 samples of ``(x+1)^{3000}``: 80 s of two workers). It is asked once; the samples that
    ask meanwhile wait for that verdict, and later ones read it. Another bound is another question."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from arpo_env.scoring.worker_pool import WorkerPool

    asked = []
    real_call = WorkerPool.call
    monkeypatch.setattr(WorkerPool, "call", lambda self, *a, **k: asked.append(a[1]) or real_call(self, *a, **k))
    monkeypatch.setattr(math_equivalence, "_verdicts", type(math_equivalence._verdicts)())
    slow = "(x+1)^{3000}"
    with caplog.at_level(logging.WARNING, logger="arpo_env.rewards"), ThreadPoolExecutor(8) as threads:
        verdicts = list(threads.map(lambda _: math_equivalence.math_equal(slow, "5", timeout_s=1.0), range(8)))
    assert verdicts == [False] * 8 and asked == [slow]
    assert sum("gave up" in r.getMessage() for r in caplog.records) == 1
    assert math_equivalence.math_equal("\\frac{2}{4}", "0.5") and math_equivalence.math_equal("\\frac{2}{4}", "0.5")
    assert not math_equivalence.math_equal(slow, "5", timeout_s=1.0) and asked == [slow, "\\frac{2}{4}"]
    assert not math_equivalence.math_equal(slow, "5", timeout_s=0.5) and asked == [slow, "\\frac{2}{4}", slow]
    monkeypatch.setattr(math_equivalence, "VERDICTS_KEPT", 2)
    for answer in ("1", "2", "3"):
        math_equivalence.math_equal(answer, "7")
    assert len(math_equivalence._verdicts) == 2


def test_a_number_against_a_logarithm_is_decided_within_the_bound(caplog):
    r"""A long integer or a power of ten against a gold with a logarithm (``2\log 3``, ``\log_3 7``, ``\log x``)
    took math-verify its whole bound (SymPy's ``logcombine`` raised 10 to the integer), 5 s of a worker for each such
    answer. Numbers plainly apart are not equal at once; a logarithm that is the number (``\log_2 8`` and 3) is still
    math-verify's to decide."""
    import logging

    cases = [("7" * 30, r"2\log 3"), ("1" * 60, r"\log_3 7"), ("1" * 200, r"\log 2"),
             ("123456789" * 4, r"\frac{\log 5}{2}"), ("10^{30}", r"2\log 3"), ("7" * 30, r"\log x"),
             ("3", r"\log_2 8"), ("2", r"\log 100"), ("0.30103", r"\log 2"), ("-1", r"\log_2 \frac12"),
             ("0.5", r"\log_4 2")]
    with caplog.at_level(logging.WARNING, logger="arpo_env.rewards"):
        verdicts = [math_equivalence.math_equal(answer, gold, timeout_s=BOUND_S) for answer, gold in cases]
    assert verdicts == [False] * 6 + [True] * 5
    assert not [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]


def test_an_answer_the_scorer_gives_up_on_carries_why_in_its_reward(monkeypatch):
    """A scoring worker past its bound scores the answer 0, as a wrong one; the reward's record says it was not
    judged wrong (`RewardParts.scoring_errors`), for every answer that verdict scores, and a judged answer has none."""
    monkeypatch.setenv("ARPO_SCORE_TIMEOUT", "0.001")  # no verdict of math-verify comes back this fast
    reward = rewards.HierarchicalReward()
    given_up = [reward("<answer>\\boxed{\\frac{7}{13} + \\frac{6}{13}}</answer>", "1") for _ in range(2)]
    for parts in given_up:
        assert parts.score == 0 and parts.format_ok
        assert len(parts.scoring_errors) == 1 and "math scoring timed out" in parts.scoring_errors[0]
        assert parts.as_dict()["scoring_errors"] == parts.scoring_errors
    monkeypatch.delenv("ARPO_SCORE_TIMEOUT")
    judged = reward("<answer>\\boxed{\\frac{5}{11} + \\frac{6}{11}}</answer>", "2")
    assert judged.score == 0 and judged.scoring_errors == []  # wrong, and judged so
