"""The results of ``arpo eval``: per-benchmark summaries, and the table in the paper's layout beside its numbers."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from arpo_algo.cli.eval.benchmarks import GROUPS, Benchmark, metric_label
from arpo_algo.cli.eval.runner import count_of


# The table ------------------------------------------------------------------------------------------------------------
def summarise(results: dict[str, list[dict[str, Any]]], runs: int) -> dict[str, dict[str, float]]:
    from arpo_env.scoring.failures import is_timeout

    summary = {}
    for name, recs in results.items():
        # a sample our scoring could not judge (an error, a timeout) is no wrong answer: out of pass@1, counted
        per_run = [[r["score"] for r in recs if r["run"] == k and not r.get("scoring_errors")] for k in range(runs)]
        unscored = [r["scoring_errors"] for r in recs if r.get("scoring_errors")]
        means = [100 * statistics.fmean(x) for x in per_run if x]
        summary[name] = {"pass@1": statistics.fmean(means) if means else math.nan,
                         "spread": statistics.stdev(means) if len(means) > 1 else 0.0,
                         "tool_calls": statistics.fmean(r["tool_calls"] for r in recs) if recs else 0.0,
                         "samples": len(recs) // max(runs, 1), "errors": sum(r.get("error") is not None
                                                                              for r in recs),
                         "format_failures": 100 * statistics.fmean(not r.get("format_ok", False) for r in recs)
                         if recs else 0.0,
                         "judge_fallbacks": sum(r.get("judged") is False for r in recs),
                         "scoring_errors": sum(not any(map(is_timeout, notes)) for notes in unscored),
                         "scoring_timeouts": sum(any(map(is_timeout, notes)) for notes in unscored)}
    return summary


def paper_rows(path: Path, model: str) -> list[tuple[str, dict[str, float]]]:
    """Rows of the paper's Table 1 whose base model matches `model` (by name, case-insensitively)."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter="\t")
        for column in ("model", "method"):  # checked on the header: a file of one line (no rows) is no table
            if column not in (reader.fieldnames or ()):
                raise KeyError(column)
        for row in reader:
            if row["model"].lower() in model.lower() or model.lower() in row["model"].lower():
                rows.append((f"paper: {row['method']}", {k: float(v) for k, v in row.items()
                                                          if k not in ("model", "method") and v}))
    return rows


def paper_table_problem(exc: Exception) -> str:
    """What `paper_rows` could not read, in words."""
    if isinstance(exc, KeyError):
        return f"no {exc} column: it needs tab-separated columns model, method and one per benchmark"
    if isinstance(exc, TypeError):
        return "a row has more values than the header has columns"
    if isinstance(exc, ValueError) and not isinstance(exc, UnicodeError):
        return f"a benchmark's value is not a number ({exc})"
    return str(exc) or type(exc).__name__


def table(summary: dict[str, dict[str, float]], benchmarks: list[Benchmark], judge: str | None, label: str,
          runs: int, compare: list[tuple[str, dict[str, float]]] = ()) -> tuple[str, list[list[str]]]:
    """Markdown in the paper's layout (groups, their averages, the overall average) and the same as CSV rows."""
    columns: list[tuple[str, Any]] = []
    for group in GROUPS:
        members = [b for b in benchmarks if b.group == group]
        columns += [(b.column, b) for b in members]
        if len(members) > 1:
            columns.append((f"{group} avg", [b.name for b in members]))
    columns.append(("avg", [b.name for b in benchmarks]))

    def cells(values: dict[str, float], spread: dict[str, float] | None) -> list[str]:
        out = []
        for _, col in columns:
            if isinstance(col, Benchmark):
                v = values.get(col.name)
                s = spread.get(col.name) if spread else None
                out.append("–" if v is None else f"{v:.1f}" + (f" ± {s:.1f}" if s else ""))
            else:
                vs = [values[n] for n in col if n in values]
                out.append(f"{statistics.fmean(vs):.1f}" if vs else "–")
        return out

    ours = {n: v["pass@1"] for n, v in summary.items()}
    header = ["model"] + [name for name, _ in columns]
    rows = [[label] + cells(ours, {n: v["spread"] for n, v in summary.items()})]
    def per_benchmark(label: str, fmt: Callable[[dict[str, float]], str]) -> list[str]:
        return [label] + [fmt(summary[c.name]) if isinstance(c, Benchmark) and c.name in summary else ""
                          for _, c in columns]

    rows.append(per_benchmark("tool calls / question", lambda v: f"{v['tool_calls']:.2f}"))
    rows.append(per_benchmark("format failures (%)", lambda v: f"{v.get('format_failures', 0.0):.1f}"))
    if judge:
        rows.append(per_benchmark("judge fallbacks (F1)", lambda v: str(int(v.get("judge_fallbacks", 0)))))
    rows.append(per_benchmark("scoring errors / timeouts", lambda v: f"{int(v.get('scoring_errors', 0))} / "
                                                                      f"{int(v.get('scoring_timeouts', 0))}"))
    for name, values in compare:
        rows.append([name] + cells({b.name: values[b.name] for b in benchmarks if b.name in values}, None))
    metrics = ", ".join(f"{b.column}: {metric_label(b, judge)}" for b in benchmarks)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", f"Pass@1 (%) = mean over {runs} run(s)" + (" ± standard deviation of the run means" if runs > 1
                                                         else "") + f". Metrics — {metrics}. The answer is "
           "the last <answer> (else the last \\boxed{}) whatever the format; format failures are the samples that "
           "broke the training format (scored all the same)." + (" Judge fallbacks: samples scored by F1 because "
                                                                  "the judge was unreachable." if judge else "")
           + " Scoring errors and timeouts: samples our scoring could give no verdict on (an exception in it, or "
           "past its time bound); they are left out of pass@1.", ""]
    md += [f"- {b.column}: {count_of(summary[b.name]['samples'], 'item')}, "
           f"{count_of(summary[b.name]['errors'], 'error')}, "
           f"{summary[b.name]['tool_calls']:.2f} tool calls per question, "
           f"{summary[b.name].get('format_failures', 0.0):.1f}% format failures"
           + (f", {int(summary[b.name].get('judge_fallbacks', 0))} judge fallbacks" if judge else "")
           + (f", {count_of(int(summary[b.name].get('scoring_errors', 0)), 'scoring error')} and "
              f"{count_of(int(summary[b.name].get('scoring_timeouts', 0)), 'scoring timeout')} (out of pass@1)"
              if summary[b.name].get("scoring_errors") or summary[b.name].get("scoring_timeouts") else "")
           for b in benchmarks if b.name in summary]
    return "\n".join(md), [header, *rows]


PAPER_TABLE = Path(__file__).with_name("paper_table1.tsv")
