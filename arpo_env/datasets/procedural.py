"""A seeded procedural task family for small models, and a scripted teacher that solves it with real tool calls.

Multi-digit arithmetic (``What is 4821 * 739 + 1204?``) is out of reach of a 135M model's mental arithmetic but
trivial with Python, so a small model can visibly learn to call the interpreter on a CPU. ``dataset="arithmetic"``
(1,000 tasks, seed 0) or ``"arithmetic:N:SEED[:TERMS]"`` in any environment (TERMS numbers, 3 by default).

``dataset="chain"`` (or ``"chain:N:SEED[:STEPS]"``) is a family of word problems in which a number goes through
STEPS operations in turn; the teacher computes one step per call and carries each printed result into the next.

`scripted_episode` plays one task in an environment the way a competent agent would (think, compute in Python,
answer from the result): the observations in its transcript are the sandbox's real output. It is the teacher for
cold-start traces and the benchmarks' way to give a model something to imitate.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from arpo_env.datasets.task import BadDatasetName, Task

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


# Chained word problems ----------------------------------------------------------------------------------------------
_NAMES = ("Ada", "Ben", "Chen", "Dana", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kemi", "Lior")
_WORDING = {
    "+": ("{name} earns {k} more coins.", "{name} finds {k} coins.", "A friend gives {name} {k} coins."),
    "-": ("{name} spends {k} coins.", "{name} loses {k} coins.", "{name} pays {k} coins for a ticket."),
    "*": ("{name}'s coins are multiplied by {k}.", "{name} now has {k} times as many coins.",
          "An investment makes {name}'s coins {k} times larger."),
    "//": ("{name} shares the coins equally among {k} people and keeps one share, dropping any remainder.",
           "{name} keeps only 1/{k} of the coins, rounded down."),
}


def chain_tasks(n: int = 1000, seed: int = 0, steps: int = 3) -> list[Task]:
    """`n` word problems where a number of coins goes through `steps` operations in turn (earn, spend, multiply,
    share); the teacher computes one step per Python call and carries each printed result into the next call, so
    the model must read the tool's output to go on. More steps: more calls, more numbers to carry without a slip."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        name = rng.choice(_NAMES)
        value = start = rng.randint(100, 9999)
        ops = []
        for _ in range(steps):
            op = rng.choice(("+", "-", "*", "//") if value > 50 else ("+", "*"))
            k = {"+": rng.randint(100, 9999), "-": rng.randint(1, max(1, value - 1)),
                 "*": rng.randint(3, 99), "//": rng.randint(3, 29)}[op]
            value = {"+": value + k, "-": value - k, "*": value * k, "//": value // k}[op]
            ops.append([op, k])
        story = " ".join(rng.choice(_WORDING[op]).format(name=name, k=k) for op, k in ops)
        question = f"{name} has {start} coins. {story} How many coins does {name} have now?"
        tasks.append(Task(question, str(value), f"chain-{seed}-{i}", "chain", "math",
                          {"start": start, "ops": ops}))
    return tasks


FAMILIES = {"arithmetic": (arithmetic_tasks, "terms", 3), "chain": (chain_tasks, "steps", 3)}
"""Procedural families: generator, the name of its difficulty argument, its default."""
MAX_TASKS = 1_000_000
"""A family's tasks are made all at once (a million take seconds): more is taken for a typing slip."""
MAX_LEVEL = 1000
"""Terms of an expression, steps of a chain."""


def parse_name(name: str) -> tuple[Any, dict[str, Any]] | None:
    """``FAMILY[:N[:SEED[:LEVEL]]]`` → (generator, its keyword arguments), anything else → None. ``arithmetic`` is
    1,000 three-term tasks of seed 0; ``arithmetic:200:7:5`` 200 tasks of seed 7 with five terms; ``chain:500:3:2``
    500 two-step word problems of seed 3."""
    parts = name.split(":")
    if parts[0] not in FAMILIES:
        return None
    generate, level, default = FAMILIES[parts[0]]
    if len(parts) > 4:  # a procedural name, not a file: say what is wrong with it
        raise BadDatasetName(f"dataset {name!r}: more than N, SEED and {level.upper()} after {parts[0]} "
                             f"({parts[0]}[:N[:SEED[:{level.upper()}]]], e.g. {parts[0]}:200:7:{default})")
    values = []
    for i, (what, fallback, low, high) in enumerate([("N", 1000, 1, MAX_TASKS), ("SEED", 0, None, None),
                                                     (level.upper(), default, 1, MAX_LEVEL)], 1):
        text = parts[i].strip() if len(parts) > i else ""
        try:
            value = int(text) if text else fallback
        except ValueError:
            value = None
        if value is None or (low is not None and not low <= value <= high):
            bounds = f" from {low:,} to {high:,}" if low is not None else ""
            raise BadDatasetName(f"dataset {name!r}: {what} must be a whole number{bounds}, not {text!r} "
                                 f"({parts[0]}[:N[:SEED[:{level.upper()}]]], e.g. {parts[0]}:200:7:{default})")
        values.append(value)
    return generate, {"n": values[0], "seed": values[1], level: values[2]}


def procedural_tasks(name: str) -> list[Task] | None:
    """The tasks a procedural dataset name stands for (`parse_name`), or None if it names no family. They are made
    once per name and process: every environment of a rollout is made from the name, and 1,000 tasks took 25 ms to
    make each time (5,000: 120 ms)."""
    parsed = parse_name(name)
    return None if parsed is None else list(_made(parsed[0], tuple(sorted(parsed[1].items()))))


@functools.lru_cache(maxsize=16)
def _made(generate: Any, kwargs: tuple[tuple[str, int], ...]) -> tuple[Task, ...]:
    return tuple(generate(**dict(kwargs)))


def teacher_action(task: Task, results: list[str]) -> str | None:
    """The teacher's next Python call, given the values its earlier calls printed; None when it can answer."""
    if task.source == "chain":
        ops = task.meta["ops"]
        if len(results) == len(ops):
            return None
        value = results[-1] if results else str(task.meta["start"])
        op, k = ops[len(results)]
        return f"<think>Step {len(results) + 1}: {value} {op} {k}.</think>\n<python>print({value} {op} {k})</python>"
    if results:
        return None
    expr = task.meta.get("expression") or task.question.removeprefix("What is ").rstrip("?")
    return f"<think>I will compute {expr} with Python.</think>\n<python>print({expr})</python>"


def scripted_episode(env: Any, task: Task) -> dict[str, Any]:
    """Play `task` in `env` (unwrapped `ToolEnv`) as the teacher; return the messages, segments and reward. The
    observations are the sandbox's real output, and each call reads the value the previous one printed."""
    _, info = env.reset(options={"question": task.question, "answer": task.answer, "kind": task.kind})
    segments: list[tuple[str, str]] = []
    results: list[str] = []
    while (action := teacher_action(task, results)) is not None:
        obs, *_ = env.step(action)
        segments += [("action", action), ("observation", obs)]
        lines = obs.replace("<result>", "").replace("</result>", "").strip().splitlines()
        results.append(lines[0] if lines else "")
    value = results[-1] if results else ""
    final = f"\n<think>The result is {value}.</think>\n<answer>\\boxed{{{value}}}</answer>"
    _, reward, terminated, truncated, end = env.step(final)
    segments.append(("action", final))
    return {"messages": info["messages"], "segments": segments, "reward": reward,
            "reward_parts": end.get("reward_parts", {}), "task": task.as_dict()}
