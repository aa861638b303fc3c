r"""``arpo eval``: the paper's 13 benchmarks, one command, a table in the paper's layout.

Every sample is an episode of the matching environment — math (`ARPO-Math-v0`, Python), knowledge QA
(`ARPO-QA-v0`, search and Python) or deep search (`ARPO-DeepSearch-v0`, search, browse and Python) — with the
paper's evaluation settings unless overridden: temperature 0.6, top-p 0.95, up to 5 tool calls for math and 10
for the search tasks, 500 items for GSM8K and MATH, all items elsewhere. ``--mode direct`` is the no-tool baseline.

How each column is scored (the table says which was used):

* math (AIME24, AIME25, MATH500, GSM8K, MATH): math-verify equivalence of the boxed answer with the gold one;
* HotpotQA, 2Wiki, MuSiQue, Bamboogle: token F1 against the best gold alias;
* WebWalker, GAIA, HLE, xbench: an LLM judge (``--judge URL``, an OpenAI-compatible endpoint), else F1;
  HLE's multiple-choice items compare the option: its letter, or the whole text of one option.

The answer is extracted as the benchmarks do, whatever the transcript's format: the last ``<answer>`` (its
``\boxed{}``), else the last ``\boxed{}`` the model wrote (never one inside a tool result), with ``\text{…}`` and
similar wrappers unwrapped before QA and multiple-choice scoring. A transcript that breaks the training format is
still scored, and counted in the table's *format failures* column (the training reward's −1 gate is the env's,
not the benchmark's). With ``--judge``, samples whose judge was unreachable (or answered neither correct nor
incorrect) are scored by F1 and counted as *judge fallbacks*. Pass@1 is the mean over ``--runs`` K runs; the
spread is the standard deviation of the K run means. Results: ``samples.jsonl`` (one line per sample and run, with
the full transcript; appended, so a run that is stopped and started again only does the missing samples),
``results.md`` and ``results.csv``.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from arpo_algo import jsonl
from arpo_env.tags import eval_answer


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


# Episodes -----------------------------------------------------------------------------------------------------------
@dataclass
class Settings:
    mode: str = "tir"
    temperature: float = 0.6
    top_p: float = 0.95
    max_tool_calls: int | None = None
    """None: 5 for math, 10 for the search tasks."""
    max_new_tokens: int = 1024
    max_completion_tokens: int = 8192
    judge: str | None = None
    search: str = "local"
    seed: int = 0
    judge_model: str | None = None
    """None: the model the judge's endpoint serves."""


def env_kwargs(bench: Benchmark, data_dir: str | None, s: Settings, out: Path | None = None) -> dict[str, Any]:
    """gym.make keyword arguments for a benchmark; `out`, the output folder, is hidden from the sandbox (its samples
    hold the gold answers)."""
    kwargs: dict[str, Any] = {"dataset": bench.name, "data_dir": data_dir}
    kwargs["max_tool_calls"] = s.max_tool_calls or (5 if bench.group == "mathematical" else 10)
    if s.mode == "direct":  # no tools, nor their options
        kwargs["tools"] = ()
        return kwargs
    if out is not None:
        kwargs["sandbox_options"] = {"hidden_paths": (str(Path(out).resolve()),)}
    if bench.group != "mathematical":  # the judge scores here, in `score_sample`, not in the env's reward
        from arpo_env.tools.search import search_spec

        # recorded:PATH[:FALLBACK]: replay, unrecorded queries to FALLBACK (or failing)
        kwargs["search"], options = search_spec(s.search)
        if options:
            kwargs["search_options"] = options
    return kwargs


def score_sample(bench: Benchmark, transcript: str, task: dict[str, Any], judge: str | None,
                 judge_model: str | None = None) -> tuple[str | None, float, bool | None]:
    """``(prediction, score, judged)`` of a transcript: the answer extracted as benchmarks do
    (`arpo_env.tags.eval_answer`), scored by the column's metric; `judged` is None when no judge was asked, False
    when F1 stood in for an unreachable judge."""
    from arpo_env.qa_metrics import qa_score, shared_judge
    from arpo_env.rewards import math_score

    prediction = eval_answer(transcript)
    meta = {**(task.get("meta") or {}), "question": task.get("question", "")}
    gold = task.get("answer")
    if prediction is None:
        return None, 0.0, None
    if bench.metric == "math":
        return prediction, math_score(prediction, gold), None
    if bench.metric == "judge" and judge:
        score, judged = shared_judge(judge, judge_model).judge(prediction, gold, meta)
        return prediction, score, judged
    return prediction, qa_score(prediction, gold, meta), None


