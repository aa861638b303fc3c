"""The ``arpo eval`` command: its flags, the checks before anything runs, and the run."""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from arpo_algo import jsonl
from arpo_algo.cli.eval.benchmarks import BENCHMARKS, NEEDS_DATA_DIR, Benchmark, select
from arpo_algo.cli.eval.report import PAPER_TABLE, paper_rows, paper_table_problem, summarise, table
from arpo_algo.cli.eval.runner import (
    OpenAIRunner,
    RolloutRunner,
    ServerRefused,
    Settings,
    dataset_questions,
    env_kwargs,
    evaluate,
)
from arpo_algo.flags import Parser
from arpo_algo.generation.factory import model_files


# Command line ---------------------------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="arpo eval", description="Evaluate a model on the ARPO paper's benchmarks.")
    p.add_argument("--model", required=True, help="hub id, local path, smollm2-135m, or the served model's name")
    p.add_argument("--backend", choices=["hf", "vllm", "openai"], default="hf")
    p.add_argument("--base_url", default="http://127.0.0.1:8000/v1", help="openai backend: the endpoint")
    p.add_argument("--api_key", default=None, help="openai backend: the key (or $OPENAI_API_KEY)")
    p.add_argument("--benchmarks", default="all",
                   help="comma-separated benchmark names (" + ", ".join(BENCHMARKS) + "), groups (mathematical = "
                        "aime24..math, knowledge = webwalker..bamboogle, deepsearch = gaia, hle, xbench) or all; "
                        "'math' is the MATH benchmark alone")
    p.add_argument("--data_dir", default=None, help="folder with one sub-folder per benchmark")
    p.add_argument("--limit", type=int, default=None, help="items per benchmark (default: 500 for gsm8k and math, "
                                                          "all elsewhere; 0: all)")
    p.add_argument("--runs", type=int, default=1, help="K: pass@1 is the mean over K runs")
    p.add_argument("--mode", choices=["tir", "direct"], default="tir", help="tool-integrated, or no tools")
    p.add_argument("--transcript", choices=["continue", "messages"], default="continue",
                   help="openai backend: the episode as one assistant message that the server continues (vLLM, "
                        "SGLang: the tokens the model trained on), or each tool result a user message (chat APIs "
                        "that cannot continue a message)")
    p.add_argument("--judge", default=None, help="OpenAI-compatible URL of an LLM judge (WebWalker, deep search)")
    p.add_argument("--judge_model", default=None, help="the judge's model name (default: the one its endpoint "
                                                       "serves)")
    p.add_argument("--search", default="local", help="search backend for QA: local (offline BM25), ddgs (live), or "
                   "recorded:PATH[:local|ddgs] (replay of a recording such as the release's search_cache.json, "
                   "unrecorded queries to the backend after it)")
    p.add_argument("--server_url", default=None, help="run the envs on arpo serve servers (URLs, comma-separated; "
                   "token in $ARPO_SERVE_TOKEN): the servers hold the data and set the sandbox and search")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top_p", type=float, default=0.95)
    p.add_argument("--max_tool_calls", type=int, default=None, help="default: 5 for math, 10 for search tasks")
    p.add_argument("--max_new_tokens", type=int, default=None,
                   help=f"tokens per turn (default {PAPER_BUDGET[0]}; {CPU_BUDGET[0]} with the hf backend on a CPU)")
    p.add_argument("--max_completion_tokens", type=int, default=None,
                   help=f"tokens per episode (default {PAPER_BUDGET[1]}; {CPU_BUDGET[1]} with the hf backend on a CPU)")
    p.add_argument("--concurrency", type=int, default=16, help="samples generated together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", choices=["paper"], default=None, help="print the paper's numbers beside ours")
    p.add_argument("--paper_table", default=None, help="the paper's Table 1 as TSV (default: the packaged copy)")
    p.add_argument("--out", default=None, help="output folder for samples.jsonl, results.md, results.csv and "
                   "summary.json (default: runs/eval/MODEL); running again with the same folder resumes")
    return p


