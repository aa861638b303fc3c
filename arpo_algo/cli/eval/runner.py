"""Running the samples of ``arpo eval``: episodes through the rollout engine or an OpenAI-compatible server,
scored, judged and appended to ``samples.jsonl`` as they finish."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from arpo_algo import jsonl
from arpo_algo.cli.eval.benchmarks import NEEDS_DATA_DIR, Benchmark
from arpo_env.tags import eval_answer


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
    server_url: str | None = None
    """Envs on `arpo serve` servers (comma-separated URLs): their data, sandbox and search are the servers'."""


def env_kwargs(bench: Benchmark, data_dir: str | None, s: Settings, out: Path | None = None) -> dict[str, Any]:
    """gym.make keyword arguments for a benchmark; `out`, the output folder, is hidden from the sandbox (its samples
    hold the gold answers)."""
    kwargs: dict[str, Any] = {"dataset": bench.name, "data_dir": data_dir}
    kwargs["max_tool_calls"] = s.max_tool_calls or (5 if bench.group == "mathematical" else 10)
    if s.server_url:  # the servers hold the data and set the sandbox and search (arpo serve --env_kwargs)
        del kwargs["data_dir"]
        kwargs["server_url"] = s.server_url
        if s.mode == "direct":
            kwargs["tools"] = ()
        return kwargs
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
                 judge_model: str | None = None) -> tuple[str | None, float, bool | None, list[str]]:
    """``(prediction, score, judged, scoring_errors)`` of a transcript: the answer extracted as benchmarks do
    (`arpo_env.tags.eval_answer`), scored by the column's metric; `judged` is None when no judge was asked, False
    when F1 stood in for an unreachable judge; `scoring_errors` what kept our scoring from a verdict (an exception,
    a timeout: `arpo_env.scoring.failures`), empty when it gave one."""
    from arpo_env.scoring import failures
    from arpo_env.scoring.judge import shared_judge
    from arpo_env.scoring.math_equivalence import math_score
    from arpo_env.scoring.qa_metrics import qa_score

    prediction = eval_answer(transcript)
    meta = {**(task.get("meta") or {}), "question": task.get("question", "")}
    gold = task.get("answer")
    if prediction is None:
        return None, 0.0, None, []
    judged = None
    with failures.collected() as notes:
        if bench.metric == "math":
            score = failures.scored(math_score, prediction, gold)
        elif bench.metric == "judge" and judge:
            score, judged = shared_judge(judge, judge_model).judge(prediction, gold, meta)
        else:
            score = failures.scored(qa_score, prediction, gold, meta)
    return prediction, score, judged, notes


def sample_record(bench: Benchmark, index: int, run: int, task: dict[str, Any], traj: Any,
                  judge: str | None = None, judge_model: str | None = None) -> dict[str, Any]:
    parts = traj.reward_parts
    prediction, score, judged, scoring_errors = score_sample(bench, traj.completion_text, task, judge, judge_model)
    return {"benchmark": bench.name, "index": index, "run": run, "question": task.get("question"),
            "gold": task.get("answer"), "prediction": prediction, "score": score,
            "correct": score > 0 if bench.metric == "math" else score >= 1.0, "scoring_errors": scoring_errors,
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
        from arpo_algo.core.config import RolloutConfig
        from arpo_algo.rollout.scheduler import GRPORollout

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
    """Any OpenAI-compatible chat endpoint (`arpo_env.scoring.chat_client`: retries, clear errors); episodes run in
    threads.

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
        from arpo_env.scoring.chat_client import ChatClient

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
        from arpo_env.scoring.chat_client import ChatError, content_text

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
        text = content_text(choice["message"].get("content"))  # the text of a list of parts, not its Python spelling
        reasoning = next((r for r in (choice["message"].get(k) for k in ("reasoning_content", "reasoning"))
                          if isinstance(r, str) and r.strip()), None)
        if reasoning is not None:  # a reasoning parser takes the model's <think> out of its text: put it back
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
        from arpo_env.scoring.chat_client import ChatError
        from arpo_env.tags import close_tags

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
                    action, usage = self.complete(messages, s, close_tags(), seed + 104729 * turn, room)
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
    run), said on stderr, and its sample made again."""
    done: dict[tuple[str, int, int], dict[str, Any]] = {}
    if path.exists():
        with open(path, encoding="utf-8", errors="replace") as f:  # lines end at "\n" only: not at a U+2028 of a text
            for n, rec in jsonl.records(f):  # past a line cut short
                key = (rec.get("benchmark"), rec.get("index"), rec.get("run")) if isinstance(rec, dict) else ()
                score = rec.get("score") if key else None  # what the table reads: a number, or None
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
    from arpo_env.datasets.task import DataNotFound, DataUnreadable

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


def count_of(n: int, noun: str) -> str:
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
            print(f"arpo eval: {bench.name}: {count_of(len(other), 'sample')} in {path} answered other questions than "
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
            with _meter(runner, bar):
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
    from arpo_env.scoring.judge import shared_judge

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
    print(f"arpo eval: {name}: {judged} of the {count_of(len(stale), 'sample')} scored by F1 when the judge could not "
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
            if (indices[0], runs[0]) not in recorded:  # the error on one line
                record({"benchmark": bench.name, "index": indices[0], "run": runs[0], "score": 0.0, "tool_calls": 0,
                        "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:1000]})
            return
        for i in indices:
            for r in runs:
                if (i, r) not in recorded:
                    _run_chunk(runner, bench, make_env, [i], [r], s, record)


def _meter(runner: Any, bar: Any) -> Any:
    """Tokens so far and their rate on `bar` while samples are generated (a runner with a generator: hf, vllm)."""
    from contextlib import nullcontext

    from arpo_algo.generation.throughput import TokenMeter

    generator = getattr(runner, "generator", None)
    return TokenMeter(generator.stats, bar.set_postfix_str) if generator is not None else nullcontext()


def _maker(env_id: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    import gymnasium as gym

    return lambda: gym.make(env_id, **kwargs).unwrapped