def sample_record(bench: Benchmark, index: int, run: int, task: dict[str, Any], traj: Any,
                  judge: str | None = None, judge_model: str | None = None) -> dict[str, Any]:
    parts = traj.reward_parts
    prediction, score, judged = score_sample(bench, traj.completion_text, task, judge, judge_model)
    return {"benchmark": bench.name, "index": index, "run": run, "question": task.get("question"),
            "gold": task.get("answer"), "prediction": prediction, "score": score,
            "correct": score > 0 if bench.metric == "math" else score >= 1.0,
            "format_ok": bool(parts.get("format_ok")), "format_errors": parts.get("errors") or [],
            "judged": judged, "tool_calls": traj.tool_calls, "reward": traj.reward, "truncated": traj.truncated,
            "transcript": traj.completion_text, "error": None}


Record = Callable[[dict[str, Any]], None]
"""What a runner hands each sample's record to, as soon as the sample is done (`evaluate` writes it at once, so
that an interrupted run loses only the samples under way)."""


class RolloutRunner:
    """hf and vllm backends: the rollout engine with K independent samples per question (one tree per question);
    a question's samples are recorded as soon as its tree is complete."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator
        self.lock = threading.Lock()

    def close(self) -> None:
        self.generator.close()

    def run(self, bench: Benchmark, make_env: Callable[[], Any], indices: list[int], runs: list[int],
            s: Settings, record: Record) -> None:
        from arpo_algo.rollout import GRPORollout, RolloutConfig

        k = len(runs)
        config = RolloutConfig(num_generations=k, num_global=k, max_new_tokens=s.max_new_tokens,
                               max_completion_tokens=s.max_completion_tokens, temperature=s.temperature,
                               top_p=s.top_p, branching=False, seed=s.seed + indices[0])
        recorded: set[int] = set()

        def on_tree(t: int, tree: Any) -> None:
            recorded.add(t)
            for run, traj in zip(runs, tree.trajectories):
                record(sample_record(bench, indices[t], run, tree.task, traj, s.judge, s.judge_model))

        with self.lock:
            trees = GRPORollout(self.generator, make_env, config).run(indices, on_tree=on_tree)
        for t, tree in enumerate(trees):
            if t not in recorded:
                on_tree(t, tree)


class OpenAIRunner:
    """Any OpenAI-compatible chat endpoint (`arpo_env.openai_chat`: retries, clear errors); episodes run in threads.

    How the episode reaches the server (``transcript``):

    * ``"continue"`` (the default): the episode so far is one assistant message, which the server continues
      (``continue_final_message``, as vLLM and SGLang do): the model reads the very tokens it was trained on and that
      the hf and vllm backends give it, its own text with the tool results inline;
    * ``"messages"``: each of the model's turns an assistant message and each tool result a user message, for chat
      APIs that cannot continue a message (OpenAI's). A model trained with arpo reads a format it never saw there.

    A turn ends at its first closing tag, as on the other backends, whether or not the server honours ``stop``; the
    reasoning a server's reasoning parser returns apart is the turn's ``<think>`` again (``"messages"``; with
    ``"continue"``, where the text must stay as written, such a server stops the run). Each
    turn asks for at most ``max_new_tokens``, and an episode ends truncated, as on the other backends, once
    its transcript after the prompt reaches ``max_completion_tokens`` (counted from the server's usage reports, so to
    within the last tool result) or outgrows the model's context. A server that refuses the run (a wrong key,
    address or model name, or one that cannot continue a message) stops it with its own words, and one that stops
    answering (down, or its engine dead) stops it after the retries (`ServerRefused`).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, workers: int = 8,
                 transcript: str = "continue", retries: int = 4) -> None:
        from arpo_env.openai_chat import ChatClient

        if transcript not in ("continue", "messages"):
            raise ValueError(f"transcript must be 'continue' or 'messages', not {transcript!r}")
        self.client = ChatClient(base_url, model, api_key, timeout_s=600.0, retries=retries)
        self.workers, self.transcript = workers, transcript

    def close(self) -> None:
        """Closes the connection pool (a later request opens another)."""
        self.client.close()

    def complete(self, messages: list[dict[str, str]], s: Settings, stop: list[str], seed: int,
                 max_tokens: int | None = None) -> tuple[str, dict[str, Any]]:
        """The model's next turn, with its closing tag (a server drops the stop string it stopped at), and the
        request's usage report."""
        from arpo_env.openai_chat import ChatError, content_text

        body: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "stop": stop, "seed": seed,
                                "max_tokens": max_tokens or s.max_new_tokens}
        if messages[-1]["role"] == "assistant":
            body.update(continue_final_message=True, add_generation_prompt=False)
        try:
            response = self.client.chat(messages, **body)
        except ChatError as exc:
            if exc.status == 400 and re.search(r"continue_final_message|add_generation_prompt", str(exc)):
                raise ServerRefused(f"{exc}. This server cannot continue a message; run with --transcript messages "
                                    "(each tool result a user turn)") from exc
            if exc.refused:
                raise ServerRefused(str(exc)) from exc
            if exc.status is None:  # no answer at all, every time it was tried: each later sample would wait as long
                raise ServerRefused(f"{exc} (no answer in {self.client.retries + 1} tries: is it up?). The samples "
                                    "done so far are kept: run the same command again to go on") from exc
            raise
        choice = response["choices"][0]
        text = content_text(choice["message"].get("content"))  # parts were their list's Python spelling
        reasoning = next((r for r in (choice["message"].get(k) for k in ("reasoning_content", "reasoning"))
                          if isinstance(r, str) and r.strip()), None)
        if reasoning is not None:  # a reasoning parser took the model's <think> out of its text: it was lost
            if self.transcript == "continue":  # the episode continues the text as written, which this is not
                raise ServerRefused(f"{self.client.root} answers with the model's reasoning apart from its text (a "
                                    "reasoning parser, as vLLM's --reasoning-parser): a continued episode would lose "
                                    "it. Serve the model without one, or run with --transcript messages")
            # the reasoning of a turn that stopped at a call inside it goes on in the next turn's: one <think>
            written = "".join(m["content"] for m in messages if m["role"] == "assistant")
            opened = "" if written.rfind("<think>") > written.rfind("</think>") else "<think>"
            text = opened + reasoning + (f"</think>{text}" if text else "")
        ends = [text.find(t) + len(t) for t in stop if t in text]
        if ends and min(ends) < len(text):
            # A server that ignores `stop` (or only some of it) writes on past the call: the model's own "<result>",
            # later calls, an answer to a result it never saw (read as the answer, the call never run). The other
            # backends stop at the first closing tag; so does this one.
            text = text[:min(ends)]
        elif choice.get("finish_reason") == "stop" and not any(text.endswith(t) for t in stop):
            matched = choice.get("stop_reason")  # vLLM says which stop string it was
            if not isinstance(matched, str) or matched not in stop:  # else the tag the text left open last
                opened = {t: text.rfind("<" + t[2:]) for t in stop if text.rfind("<" + t[2:]) > text.rfind(t)}
                matched = max(opened, key=opened.__getitem__) if opened else None
            text += matched or ""
        usage = response.get("usage")
        return text, usage if isinstance(usage, dict) else {}

    def episode(self, make_env: Callable[[], Any], index: int, s: Settings, seed: int,
                stop: threading.Event | None = None) -> tuple[dict, Any]:
        """One sample: ``(task, trajectory)``. `stop`, once set, ends it before its next turn (`EpisodeStopped`)."""
        from arpo_algo.rollout import _stop_strings
        from arpo_env.openai_chat import ChatError

        env = make_env()
        try:
            _, info = env.reset(seed=seed, options={"index": index})
            messages = list(info["messages"])
            first_prompt: int | None = None
            used = 0  # tokens of the transcript after the prompt, as of the last usage report
            for turn in itertools.count():
                if stop is not None and stop.is_set():
                    raise EpisodeStopped(f"sample {index} stopped with the run")
                room = min(s.max_new_tokens, s.max_completion_tokens - used)
                if room <= 0:
                    return info["task"], _TextTrajectory(env, {}, truncated=True)
                try:
                    action, usage = self.complete(messages, s, _stop_strings(), seed + 104729 * turn, room)
                except ChatError as exc:
                    if exc.context_overflow:  # the conversation has outgrown the model's context
                        return info["task"], _TextTrajectory(env, {}, truncated=True)
                    raise
                if isinstance(usage.get("prompt_tokens"), int) and isinstance(usage.get("completion_tokens"), int):
                    first_prompt = usage["prompt_tokens"] if first_prompt is None else first_prompt
                    used = usage["prompt_tokens"] - first_prompt + usage["completion_tokens"]
                obs, _, terminated, truncated, step = env.step(action)
                if terminated or truncated:
                    return info["task"], _TextTrajectory(env, step, truncated)
                if self.transcript == "continue":  # the system and user turns, and the episode as one assistant turn
                    messages = env.messages
                else:
                    messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
            raise AssertionError("unreachable")
        finally:
            env.close()

    def run(self, bench: Benchmark, make_env: Callable[[], Any], indices: list[int], runs: list[int],
            s: Settings, record: Record) -> None:
        """The samples in threads, each recorded as it ends. A sample that fails does not stop the others (the
        first failure is raised after them); an interrupt, or a server that refuses the run, stops the samples under
        way at their next turn and drops those not started, so that Ctrl-C does not wait for the whole chunk."""
        stop = threading.Event()
        pool = ThreadPoolExecutor(self.workers)
        jobs = {pool.submit(self.episode, make_env, i, s, s.seed + 7919 * r + i, stop): (i, r)
                for i in indices for r in runs}
        failed: Exception | None = None
        try:
            for future in as_completed(jobs):
                i, r = jobs[future]
                try:
                    task, traj = future.result()
                except ServerRefused:
                    raise
                except Exception as exc:  # noqa: BLE001 - recorded by `_run_chunk`, after the others
                    failed = failed or exc
                    continue
                record(sample_record(bench, i, r, task, traj, s.judge, s.judge_model))
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
        if failed is not None:
            raise failed


