"""A seeded procedural task family for small models, and a scripted teacher that solves it with real tool calls.

Multi-digit arithmetic (``What is 4821 * 739 + 1204?``) is out of reach of a 135M model's mental arithmetic but
trivial with Python, so a small model can visibly learn to call the interpreter on a CPU. ``dataset="arithmetic"``
(1,000 tasks, seed 0) or ``"arithmetic:N:SEED[:TERMS]"`` in any environment (TERMS numbers, 3 by default).

``dataset="chain"`` (or ``"chain:N:SEED[:STEPS]"``) is a family of word problems in which a number goes through
STEPS operations in turn; the teacher computes one step per call and carries each printed result into the next.

A fifth field makes a family noisy: ``"arithmetic:N:SEED:TERMS:RATE"`` and ``"chain:N:SEED:STEPS:RATE"`` fault
RATE % of the Python results (`arpo_env.faults`: an interrupted cell, or a stale number that is the one passed in),
and ``"noisy"`` is the chain family with a quarter of its results faulty by default. The teacher notices each fault
and runs the cell again, so its traces teach a model to check what a tool returns.

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


def with_faults(tasks: list[Task], rate: int, seed: int) -> list[Task]:
    """`tasks` whose Python results are wrong `rate` % of the time (`arpo_env.faults`): an interrupted cell or a
    stale number. A careful agent checks each result against the number it passed in and runs the cell again; the
    teacher does. Each task has its own fault seed, so the same task meets the same faults on every run."""
    if not rate:
        return tasks
    return [Task(t.question, t.answer, t.id, t.source, t.kind,
                 dict(t.meta, tool_faults={"rate": rate / 100, "seed": f"{seed}-{t.id}"})) for t in tasks]


def noisy_chain_tasks(n: int = 1000, seed: int = 0, steps: int = 3, rate: int = 25) -> list[Task]:
    """`chain_tasks` with faulty results (`with_faults`, a quarter of them by default): ``noisy:N:SEED:STEPS:RATE``."""
    return [Task(t.question, t.answer, t.id.replace("chain-", "noisy-", 1), "noisy", t.kind, t.meta)
            for t in with_faults(chain_tasks(n, seed, steps), rate, seed)]


FAMILIES = {"arithmetic": (lambda n=1000, seed=0, terms=3, rate=0: with_faults(arithmetic_tasks(n, seed, terms=terms),
                                                                              rate, seed), "terms", 3),
            "chain": (lambda n=1000, seed=0, steps=3, rate=0: with_faults(chain_tasks(n, seed, steps), rate, seed),
                      "steps", 3),
            "noisy": (noisy_chain_tasks, "steps", 3)}
"""Procedural families: generator, the name of its difficulty argument, its default."""
OPTIONS = {"arithmetic": ("rate", 0, 0, 100), "chain": ("rate", 0, 0, 100), "noisy": ("rate", 25, 0, 100)}
"""The fifth field: the percent of faulty tool results (`with_faults`), its default and bounds."""
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
    fields = [("N", "n", 1000, 1, MAX_TASKS), ("SEED", "seed", 0, None, None),
              (level.upper(), level, default, 1, MAX_LEVEL)]
    if parts[0] in OPTIONS:
        option, fallback, low, high = OPTIONS[parts[0]]
        fields.append((option.upper(), option, fallback, low, high))
    form = parts[0] + "".join(f"[:{what}" for what, *_ in fields) + "]" * len(fields)
    example = ":".join([parts[0], "200", "7"] + [str(fallback) for *_, fallback, _, _ in fields[2:]])
    if len(parts) > len(fields) + 1:  # a procedural name, not a file: say what is wrong with it
        raise BadDatasetName(f"dataset {name!r}: more than {', '.join(w for w, *_ in fields)} after {parts[0]} "
                             f"({form}, e.g. {example})")
    values = {}
    for i, (what, key, fallback, low, high) in enumerate(fields, 1):
        text = parts[i].strip() if len(parts) > i else ""
        try:
            value = int(text) if text else fallback
        except ValueError:
            value = None
        if value is None or (low is not None and not low <= value <= high):
            bounds = f" from {low:,} to {high:,}" if low is not None else ""
            raise BadDatasetName(f"dataset {name!r}: {what} must be a whole number{bounds}, not {text!r} "
                                 f"({form}, e.g. {example})")
        values[key] = value
    return generate, values


def procedural_tasks(name: str) -> list[Task] | None:
    """The tasks a procedural dataset name stands for (`parse_name`), or None if it names no family. They are made
    once per name and process: every environment of a rollout is made from the name, and 1,000 tasks took 25 ms to
    make each time (5,000: 120 ms)."""
    parsed = parse_name(name)
    return None if parsed is None else list(_made(parsed[0], tuple(sorted(parsed[1].items()))))


@functools.lru_cache(maxsize=16)
def _made(generate: Any, kwargs: tuple[tuple[str, int], ...]) -> tuple[Task, ...]:
    return tuple(generate(**dict(kwargs)))


def teacher_action(task: Task, outputs: list[str]) -> str | None:
    """The teacher's next Python call, given what its earlier calls printed (first lines); None when it can answer.
    A result that `arpo_env.faults.looks_faulty` (an interrupted cell, or the number it passed in coming back) is
    not taken: the teacher says why and runs the same cell again."""
    code, value, step, note = _teacher_state(task, outputs)
    if code is None:
        return None
    if note:
        return f"<think>{note} I run the cell again.</think>\n<python>{code}</python>"
    if task.source in ("chain", "noisy"):
        op, k = task.meta["ops"][step]
        return f"<think>Step {step + 1}: {value} {op} {k}.</think>\n<python>{code}</python>"
    expr = _expression(task)
    return f"<think>I will compute {expr} with Python.</think>\n<python>{code}</python>"


def teacher_answer(task: Task, outputs: list[str]) -> str:
    """The value the teacher answers with after `outputs`: its last accepted result."""
    return _teacher_state(task, outputs)[1]


def _expression(task: Task) -> str:
    return task.meta.get("expression") or task.question.removeprefix("What is ").rstrip("?")


def _teacher_state(task: Task, outputs: list[str]) -> tuple[str | None, str, int, str]:
    """(the next cell or None, the value carried so far, the steps done, why the last result was not taken or "")."""
    from arpo_env.faults import looks_faulty

    chain = task.source in ("chain", "noisy")
    steps = len(task.meta["ops"]) if chain else 1
    value, step, note = str(task.meta["start"]) if chain else "", 0, ""
    for out in outputs:
        code = _cell(task, step, value)
        fault = looks_faulty(code, out)
        if fault:
            note = ("The cell did not run." if fault == "error"
                    else f"{out.strip()} is the number I passed in, so that result is stale.")
            continue
        value, step, note = out.strip(), step + 1, ""
    return (None if step == steps else _cell(task, step, value)), value, step, note


def _cell(task: Task, step: int, value: str) -> str:
    if task.source in ("chain", "noisy"):
        op, k = task.meta["ops"][step]
        return f"print({value} {op} {k})"
    return f"print({_expression(task)})"


def scripted_episode(env: Any, task: Task) -> dict[str, Any]:
    """Play `task` in `env` (unwrapped `ToolEnv`) as the teacher; return the messages, segments and reward. The
    observations are the sandbox's real output, and each call reads the value the previous one printed."""
    _, info = env.reset(options={"question": task.question, "answer": task.answer, "kind": task.kind,
                                 "source": task.source, "meta": task.meta})
    segments: list[tuple[str, str]] = []
    outputs: list[str] = []
    ended, reward, end = False, 0.0, {}
    while (action := teacher_action(task, outputs)) is not None:
        obs, reward, terminated, truncated, end = env.step(action)
        segments += [("action", action), ("observation", obs)]
        if terminated or truncated:  # the tool budget ran out on retries
            ended = True
            break
        lines = obs.replace("<result>", "").replace("</result>", "").strip().splitlines()
        outputs.append(lines[0] if lines else "")
    if not ended:
        value = teacher_answer(task, outputs)
        final = f"\n<think>The result is {value}.</think>\n<answer>\\boxed{{{value}}}</answer>"
        _, reward, terminated, truncated, end = env.step(final)
        segments.append(("action", final))
    return {"messages": info["messages"], "segments": segments, "reward": reward,
            "reward_parts": end.get("reward_parts", {}), "task": task.as_dict()}
