"""A seeded procedural task family for small models, and a scripted teacher that solves it with real tool calls.

Multi-digit arithmetic (``What is 4821 * 739 + 1204?``) is out of reach of a 135M model's mental arithmetic but
trivial with Python, so a small model can visibly learn to call the interpreter on a CPU. ``dataset="arithmetic"``
(1,000 tasks, seed 0) or ``"arithmetic:N:SEED[:TERMS]"`` in any environment (TERMS numbers, 3 by default).

`scripted_episode` plays one task in an environment the way a competent agent would (think, compute in Python,
answer from the result): the observations in its transcript are the sandbox's real output. It is the teacher for
cold-start traces and the benchmarks' way to give a model something to imitate.
"""

from __future__ import annotations

import random
from typing import Any

from arpo_env.datasets import Task

_OPS = ("+", "-", "*")


def arithmetic_tasks(n: int = 1000, seed: int = 0, digits: tuple[int, int] = (3, 5), terms: int = 3) -> list[Task]:
    """`n` expressions of `terms` numbers of `digits` digits with +, − and ×; answers are exact integers. More terms
    make a harder task for a small model: a longer expression to carry into the interpreter without a slip."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        sizes = [rng.randint(*digits) for _ in range(terms)]
        nums = [rng.randint(10 ** (d - 1), 10 ** d - 1) for d in sizes]
        ops = [rng.choice(_OPS) for _ in range(terms - 1)]
        expr = " ".join(f"{op} {num}" for op, num in zip(["", *ops], nums)).strip()
        tasks.append(Task(f"What is {expr}?", str(eval(expr)), f"arith-{seed}-{i}", "arithmetic", "math",
                          {"expression": expr}))
    return tasks


def parse_name(name: str) -> tuple[int, int, tuple[int, int], int] | None:
    """``arithmetic`` → 1,000 tasks, seed 0, three terms; ``arithmetic:N:SEED[:TERMS]`` (``arithmetic:200:7:5``:
    200 tasks of seed 7 with five terms); anything else → None. Returns `arithmetic_tasks`' arguments."""
    parts = name.split(":")
    if parts[0] != "arithmetic" or len(parts) > 4:
        return None
    n = int(parts[1]) if len(parts) > 1 else 1000
    seed = int(parts[2]) if len(parts) > 2 else 0
    terms = int(parts[3]) if len(parts) > 3 else 3
    return n, seed, (3, 5), terms


def scripted_actions(task: Task) -> list[str]:
    """The first action of the teacher: reason briefly and compute with Python."""
    expr = task.meta.get("expression") or task.question.removeprefix("What is ").rstrip("?")
    return [f"<think>I will compute {expr} with Python.</think>\n<python>print({expr})</python>"]


def scripted_episode(env: Any, task: Task) -> dict[str, Any]:
    """Play `task` in `env` (unwrapped `ToolEnv`) as the teacher; return the messages, segments and reward."""
    _, info = env.reset(options={"question": task.question, "answer": task.answer, "kind": task.kind})
    segments: list[tuple[str, str]] = []
    obs = ""
    for action in scripted_actions(task):
        obs, *_ = env.step(action)
        segments += [("action", action), ("observation", obs)]
    value = obs.replace("<result>", "").replace("</result>", "").strip().splitlines()[0] if obs else ""
    final = f"\n<think>The result is {value}.</think>\n<answer>\\boxed{{{value}}}</answer>"
    _, reward, terminated, truncated, end = env.step(final)
    segments.append(("action", final))
    return {"messages": info["messages"], "segments": segments, "reward": reward,
            "reward_parts": end.get("reward_parts", {}), "task": task.as_dict()}