class EpisodeStopped(RuntimeError):
    """A sample stopped because its run was interrupted."""


class ServerRefused(RuntimeError):
    """The model's server refused the run (a wrong key, address or model name, or it cannot continue a message) or
    stopped answering: no sample can succeed, so `arpo eval` stops with this message instead of writing an error for
    every sample."""


class _TextTrajectory:
    """What `sample_record` reads, for an episode played as text."""

    def __init__(self, env: Any, step_info: dict[str, Any], truncated: bool) -> None:
        self.reward_parts = step_info.get("reward_parts") or env.score().as_dict()
        self.reward = float(self.reward_parts.get("total", 0.0))
        self.tool_calls = env.state.total_tool_calls
        self.truncated = truncated
        self.completion_text = env.state.completion


# The run ------------------------------------------------------------------------------------------------------------
def load_done(path: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The samples of ``samples.jsonl`` that ended without an error, by (benchmark, item, run). A line cut short is
    passed over; so is one that is no sample record (a file edited or joined by hand: a list, a record without its
    run), said on stderr, and its sample made again (they were an AttributeError or KeyError traceback, after the
    model had loaded)."""
    done: dict[tuple[str, int, int], dict[str, Any]] = {}
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as f:  # lines end at "\n" only: not at a U+2028 of a text
            for n, rec in jsonl.records(f):  # past a line cut short
                key = (rec.get("benchmark"), rec.get("index"), rec.get("run")) if isinstance(rec, dict) else ()
                score = rec.get("score") if key else None  # what the table reads: a score of text was its TypeError
                if not (key and isinstance(key[0], str) and all(type(k) is int for k in key[1:])
                        and (rec.get("error") is not None or (type(rec.get("tool_calls")) is int and type(score) in (
                            int, float) and math.isfinite(score)))):
                    print(f"arpo eval: {path}:{n}: passed over a line that is no sample record (one with benchmark, "
                          f"index and run, and a score and tool calls when it ended): {str(rec)[:100]}",
                          file=sys.stderr)
                elif rec.get("error") is None:
                    done[key] = rec
    return done


def dataset_questions(bench: Benchmark, kwargs: dict[str, Any]) -> list[str]:
    """The questions of a benchmark's items, in order; a clear message naming where the data is expected when it is
    missing."""
    import gymnasium as gym

    import arpo_env  # noqa: F401
    from arpo_env.datasets import DataNotFound, DataUnreadable

    try:
        probe = gym.make(bench.env_id, **kwargs).unwrapped
    except DataNotFound as e:
        hint = f" {NEEDS_DATA_DIR[bench.name]} is not shipped; put it there." if bench.name in NEEDS_DATA_DIR else ""
        raise SystemExit(f"arpo eval: {bench.name}: {e}{hint}") from None
    except (DataUnreadable, FileNotFoundError, TypeError, ValueError, RuntimeError) as e:  # a bad file, --search, …
        raise SystemExit(f"arpo eval: {bench.name}: {' '.join(str(e).split())}") from None
    questions = [task.question for task in probe.tasks]
    probe.close()
    return questions


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def evaluate(benchmarks: list[Benchmark], runner: Any, data_dir: str | None, limit: int | None, runs: int,
             s: Settings, out: Path, chunk: int = 16, questions: dict[str, list[str]] | None = None
             ) -> dict[str, list[dict[str, Any]]]:
    """Run every missing sample, appending to ``out/samples.jsonl``; return the records per benchmark.

    A sample already in the file is reused when its benchmark, item and run are asked for and it answered the
    question that item holds now; one made on another question (another ``--data-dir``, or a data file changed since)
    is made again, and the new record, appended after it, is the one read from then on."""
    from tqdm.auto import tqdm

    out.mkdir(parents=True, exist_ok=True)
    path = out / "samples.jsonl"
    done = load_done(path)
    results: dict[str, list[dict[str, Any]]] = {}
    for bench in benchmarks:
        kwargs = env_kwargs(bench, data_dir, s, out)
        asked = questions[bench.name] if questions else dataset_questions(bench, kwargs)
        n = len(asked) if limit == 0 else min(len(asked), limit or bench.default_limit or len(asked))  # 0: every item
        other = [key for key, rec in done.items() if key[0] == bench.name and key[1] < n
                 and "question" in rec and rec["question"] != asked[key[1]]]
        for key in other:
            del done[key]
        if other:
            print(f"arpo eval: {bench.name}: {_count(len(other), 'sample')} in {path} answered other questions than "
                  "the data's items now hold (another --data-dir, or changed data): made again", file=sys.stderr)
        if bench.metric == "judge" and s.judge:
            rejudge(path, bench.name, [rec for key, rec in done.items() if key[0] == bench.name and key[1] < n], s,
                    workers=chunk)
        todo = [(i, r) for i in range(n) for r in range(runs) if (bench.name, i, r) not in done]
        make_env = _maker(bench.env_id, kwargs)
        with tqdm(total=n * runs, initial=n * runs - len(todo), desc=bench.name, unit="sample") as bar, \
                jsonl.append(path) as sink:
            def record(rec: dict[str, Any]) -> None:  # written as each sample ends: an interrupt loses no other
                if (bench.name, rec["index"], rec["run"]) in done:
                    return
                sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
                sink.flush()
                bar.update(1)
                if rec["error"] is None:
                    done[(bench.name, rec["index"], rec["run"])] = rec
                else:
                    bar.write(f"{bench.name} #{rec['index']} run {rec['run']}: error: {rec['error']}")

            pending = sorted({i for i, _ in todo})
            for start in range(0, len(pending), chunk):
                indices = pending[start:start + chunk]
                run_ids = sorted({r for i, r in todo if i in indices})
                _run_chunk(runner, bench, make_env, indices, run_ids, s, record)
        results[bench.name] = [done.get((bench.name, i, r)) or {"benchmark": bench.name, "index": i, "run": r,
                                                                  "score": 0.0, "tool_calls": 0, "error": "failed"}
                               for i in range(n) for r in range(runs)]
    return results


def rejudge(path: Path, name: str, records: list[dict[str, Any]], s: Settings, workers: int = 16) -> None:
    """Ask the judge again about the samples of `records` it could not judge (the F1 score stood in: it was down,
    or its reply said neither): a resumed run kept them so, though the same command again makes what is missing. A
    sample the judge judges now is updated in place in `records` and appended to `path` (the later line is the one
    read); one it still cannot judge is kept as it was. `workers` questions at a time."""
    from arpo_env.qa_metrics import shared_judge

    stale = [rec for rec in records if rec.get("judged") is False and isinstance(rec.get("prediction"), str)]
    if not stale:
        return
    from tqdm.auto import tqdm

    judge, judged = shared_judge(s.judge, s.judge_model), 0

    def ask(rec: dict[str, Any]) -> tuple[dict[str, Any], float, bool]:
        return rec, *judge.judge(rec["prediction"], rec.get("gold"), {"question": rec.get("question") or ""})

    with jsonl.append(path) as sink, ThreadPoolExecutor(max_workers=workers) as pool, \
            tqdm(total=len(stale), desc=f"{name}: judging again", unit="sample") as bar:
        for rec, score, ok in (f.result() for f in as_completed([pool.submit(ask, rec) for rec in stale])):
            bar.update(1)
            if ok:
                rec.update(score=score, correct=score >= 1.0, judged=True)
                sink.write(json.dumps(rec, ensure_ascii=False) + "\n")
                sink.flush()
                judged += 1
    print(f"arpo eval: {name}: {judged} of the {_count(len(stale), 'sample')} scored by F1 when the judge could not "
          "judge them judged now" + ("" if judged == len(stale) else "; the others keep their F1 score"),
          file=sys.stderr)


def _run_chunk(runner: Any, bench: Benchmark, make_env: Callable[[], Any], indices: list[int], runs: list[int],
               s: Settings, record: Record) -> None:
    """A chunk together; if it fails, each sample it did not record alone, so that one crash is one error record."""
    recorded: set[tuple[int, int]] = set()

    def mine(rec: dict[str, Any]) -> None:
        recorded.add((rec["index"], rec["run"]))
        record(rec)

    try:
        runner.run(bench, make_env, indices, runs, s, mine)
    except ServerRefused:  # no sample can succeed
        raise
    except Exception as exc:  # noqa: BLE001 - a sample's crash must not end the run
        if len(indices) == 1 and len(runs) == 1:
            if (indices[0], runs[0]) not in recorded:  # the error on one line (a message's last line was all it kept)
                record({"benchmark": bench.name, "index": indices[0], "run": runs[0], "score": 0.0, "tool_calls": 0,
                        "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:1000]})
            return
        for i in indices:
            for r in runs:
                if (i, r) not in recorded:
                    _run_chunk(runner, bench, make_env, [i], [r], s, record)


def _maker(env_id: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    import gymnasium as gym

    return lambda: gym.make(env_id, **kwargs).unwrapped


# The table ------------------------------------------------------------------------------------------------------------
def summarise(results: dict[str, list[dict[str, Any]]], runs: int) -> dict[str, dict[str, float]]:
    summary = {}
    for name, recs in results.items():
        per_run = [[r["score"] for r in recs if r["run"] == k] for k in range(runs)]
        means = [100 * statistics.fmean(x) for x in per_run if x]
        summary[name] = {"pass@1": statistics.fmean(means) if means else math.nan,
                         "spread": statistics.stdev(means) if len(means) > 1 else 0.0,
                         "tool_calls": statistics.fmean(r["tool_calls"] for r in recs) if recs else 0.0,
                         "samples": len(recs) // max(runs, 1), "errors": sum(r.get("error") is not None
                                                                              for r in recs),
                         "format_failures": 100 * statistics.fmean(not r.get("format_ok", False) for r in recs)
                         if recs else 0.0,
                         "judge_fallbacks": sum(r.get("judged") is False for r in recs)}
    return summary


def paper_rows(path: Path, model: str) -> list[tuple[str, dict[str, float]]]:
    """Rows of the paper's Table 1 whose base model matches `model` (by name, case-insensitively)."""
    rows = []
    with open(path, encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter="\t")
        for column in ("model", "method"):  # checked on the header: a file of one line (no rows) was no table, silently
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
    for name, values in compare:
        rows.append([name] + cells({b.name: values[b.name] for b in benchmarks if b.name in values}, None))
    metrics = ", ".join(f"{b.column}: {metric_label(b, judge)}" for b in benchmarks)
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", f"Pass@1 (%) = mean over {runs} run(s)" + (" ± standard deviation of the run means" if runs > 1
                                                         else "") + f". Metrics — {metrics}. The answer is "
           "the last <answer> (else the last \\boxed{}) whatever the format; format failures are the samples that "
           "broke the training format (scored all the same)." + (" Judge fallbacks: samples scored by F1 because "
                                                                  "the judge was unreachable." if judge else ""), ""]
    md += [f"- {b.column}: {_count(summary[b.name]['samples'], 'item')}, {_count(summary[b.name]['errors'], 'error')}, "
           f"{summary[b.name]['tool_calls']:.2f} tool calls per question, "
           f"{summary[b.name].get('format_failures', 0.0):.1f}% format failures"
           + (f", {int(summary[b.name].get('judge_fallbacks', 0))} judge fallbacks" if judge else "")
           for b in benchmarks if b.name in summary]
    return "\n".join(md), [header, *rows]