PAPER_BUDGET = (1024, 8192)
"""Tokens per turn and per episode: the evaluation budget on a GPU."""
CPU_BUDGET = (512, 2048)
"""The budget when transformers generates on a CPU, where the paper's budget makes an untuned small model (which
writes until it is cut off) take tens of minutes per handful of questions. Both flags override it."""


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def token_budget(args: argparse.Namespace) -> tuple[int, int]:
    default = CPU_BUDGET if args.backend == "hf" and on_cpu() else PAPER_BUDGET
    return (default[0] if args.max_new_tokens is None else args.max_new_tokens,  # 0 is refused, not the default
            default[1] if args.max_completion_tokens is None else args.max_completion_tokens)


def default_out(model: str) -> Path:
    name = Path(model.rstrip("/")).name or "model"
    return Path("runs") / "eval" / re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def make_runner(args: argparse.Namespace) -> Any:
    import os

    if args.backend == "openai":
        return OpenAIRunner(args.base_url, args.model, args.api_key or os.environ.get("OPENAI_API_KEY"),
                            workers=args.concurrency, transcript=args.transcript)
    from arpo_algo.generation.factory import make_generator

    return RolloutRunner(make_generator(args.model, args.backend))


def judge_served(s: Settings, benchmarks: list[Benchmark]) -> str | None:
    """The model the judge's endpoint serves when ``--judge_model`` names none and a selected benchmark is judged:
    asked before any sample, so that `same_settings` tells a run judged by another model at the same URL from this
    one (it was asked at the first judged sample and kept nowhere). None when it cannot be asked now (the judge is
    down: its samples are scored by F1 until it is up)."""
    if not s.judge or s.judge_model or not any(b.metric == "judge" for b in benchmarks):
        return None
    from arpo_env.scoring.judge import shared_judge

    model, why = shared_judge(s.judge, None).served_model()
    if model is None:
        print(f"arpo eval: the judge at {s.judge} could not say which model it serves ({why}); its samples are scored "
              "by F1 while it is down", file=sys.stderr)
    return model


def same_settings(out: Path, settings: dict[str, Any]) -> None:
    """Samples already in `out` are reused (a run resumes), so they must have been made the same way: the model and
    every setting that changes a sample (`Settings`; not the backend, the batch or how many items and runs) are kept in
    ``out/settings.json`` by the run that began the samples, and while there are samples a run with others is refused,
    saying which differ. Before, a run with ``--mode direct`` or another temperature into the folder of an earlier one
    reported its samples as its own; and so did a run of a model trained again into the folder of the one evaluated
    before (`model_files`), and one judged by another model served at the same URL (`judge_served`)."""
    path, samples = out / "settings.json", out / "samples.jsonl"
    if path.exists() and samples.exists() and samples.stat().st_size:
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            kept = None
        if isinstance(kept, dict):
            def said(k: str, v: Any) -> str:
                if k == "model_files":
                    return f"the files of {settings.get('model')} changed since (trained or saved again)"
                if k == "judge_served":
                    return f"the judge at {settings.get('judge')} serves {v!r}, not {kept[k]!r}"
                return f"{k} {kept.get(k)!r} → {v!r}"

            same_source = {"model_files": "model", "judge_served": "judge"}  # else the name or URL differs already
            differ = [said(k, v) for k, v in settings.items() if k in kept and kept[k] != v
                      and not (k in same_source and kept.get(same_source[k]) != settings.get(same_source[k]))
                      and not (k == "judge_served" and None in (v, kept[k]))]  # None: the judge was down
            if differ:
                raise SystemExit(f"arpo eval: {out} holds samples made with other settings ({', '.join(differ)}): "
                                 f"give another --out, or delete {out / 'samples.jsonl'} to start again")
            if kept.get("judge_served", "") is None and settings.get("judge_served") is not None \
                    and kept.get("judge") == settings.get("judge"):  # down when the samples began: known from now on
                try:
                    path.write_text(json.dumps({**kept, "judge_served": settings["judge_served"]}, indent=1) + "\n",
                                    encoding="utf-8")
                except OSError as exc:
                    raise unwritable(out, exc) from None
            return
    try:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:  # a file where the folder should be, no permission: one line, before any sample is made
        raise unwritable(out, exc) from None


