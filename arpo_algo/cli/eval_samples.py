"""`arpo eval`'s samples as trees `arpo view` draws: one tree per question, one trajectory per run.

A sample record (`arpo_algo.cli.eval.runner.sample_record`) keeps the transcript as text. Its tool results are the
``<result>…</result>`` blocks the env appended, so the transcript splits back into the model's turns and the tools'
outputs. The score becomes the trajectory's reward, and the reward parts say why: the prediction read from the
transcript, the gold answer, the format errors, whether a judge scored it, and any error.
"""

from __future__ import annotations

import re
from typing import Any

RESULT = re.compile(r"(\n?<result>.*?</result>\n?)", re.DOTALL)


def is_sample(record: Any) -> bool:
    """Whether a JSONL record is one of `arpo eval`'s samples (not a rollout tree)."""
    return isinstance(record, dict) and "benchmark" in record and "index" in record and "nodes" not in record


def segments(transcript: str) -> list[dict[str, Any]]:
    """The transcript as the tree's segments: the model's text, and each tool result apart."""
    parts = [p for p in RESULT.split(transcript or "") if p]
    return [{"kind": "tool" if RESULT.fullmatch(p) else "model", "text": p, "start": 0, "end": 0} for p in parts]


def why(record: dict[str, Any]) -> str:
    """One line on how the sample was scored."""
    if record.get("error"):
        return f"not scored: {record['error']}"
    if record.get("scoring_errors"):  # our scoring gave no verdict: left out of pass@1
        return f"no verdict: {record['scoring_errors'][0]}"
    prediction, gold = record.get("prediction"), record.get("gold")
    if prediction is None:
        errors = record.get("format_errors") or []
        return "no answer read (no \\boxed{} or <answer>)" + (f"; format: {'; '.join(map(str, errors))}"
                                                               if errors else "")
    verdict = "matches" if record.get("correct") else "does not match"
    by = {True: " (the judge)", False: " (F1: the judge was unreachable)"}.get(record.get("judged"), "")
    return f"answer {str(prediction)[:200]!r} {verdict} the gold {str(gold)[:200]!r}{by}"


def trees(records: list[dict[str, Any]], file: str) -> list[dict[str, Any]]:
    """One tree per (benchmark, index), its runs as independent trajectories; a later record of the same sample
    (made again, or judged again) replaces an earlier one, as `arpo eval` reads them."""
    latest: dict[tuple[str, int, int], dict[str, Any]] = {}
    for rec in records:
        latest[(str(rec.get("benchmark")), _int(rec.get("index")), _int(rec.get("run")))] = rec
    by_question: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for (bench, index, _), rec in sorted(latest.items()):
        by_question.setdefault((bench, index), []).append(rec)
    out = []
    for (bench, index), runs in by_question.items():
        first = runs[0]
        trajectories = []
        for n, rec in enumerate(runs):
            score = rec.get("score") if isinstance(rec.get("score"), (int, float)) else 0.0
            parts = {"score": score, "correct": bool(rec.get("correct")), "format_ok": bool(rec.get("format_ok")),
                     "prediction": rec.get("prediction"), "gold": _text(rec.get("gold")), "why": why(rec),
                     "run": rec.get("run")}
            if rec.get("error"):
                parts["error"] = str(rec["error"])
            trajectories.append({"node": n, "segments": segments(str(rec.get("transcript") or "")),
                                 "entropies": [], "completion_ids": [], "reward": float(score), "reward_parts": parts,
                                 "tool_calls": _int(rec.get("tool_calls")), "truncated": bool(rec.get("truncated")),
                                 "decisions": []})
        out.append({"task": {"id": f"{bench}#{index}", "source": bench, "question": first.get("question"),
                             "answer": _text(first.get("gold"))},
                    "algo": "eval", "stats": {"file": file, "benchmark": bench, "index": index},
                    "nodes": [{"id": n, "parent": None, "start": 0, "kind": "global"} for n in range(len(runs))],
                    "trajectories": trajectories})
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: Any) -> str | None:
    return None if value is None else value if isinstance(value, str) else str(value)