# Command line ---------------------------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arpo eval", description="Evaluate a model on the ARPO paper's benchmarks.")
    p.add_argument("--model", required=True, help="hub id, local path, smollm2-135m, or the served model's name")
    p.add_argument("--backend", choices=["hf", "vllm", "openai"], default="hf")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai backend: the endpoint")
    p.add_argument("--api-key", default=None, help="openai backend: the key (or $OPENAI_API_KEY)")
    p.add_argument("--benchmarks", default="all",
                   help="comma-separated benchmark names (" + ", ".join(BENCHMARKS) + "), groups (mathematical = "
                        "aime24..math, knowledge = webwalker..bamboogle, deepsearch = gaia, hle, xbench) or all; "
                        "'math' is the MATH benchmark alone")
    p.add_argument("--data-dir", default=None, help="folder with one sub-folder per benchmark")
    p.add_argument("--limit", type=int, default=None, help="items per benchmark (default: 500 for gsm8k and math, "
                                                          "all elsewhere; 0: all)")
    p.add_argument("--runs", type=int, default=1, help="K: pass@1 is the mean over K runs")
    p.add_argument("--mode", choices=["tir", "direct"], default="tir", help="tool-integrated, or no tools")
    p.add_argument("--transcript", choices=["continue", "messages"], default="continue",
                   help="openai backend: the episode as one assistant message that the server continues (vLLM, "
                        "SGLang: the tokens the model trained on), or each tool result a user message (chat APIs "
                        "that cannot continue a message)")
    p.add_argument("--judge", default=None, help="OpenAI-compatible URL of an LLM judge (WebWalker, deep search)")
    p.add_argument("--judge-model", default=None, help="the judge's model name (default: the one its endpoint "
                                                       "serves)")
    p.add_argument("--search", default="local", help="search backend for QA: local (offline BM25), ddgs (live), or "
                   "recorded:PATH[:local|ddgs] (replay of a recording such as the release's search_cache.json, "
                   "unrecorded queries to the backend after it)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tool-calls", type=int, default=None, help="default: 5 for math, 10 for search tasks")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"tokens per turn (default {PAPER_BUDGET[0]}; {CPU_BUDGET[0]} with the hf backend on a CPU)")
    p.add_argument("--max-completion-tokens", type=int, default=None,
                   help=f"tokens per episode (default {PAPER_BUDGET[1]}; {CPU_BUDGET[1]} with the hf backend on a CPU)")
    p.add_argument("--concurrency", type=int, default=16, help="samples generated together")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare", choices=["paper"], default=None, help="print the paper's numbers beside ours")
    p.add_argument("--paper-table", default=None, help="the paper's Table 1 as TSV (default: the packaged copy)")
    p.add_argument("--out", default=None, help="output folder for samples.jsonl, results.md, results.csv and "
                   "summary.json (default: runs/eval/MODEL); running again with the same folder resumes")
    return p