def unwritable(out: Path, exc: OSError) -> SystemExit:
    """Why the folder `out` cannot take the results, as `arpo eval`'s one line."""
    what = "is a file, not a folder" if out.is_file() else f"cannot be written ({exc.strerror or exc})"
    return SystemExit(f"arpo eval: --out {out} {what}: give a folder for the results")


def _line_count(path: Path) -> int:
    """The lines of `path`, 0 if it is not there; bytes that are not UTF-8 are no UnicodeDecodeError traceback."""
    if not path.exists():
        return 0
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    benchmarks = select(args.benchmarks)
    for b in benchmarks:
        if b.name in NEEDS_DATA_DIR and not args.data_dir:
            raise SystemExit(f"arpo eval: {b.name} needs --data_dir: {NEEDS_DATA_DIR[b.name]} is not shipped with "
                             f"arpo. Download it and put its test set at DATA_DIR/{b.name}/test.jsonl.")
    max_new, max_completion = token_budget(args)
    from arpo_algo.core.config import sampling_problems

    flags = ("--max_new_tokens", "--max_completion_tokens", "--temperature", "--top_p", "", "", "")
    problems = sampling_problems(max_new, max_completion, args.temperature, args.top_p, 1, 0.0, 0.0, flags)
    problems += [f"{flag} must be at least {low}, not {value}" for flag, value, low in (
        ("--runs", args.runs, 1), ("--limit", args.limit, 0), ("--concurrency", args.concurrency, 1),
        ("--max_tool_calls", args.max_tool_calls, 0), ("--seed", args.seed, 0)) if value is not None and value < low]
    from urllib.parse import urlsplit

    # A --judge that is no URL is refused now: it would be "unreachable" at every sample, each scored by F1
    urls = [("--judge", args.judge)] + [("--base_url", args.base_url)] * (args.backend == "openai")
    problems += [f"{flag} must be the http(s) URL of an OpenAI-compatible endpoint (http://127.0.0.1:8000/v1), not "
                 f"{url!r}" for flag, url in urls if url is not None and (
                     urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc)]
    from arpo_env.tools.search import BACKENDS

    if args.search.partition(":")[0] not in BACKENDS:  # read only by the search tasks: check it for every run
        problems.append(f"--search must be local, ddgs or recorded:PATH[:local|ddgs], not {args.search!r}")
    elif args.search == "recorded":
        problems.append("--search recorded needs its recording: --search recorded:path/to/search_cache.json "
                        "(:local or :ddgs after it for the queries it lacks)")
    if problems:
        raise SystemExit("arpo eval: " + "; ".join(problems))
    compare = []
    if args.compare == "paper":  # read now, not after the whole evaluation
        table_path = Path(args.paper_table) if args.paper_table else PAPER_TABLE
        try:
            compare = paper_rows(table_path, args.model)
        except (OSError, UnicodeError, csv.Error, KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"arpo eval: --paper_table {table_path}: {paper_table_problem(exc)}") from None
    settings = Settings(args.mode, args.temperature, args.top_p, args.max_tool_calls, max_new, max_completion,
                        args.judge, args.search, args.seed, args.judge_model, args.server_url)
    out = Path(args.out) if args.out else default_out(args.model)
    with jsonl.removed_if_unused(out, lambda: _line_count(out / "samples.jsonl") > 0) as folder:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file where the folder should be, no permission: one line, before any sample
            raise unwritable(out, exc) from None
        with jsonl.sole_writer(out, f"another arpo eval is writing to {out} now: wait for it to end (then this "
                               "command makes only the samples it lacks), or give another --out", folder=True):
            code = run_evaluation(args, benchmarks, settings, out, compare, (max_new, max_completion))
        folder.failed = code != 0  # interrupted (130) before its first sample: the folder goes
    return code


