"""Tasks as rows of a `datasets.Dataset` for TRL, and rows back into an env's reset options.

`task_dataset` makes the dataset an `ARPOTrainer` (or TRL's `GRPOTrainer`) samples prompts from; `row_task` reads a
row of it, or of any dataset with a question and a gold answer, back into the task the env resets to.
"""

from __future__ import annotations

import json
from typing import Any

from arpo_env.datasets.loaders import (
    GOLD_WORDS,
    QUESTION_FIELDS,
    check_limit,
    gold_value_text,
    named_fields,
    record_gold,
    record_question,
)
from arpo_env.scoring.qa_metrics import aliases, missing


def task_dataset(env_id: str = "ARPO-Math-v0", limit: int | None = None, **env_kwargs: Any) -> Any:
    """The tasks of ``gym.make(env_id, **env_kwargs)`` as a `datasets.Dataset` TRL can sample (``pip install
    datasets``, part of the train extra): a conversational ``prompt`` (for TRL's logs), and the task record —
    ``question``, ``answer`` (JSON: a string, or a QA task's list of aliases), ``task_id``, ``source``, ``kind``,
    ``meta`` (JSON) — that `row_task` turns back into the env's reset options. `limit`: the first so many tasks (at
    least 1; None: all)."""
    check_limit(limit)
    import gymnasium as gym
    from datasets import Dataset

    import arpo_env  # noqa: F401 - registers the ids

    env = gym.make(env_id, **env_kwargs).unwrapped
    tasks = env.tasks[:limit]
    env.close()
    return Dataset.from_list([
        {"prompt": [{"role": "user", "content": t.question}], "question": t.question,
         "answer": json.dumps(t.answer, ensure_ascii=False), "task_id": t.id, "source": t.source, "kind": t.kind,
         "meta": json.dumps(t.meta, ensure_ascii=False)}
        for t in tasks])


def row_task(row: dict[str, Any]) -> dict[str, Any]:
    """The env's reset options for a dataset row: one of `task_dataset`, or any row with a question and a gold answer
    read as `load_tasks` reads a file's records (`record_question`, `record_gold`: ``problem``, a conversational
    ``prompt``'s last user turn, ``ground_truth``, ``reward_model.ground_truth``, a ``solution``'s ``\\boxed{}``, …).
    A row without either, or with a blank gold, is a `ValueError` naming its fields (a gold read as missing trained on
    a reward of 0)."""
    answer = row.get("answer")
    if missing(answer):  # (None, NaN, blank: another gold field may hold it, as in a file's record)
        answer = record_gold(row)
        if answer is None:
            raise ValueError(f"a dataset row needs a gold answer ({GOLD_WORDS}){named_fields(row)}")
    elif isinstance(answer, str) and answer[:1] in '["':
        # `task_dataset` stores answers as JSON (a string, or a QA task's list of aliases). A plain math answer
        # that merely looks like a list ("[-2,0]", an interval) stays what it is.
        try:
            decoded = json.loads(answer)
        except ValueError:
            decoded = answer
        from_task_dataset = "task_id" in row  # every answer there is JSON-encoded, lists included
        if isinstance(decoded, str) or (isinstance(decoded, list) and (row.get("kind") == "qa" or from_task_dataset)):
            answer = decoded
    if isinstance(answer, float):
        answer = gold_value_text(answer)
    if not aliases(answer):  # every answer would score 0: a reward that teaches nothing, silently
        raise ValueError(f"a dataset row's gold answer is blank ({answer!r}): no answer could be scored right")
    question = row.get("question") if row.get("question") is not None else record_question(row)
    if question is None:
        raise ValueError(f"a dataset row needs a question ({QUESTION_FIELDS}){named_fields(row)}")
    meta = row.get("meta") or {}
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            raise ValueError(f"a dataset row's meta is a JSON object (as task_dataset writes it) or a mapping, not "
                             f"{row['meta'][:200]!r}")
    return {"question": question, "answer": answer, "id": row.get("task_id", ""), "source": row.get("source", ""),
            "kind": row.get("kind", ""), "meta": meta}