PAPER_BUDGET = (1024, 8192)
"""Tokens per turn and per episode: the evaluation budget on a GPU."""
CPU_BUDGET = (512, 2048)
"""The budget when transformers generates on a CPU, where the paper's budget makes an untuned small model (which
writes until it is cut off) take tens of minutes per handful of questions. Both flags override it."""


def token_budget(args: argparse.Namespace) -> tuple[int, int]:
    on_cpu = False
    if args.backend == "hf":
        import torch

        on_cpu = not torch.cuda.is_available()
    default = CPU_BUDGET if on_cpu else PAPER_BUDGET
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
    from arpo_algo.cli import make_generator

    return RolloutRunner(make_generator(args.model, args.backend))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_files(model: str, backend: str) -> str | None:
    """What tells the model evaluated from another under the same name: for a local folder, its config and weight
    files with their sizes and times (a model trained or saved again into the folder is another model); for the
    embedded model, the package and file it is made from; None for a hub id or a served model (the name is all there
    is of it here)."""
    import hashlib

    from arpo_algo.models import EMBEDDED, embedded_source

    if backend == "openai":
        return None
    if model.lower() in EMBEDDED:
        return embedded_source(model.lower())
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return None
    files = []
    for path in sorted(folder.iterdir()):
        if path.is_file() and (path.suffix in WEIGHT_SUFFIXES or path.name == "config.json"):
            stat = path.stat()
            files.append((path.name, stat.st_size, stat.st_mtime_ns))
    return hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16] if files else None