def run_evaluation(args: argparse.Namespace, benchmarks: list[Benchmark], settings: Settings, out: Path,
                   compare: list[tuple[str, dict[str, float]]], budget: tuple[int, int]) -> int:
    """`main` past its checks, with ``out`` held by this process alone (`jsonl.sole_writer`)."""
    max_new, max_completion = budget
    print(f"arpo eval: {args.model} ({args.backend}) on {', '.join(b.name for b in benchmarks)} → {out}\n"
          f"  sampling    temperature {settings.temperature}, top-p {settings.top_p}, {max_new} tokens per turn, "
          f"{max_completion} per episode, {args.runs} run{'s' * (args.runs != 1)}", file=sys.stderr)
    if args.backend == "hf" and on_cpu():
        print(f"  on a CPU    a sample can take up to {max_completion:,} tokens: minutes for a model that writes until "
              "it is cut off. --limit N, --max_completion_tokens and --max_new_tokens bound it; the bar shows the "
              "tokens per second", file=sys.stderr)
    start = time.perf_counter()
    # read before the model loads: data that is missing or unreadable is a line, not a wait for one
    questions = {b.name: dataset_questions(b, env_kwargs(b, args.data_dir, settings)) for b in benchmarks}
    same_settings(out, {"model": args.model, **asdict(settings), "model_files": model_files(args.model, args.backend),
                        "judge_served": judge_served(settings, benchmarks)})
    runner = make_runner(args)
    saved = out / "samples.jsonl"
    before = _line_count(saved)
    try:
        results = evaluate(benchmarks, runner, args.data_dir, args.limit, args.runs, settings, out,
                           chunk=args.concurrency, questions=questions)
    except KeyboardInterrupt:
        n = _line_count(saved)
        print(f"\narpo eval: interrupted; {n} finished samples are in {saved}. Run the same command again to do "
              "only the missing ones.", file=sys.stderr)
        return 130
    except ServerRefused as exc:
        raise SystemExit(f"arpo eval: the model's server: {exc}") from None
    finally:
        runner.close()  # a vLLM engine of its own ends now, not at the interpreter's exit; a server's connections too
    summary = summarise(results, args.runs)
    if args.compare == "paper" and not compare:
        print(f"arpo eval: the paper reports no numbers for {args.model}; its base models are "
              "Qwen2.5-3B-Instruct, Llama3.1-8B-Instruct and Qwen2.5-7B-Instruct", file=sys.stderr)
    label = f"{args.model} ({args.mode})"
    md, rows = table(summary, benchmarks, args.judge, label, args.runs, compare)
    backend = args.backend + (f" (transcript: {args.transcript})" if args.backend == "openai" else "")
    md += (f"\n\nSettings: backend {backend}, mode {settings.mode}, temperature {settings.temperature}, top-p "
           f"{settings.top_p}, tool calls per episode {settings.max_tool_calls or '5 (math) / 10 (search tasks)'}, "
           f"{max_new} tokens per turn, {max_completion} per episode, seed {settings.seed}.")
    (out / "results.md").write_text(md + "\n", encoding="utf-8")
    with open(out / "results.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    (out / "summary.json").write_text(json.dumps({"benchmarks": summary, "settings": {
        "model": args.model, "backend": args.backend, **asdict(settings), "runs": args.runs, "limit": args.limit}},
        indent=1))
    done = _line_count(saved) - before
    total = sum(len(r) for r in results.values())
    print("\n" + md + f"\n\n{total} sample{'s' * (total != 1)}"
          + ("" if done >= total else " (all from an earlier run)" if done <= 0 else
             f" ({done} run now, the rest from an earlier run)")
          + f" in {time.perf_counter() - start:.0f} s → {out / 'samples.jsonl'}, {out / 'results.md'}, "
          f"{out / 'results.csv'}")
    return 0
