"""The paper's 13 benchmarks: their names, groups, metrics and the data each needs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str
    column: str
    group: str
    env_id: str
    metric: str
    """"math" (math-verify), "f1", or "judge" (LLM judge when --judge is given, else F1)."""
    default_limit: int | None = None


GROUPS = {"mathematical": "Mathematical reasoning", "knowledge": "Knowledge-intensive reasoning",
          "deepsearch": "Deep search"}
"""Group names, distinct from every benchmark name (``math`` is the MATH benchmark, ``mathematical`` its group)."""
BENCHMARKS = {b.name: b for b in [
    Benchmark("aime24", "AIME24", "mathematical", "ARPO-Math-v0", "math"),
    Benchmark("aime25", "AIME25", "mathematical", "ARPO-Math-v0", "math"),
    Benchmark("math500", "MATH500", "mathematical", "ARPO-Math-v0", "math"),
    Benchmark("gsm8k", "GSM8K", "mathematical", "ARPO-Math-v0", "math", 500),
    Benchmark("math", "MATH", "mathematical", "ARPO-Math-v0", "math", 500),
    Benchmark("webwalker", "WebWalker", "knowledge", "ARPO-QA-v0", "judge"),
    Benchmark("hotpotqa", "HotpotQA", "knowledge", "ARPO-QA-v0", "f1"),
    Benchmark("2wiki", "2Wiki", "knowledge", "ARPO-QA-v0", "f1"),
    Benchmark("musique", "MuSiQue", "knowledge", "ARPO-QA-v0", "f1"),
    Benchmark("bamboogle", "Bamboogle", "knowledge", "ARPO-QA-v0", "f1"),
    Benchmark("gaia", "GAIA", "deepsearch", "ARPO-DeepSearch-v0", "judge"),
    Benchmark("hle", "HLE", "deepsearch", "ARPO-DeepSearch-v0", "judge"),
    Benchmark("xbench", "xbench", "deepsearch", "ARPO-DeepSearch-v0", "judge"),
]}
NEEDS_DATA_DIR = {"gaia": "GAIA (https://huggingface.co/datasets/gaia-benchmark/GAIA, gated: accept its terms)",
                  "hle": "HLE (https://huggingface.co/datasets/cais/hle, gated: accept its terms)"}


def select(spec: str) -> list[Benchmark]:
    """``all``, group names (mathematical, knowledge, deepsearch) and benchmark names, comma-separated. Every
    benchmark is selected by its own name (``math`` is the MATH benchmark alone)."""
    names: list[str] = []
    for part in [p.strip().lower() for p in spec.split(",") if p.strip()]:
        if part == "all":
            names += list(BENCHMARKS)
        elif part in BENCHMARKS:
            names.append(part)
        elif part in GROUPS:
            names += [b.name for b in BENCHMARKS.values() if b.group == part]
        else:
            raise SystemExit(f"arpo eval: unknown benchmark {part!r}. Known: {', '.join(BENCHMARKS)}; groups: "
                             f"{', '.join(GROUPS)}, all")
    if not names:  # an empty --benchmarks ran nothing and wrote an empty table, silently
        raise SystemExit(f"arpo eval: --benchmarks names no benchmark ({spec!r}). Known: {', '.join(BENCHMARKS)}; "
                         f"groups: {', '.join(GROUPS)}, all")
    return [BENCHMARKS[n] for n in dict.fromkeys(names)]


def metric_label(bench: Benchmark, judge: str | None) -> str:
    return {"math": "math-verify", "f1": "F1"}.get(bench.metric, "judge" if judge else "F1 (no judge)")