def judge_served(s: Settings, benchmarks: list[Benchmark]) -> str | None:
    """The model the judge's endpoint serves when ``--judge-model`` names none and a selected benchmark is judged:
    asked before any sample, so that `same_settings` tells a run judged by another model at the same URL from this
    one (it was asked at the first judged sample and kept nowhere). None when it cannot be asked now (the judge is
    down: its samples are scored by F1 until it is up)."""
    if not s.judge or s.judge_model or not any(b.metric == "judge" for b in benchmarks):
        return None
    from arpo_env.qa_metrics import shared_judge

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
            raise SystemExit(f"arpo eval: {b.name} needs --data-dir: {NEEDS_DATA_DIR[b.name]} is not shipped with "
                             f"arpo. Download it and put its test set at DATA_DIR/{b.name}/test.jsonl.")
    max_new, max_completion = token_budget(args)
    from arpo_algo.rollout import sampling_problems

    flags = ("--max-new-tokens", "--max-completion-tokens", "--temperature", "--top-p", "", "", "")
    problems = sampling_problems(max_new, max_completion, args.temperature, args.top_p, 1, 0.0, 0.0, flags)
    problems += [f"{flag} must be at least {low}, not {value}" for flag, value, low in (
        ("--runs", args.runs, 1), ("--limit", args.limit, 0), ("--concurrency", args.concurrency, 1),
        ("--max-tool-calls", args.max_tool_calls, 0), ("--seed", args.seed, 0)) if value is not None and value < low]
    from urllib.parse import urlsplit

    # A --judge that is no URL was "unreachable" at every sample, each scored by F1 instead, to the run's end
    urls = [("--judge", args.judge)] + [("--base-url", args.base_url)] * (args.backend == "openai")
    problems += [f"{flag} must be the http(s) URL of an OpenAI-compatible endpoint (http://127.0.0.1:8000/v1), not "
                 f"{url!r}" for flag, url in urls if url is not None and (
                     urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc)]
    from arpo_env.tools.search import BACKENDS

    if args.search.partition(":")[0] not in BACKENDS:  # read only by the search tasks: a typo was missed on the others
        problems.append(f"--search must be local, ddgs or recorded:PATH[:local|ddgs], not {args.search!r}")
    elif args.search == "recorded":
        problems.append("--search recorded needs its recording: --search recorded:path/to/search_cache.json "
                        "(:local or :ddgs after it for the queries it lacks)")
    if problems:
        raise SystemExit("arpo eval: " + "; ".join(problems))
    compare = []
    if args.compare == "paper":  # read now: a table it cannot read was a traceback after the whole evaluation
        table_path = Path(args.paper_table) if args.paper_table else PAPER_TABLE
        try:
            compare = paper_rows(table_path, args.model)
        except (OSError, UnicodeError, csv.Error, KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"arpo eval: --paper-table {table_path}: {paper_table_problem(exc)}") from None
    settings = Settings(args.mode, args.temperature, args.top_p, args.max_tool_calls, max_new, max_completion,
                        args.judge, args.search, args.seed, args.judge_model)
    out = Path(args.out) if args.out else default_out(args.model)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where the folder should be, no permission: one line, before any sample is made
        raise unwritable(out, exc) from None
    with jsonl.sole_writer(out, f"another arpo eval is writing to {out} now: wait for it to end (then this command "
                           "makes only the samples it lacks), or give another --out", folder=True):
        return run_evaluation(args, benchmarks, settings, out, compare, (max_new, max_completion))


def run_evaluation(args: argparse.Namespace, benchmarks: list[Benchmark], settings: Settings, out: Path,
                   compare: list[tuple[str, dict[str, float]]], budget: tuple[int, int]) -> int:
    """`main` past its checks, with ``out`` held by this process alone (`jsonl.sole_writer`)."""
    max_new, max_completion = budget
    print(f"arpo eval → {out} | {args.backend} | temperature {settings.temperature}, top-p {settings.top_p}, "
          f"{max_new} tokens per turn, {max_completion} per episode", file=sys.stderr)
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


PAPER_TABLE = Path(__file__).with_name("paper_table1.tsv")
