"""`arpo eval`: the scoring of every benchmark's answer format on real records, the table, and resumable runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import arpo_env  # noqa: F401
from arpo_algo.cli.eval.benchmarks import BENCHMARKS, select
from arpo_algo.cli.eval.report import PAPER_TABLE, paper_rows, summarise, table
from arpo_algo.cli.eval.runner import Settings, env_kwargs

ROOT = Path(__file__).resolve().parents[1]


def answer_episode(bench, data_dir, index, text):
    kwargs = env_kwargs(BENCHMARKS[bench], str(data_dir / "eval"), Settings())
    env = gym.make(BENCHMARKS[bench].env_id, **kwargs).unwrapped
    try:
        _, info = env.reset(options={"index": index})
        _, reward, terminated, _, step = env.step(text)
        assert terminated
        return info["task"], step["reward_parts"]
    finally:
        env.close()


def gold_text(answer):
    if isinstance(answer, list):
        return str(answer[0])
    return str(answer)


@pytest.mark.parametrize("bench", list(BENCHMARKS))
def test_the_gold_answer_scores_full_marks_and_a_wrong_one_does_not(bench, data_dir):
    task, parts = answer_episode(bench, data_dir, 0, "")
    gold = gold_text(task["answer"])
    if task["meta"].get("answer_type") == "multipleChoice":
        gold = gold.strip()[:1]  # HLE multiple choice: the option letter
    _, right = answer_episode(bench, data_dir, 0, f"<answer>\\boxed{{{gold}}}</answer>")
    assert right["format_ok"] and right["score"] == pytest.approx(1.0), (bench, gold, right)
    _, wrong = answer_episode(bench, data_dir, 0, "<answer>\\boxed{zebra quantum 98765}</answer>")
    assert wrong["format_ok"] and wrong["score"] < 0.5, (bench, wrong)
    _, broken = answer_episode(bench, data_dir, 0, f"the answer is {gold}")
    assert not broken["format_ok"]


def test_math_answers_are_compared_by_equivalence(data_dir):
    # GSM8K's gold is the number after '####'; 1/2 and 0.5 are the same answer to math-verify
    task, _ = answer_episode("gsm8k", data_dir, 0, "")
    _, parts = answer_episode("gsm8k", data_dir, 0, f"<answer>\\boxed{{{task['answer']}.0}}</answer>")
    assert parts["correct"]
    env = gym.make("ARPO-Math-v0", tools=()).unwrapped
    env.reset(options={"question": "half?", "answer": "\\frac{1}{2}"})
    _, _, _, _, step = env.step("<answer>\\boxed{0.5}</answer>")
    env.close()
    assert step["reward_parts"]["correct"]


def test_qa_answers_get_partial_f1_credit(data_dir):
    task, _ = answer_episode("hotpotqa", data_dir, 1, "")
    gold = gold_text(task["answer"])
    _, parts = answer_episode("hotpotqa", data_dir, 1, f"<answer>\\boxed{{{gold} and some other words}}</answer>")
    assert 0.0 < parts["score"] < 1.0


def test_selection_and_clear_errors():
    assert [b.name for b in select("mathematical")] == ["aime24", "aime25", "math500", "gsm8k", "math"]
    assert [b.name for b in select("math")] == ["math"]  # the MATH benchmark alone, by its own name
    assert [b.name for b in select("math,knowledge")][:2] == ["math", "webwalker"]
    assert len(select("all")) == 13
    assert [b.name for b in select("gsm8k,hotpotqa,gsm8k")] == ["gsm8k", "hotpotqa"]
    with pytest.raises(SystemExit, match="unknown benchmark 'gsm9k'"):
        select("gsm9k")
    for empty in ("", " , "):  # ran nothing and wrote an empty table
        with pytest.raises(SystemExit, match="--benchmarks names no benchmark"):
            select(empty)
    from arpo_algo.cli.eval import command as eval_command

    for flags, words in [(["--top_p", "0"], "--top_p must be in"), (["--temperature", "-1"], "--temperature must"),
                         (["--max_new_tokens", "-5"], "--max_new_tokens=-5")]:  # before any model or sample
        with pytest.raises(SystemExit, match=words):
            eval_command.main(["--model", "no-model-needed", "--benchmarks", "gsm8k", *flags])


def test_table_has_the_paper_layout_and_the_paper_numbers():
    results = {"gsm8k": [{"run": r, "score": s, "tool_calls": 1} for r, s in ((0, 1.0), (0, 0.0), (1, 1.0),
                                                                              (1, 1.0))],
               "hotpotqa": [{"run": 0, "score": 0.5, "tool_calls": 2}, {"run": 1, "score": 0.25, "tool_calls": 0}]}
    summary = summarise(results, runs=2)
    assert summary["gsm8k"]["pass@1"] == pytest.approx(75.0) and summary["gsm8k"]["spread"] > 0
    paper = paper_rows(PAPER_TABLE, "Qwen/Qwen2.5-7B-Instruct")
    assert [name for name, _ in paper][-1] == "paper: ARPO" and paper[-1][1]["gsm8k"] == pytest.approx(92.0, abs=10)
    md, rows = table(summary, select("gsm8k,hotpotqa"), None, "mine", 2, paper)
    assert rows[0][:3] == ["model", "GSM8K", "HotpotQA"] and rows[1][0] == "mine"
    assert rows[1][1].startswith("75.0 ±") and "F1" in md and "math-verify" in md
    assert rows[2][0] == "tool calls / question" and rows[2][1] == "1.00"
    assert "- GSM8K: 2 items, 0 errors," in md and "- HotpotQA: 1 item, 0 errors," in md  # "1 items" once


def test_gaia_without_a_data_dir_says_where_to_get_it(tmp_path):
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", "--model", "x", "--benchmarks", "gaia",
                             "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode != 0 and "needs --data_dir" in result.stderr and "huggingface.co" in result.stderr
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", "--model", "x", "--benchmarks", "gsm8k",
                             "--data_dir", str(tmp_path), "--out", str(tmp_path / "o")], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode != 0 and "gsm8k" in result.stderr and str(tmp_path) in result.stderr


@pytest.mark.slow
def test_search_backends_of_eval_including_a_recording(data_dir, tmp_path):
    """``--search recorded`` could not be used (no way to give the recording: a ValueError traceback), nor could a
    wrong name (``--search bogus``: a traceback). Now ``recorded:PATH[:FALLBACK]`` replays a recording, and a wrong
    backend is one line."""
    recording = data_dir / "search" / "search_cache.json"
    query = next(iter(json.loads(recording.read_text())))
    kwargs = env_kwargs(BENCHMARKS["bamboogle"], str(data_dir / "eval"), Settings(search=f"recorded:{recording}:local"))
    assert kwargs["search_options"] == {"recording": str(recording), "fallback": "local"}
    env = gym.make("ARPO-QA-v0", **kwargs)
    env.reset(seed=0)
    assert env.step(f"<search>{query}</search>")[0].startswith("\n<result>\n1. ")
    assert "search failed" not in env.step("<search>an unrecorded query about Paris</search>")[0]  # the fallback
    env.close()
    import importlib.util

    bogus = "arpo eval: --search must be local, ddgs or recorded:PATH[:local|ddgs], not 'bogus'"
    cases = [("bamboogle", "bogus", bogus), ("gsm8k", "bogus", bogus),  # a math run took any --search
             ("bamboogle", "recorded", "arpo eval: --search recorded needs its recording: --search recorded:")]
    if importlib.util.find_spec("ddgs") is None:  # was a run whose every search failed; then a traceback
        cases.append(("bamboogle", "ddgs",
                      "arpo eval: bamboogle: search='ddgs' needs the live extra: pip install 'arpo[live]'"))
    for bench, search, words in cases:
        result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", "--model", "x", "--benchmarks",
                                 bench, "--data_dir", str(data_dir / "eval"), "--search", search, "--out",
                                 str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert result.returncode == 2 and "Traceback" not in result.stderr and words in result.stderr, result.stderr


def test_samples_whose_text_holds_line_separators_count_as_done(tmp_path):
    """Samples are written with ``ensure_ascii=False``, so a model's U+2028, U+2029 or U+0085 stands unescaped in
    its line: read with ``str.splitlines``, which cuts there, such a sample was never done and ran again at every
    resume. The training log's reader is the same."""
    from arpo_algo.cli.eval.runner import load_done
    from arpo_algo.cli.viewer import read_metrics

    texts = ["a\u2028b", "c\u2029d", "e\x85f", "plain"]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"benchmark": "gsm8k", "index": i, "run": 0, "transcript": t, "error": None,
                                           "score": 1.0, "tool_calls": 1}, ensure_ascii=False) + "\n"
                               for i, t in enumerate(texts)), encoding="utf-8")
    done = load_done(samples)
    assert sorted(done) == [("gsm8k", i, 0) for i in range(4)] and done[("gsm8k", 0, 0)]["transcript"] == texts[0]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "reward": 0.5, "note": t}, ensure_ascii=False) + "\n"
                               for i, t in enumerate(texts, 1)), encoding="utf-8")
    assert [m["step"] for m in read_metrics(metrics)] == [1, 2, 3, 4]


@pytest.mark.slow
def test_an_interrupted_eval_finishes_only_the_missing_samples(agent, tokenizer, data_dir, tmp_path):
    model_dir = tmp_path / "tiny"
    agent.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "arpo_algo.cli", "eval", "--model", str(model_dir), "--benchmarks", "gsm8k,bamboogle",
           "--data_dir", str(data_dir / "eval"), "--limit", "3", "--max_new_tokens", "32", "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    samples = (out / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 6
    record = json.loads(samples[0])
    assert {"question", "gold", "prediction", "score", "tool_calls", "transcript"} <= set(record)
    assert isinstance(record["tool_calls"], int) and record["error"] is None
    # as if interrupted after four samples: the last two are lost, and a second run does only those
    (out / "samples.jsonl").write_text("\n".join(samples[:4]) + "\n")
    second = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    after = (out / "samples.jsonl").read_text().splitlines()
    assert after[:4] == samples[:4] and len(after) == 6
    assert {(json.loads(s)["benchmark"], json.loads(s)["index"]) for s in after} == {
        (b, i) for b in ("gsm8k", "bamboogle") for i in range(3)}
    md = (out / "results.md").read_text()
    assert "GSM8K" in md and "Bamboogle" in md and "tool calls / question" in md
    assert (out / "results.csv").read_text().startswith("model,GSM8K,Bamboogle")
    # Another mode or temperature into the same folder: its samples are not these (they were reported as its own)
    other = subprocess.run([*cmd, "--mode", "direct", "--temperature", "0"], capture_output=True, text=True,
                           cwd=ROOT, timeout=600)
    assert other.returncode == 2 and "holds samples made with other settings (mode 'tir' → 'direct', temperature " \
        "0.6 → 0.0)" in other.stderr, other.stderr[-2000:]
    assert (out / "samples.jsonl").read_text().splitlines() == after
    # The model trained (here: saved) again into its folder is another model: the samples of the one before were
    # reported as its own ("all from an earlier run")
    agent.save_pretrained(model_dir)
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 2 and f"holds samples made with other settings (the files of {model_dir} changed " \
        "since (trained or saved again))" in again.stderr, again.stderr[-2000:]
    assert (out / "samples.jsonl").read_text().splitlines() == after


@pytest.mark.slow
def test_each_sample_is_written_as_it_ends_so_an_interrupt_loses_only_those_under_way(agent, tokenizer, tmp_path):
    """Ctrl-C in the middle of a chunk: the samples already done are in samples.jsonl (not only whole chunks), and
    the next run does the others, each once."""
    from tiny_agent import TASK

    from arpo_algo.cli.eval import benchmarks as eval_benchmarks
    from arpo_algo.cli.eval import runner as eval_runner
    from arpo_algo.generation.hf_generator import HFGenerator

    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": TASK["question"], "answer": "#### 42"}) + "\n" for _ in range(3)))

    class InterruptedAfterOne(eval_runner.RolloutRunner):  # Ctrl-C as the first sample is written
        def run(self, bench, make_env, indices, runs, s, record):
            def then_interrupt(rec):
                record(rec)
                raise KeyboardInterrupt

            super().run(bench, make_env, indices, runs, s, then_interrupt)

    s = eval_runner.Settings(max_new_tokens=24, max_completion_tokens=256)
    args = ([eval_benchmarks.BENCHMARKS["gsm8k"]], None, str(tmp_path / "data"), None, 2, s, tmp_path / "eval")
    with pytest.raises(KeyboardInterrupt):
        eval_runner.evaluate(args[0], InterruptedAfterOne(HFGenerator(agent, tokenizer)), *args[2:])
    lines = (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the chunk holds all six samples: before, none was written until all were done
    results = eval_runner.evaluate(args[0], eval_runner.RolloutRunner(HFGenerator(agent, tokenizer)), *args[2:])
    after = (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()
    assert after[0] == lines[0] and len(after) == 6
    assert sorted((json.loads(x)["index"], json.loads(x)["run"]) for x in after) == [(i, r) for i in range(3)
                                                                                    for r in range(2)]
    assert all(r["error"] is None and r["tool_calls"] == 2 for r in results["gsm8k"])


@pytest.mark.slow
def test_samples_made_on_other_data_are_made_again_not_reported_as_these(agent, tokenizer, tmp_path):
    """A sample is reused by benchmark, item and run: a second run with another --data_dir (or after the data file
    changed) into the same folder reported the first data's answers as its own items'. Now only the items whose
    question is the same are reused, and the others are made again."""
    from tiny_agent import TASK

    from arpo_algo.cli.eval import benchmarks as eval_benchmarks
    from arpo_algo.cli.eval import runner as eval_runner
    from arpo_algo.generation.hf_generator import HFGenerator

    def data(folder, questions):
        (folder / "gsm8k").mkdir(parents=True)
        (folder / "gsm8k" / "test.jsonl").write_text(
            "".join(json.dumps({"question": q, "answer": "#### 42"}) + "\n" for q in questions))
        return str(folder)

    first = data(tmp_path / "a", [TASK["question"], TASK["question"] + " Say it twice."])
    second = data(tmp_path / "b", [TASK["question"] + " Show your work.", TASK["question"] + " Say it twice."])
    s, out, runner = eval_runner.Settings(max_new_tokens=24, max_completion_tokens=256), tmp_path / "eval", \
        eval_runner.RolloutRunner(HFGenerator(agent, tokenizer))
    eval_runner.evaluate([eval_benchmarks.BENCHMARKS["gsm8k"]], runner, first, None, 1, s, out)
    results = eval_runner.evaluate([eval_benchmarks.BENCHMARKS["gsm8k"]], runner, second, None, 1, s, out)
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [(r["index"], r["question"]) for r in lines] == [
        (0, TASK["question"]), (1, TASK["question"] + " Say it twice."), (0, TASK["question"] + " Show your work.")]
    assert [r["question"] for r in results["gsm8k"]] == [TASK["question"] + " Show your work.",
                                                         TASK["question"] + " Say it twice."]
    assert [r["question"] for r in eval_runner.evaluate(  # and a third run reads the new record, not the first one
        [eval_benchmarks.BENCHMARKS["gsm8k"]], runner, second, None, 1, s, out)["gsm8k"]] == [
        r["question"] for r in results["gsm8k"]]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 3


@pytest.mark.slow
def test_lines_of_samples_jsonl_that_are_no_sample_records_are_passed_over_and_made_again(agent, tokenizer, tmp_path,
                                                                                           capsys):
    """A samples.jsonl edited or joined by hand (a list, a record without its run, bytes that are not UTF-8, a score
    of text): the run that resumed from it died on an AttributeError or KeyError traceback, after the model had
    loaded, or on a TypeError at the table, after the whole run."""
    from tiny_agent import TASK

    from arpo_algo.cli.eval import benchmarks as eval_benchmarks
    from arpo_algo.cli.eval import command as eval_command
    from arpo_algo.cli.eval import runner as eval_runner
    from arpo_algo.generation.hf_generator import HFGenerator

    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": TASK["question"],
                                                                        "answer": "#### 42"}) + "\n")
    out = tmp_path / "eval"
    out.mkdir()
    (out / "samples.jsonl").write_bytes(b'[1, 2]\n{"benchmark": "gsm8k", "index": 0, "error": null}\n\xff\xfe\n'
                                        # the table read its score after the whole run: a TypeError, the table lost
                                        b'{"benchmark": "gsm8k", "index": 0, "run": 0, "score": "high", '
                                        b'"tool_calls": 1, "error": null}\n')
    s = eval_runner.Settings(max_new_tokens=24, max_completion_tokens=256)
    results = eval_runner.evaluate([eval_benchmarks.BENCHMARKS["gsm8k"]], eval_runner.RolloutRunner(
        HFGenerator(agent, tokenizer)), str(tmp_path / "data"), None, 1, s, out)
    assert [(r["index"], r["run"], r["error"]) for r in results["gsm8k"]] == [(0, 0, None)]
    err = capsys.readouterr().err
    assert f"{out / 'samples.jsonl'}:1: passed over a line that is no sample record" in err and ":2: passed" in err
    assert ":4: passed" in err and results["gsm8k"][0]["score"] == 1.0
    assert eval_command._line_count(out / "samples.jsonl") == 5


@pytest.mark.slow
def test_a_model_server_that_does_not_answer_stops_the_run_with_what_is_done_kept(tmp_path):
    """Nothing listens at the address (a server down, an engine dead): after its retries the first sample stops the
    run, instead of every sample waiting as long and writing an error."""
    from arpo_algo.cli.eval import command as eval_command

    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(40)))
    with pytest.raises(SystemExit, match="no answer in 5 tries"):
        eval_command.main(["--model", "m", "--backend", "openai", "--base_url", "http://127.0.0.1:9/v1", "--benchmarks",
                         "gsm8k", "--data_dir", str(tmp_path / "data"), "--out", str(tmp_path / "eval")])
    samples = tmp_path / "eval" / "samples.jsonl"
    assert not samples.exists() or samples.read_text() == ""


@pytest.fixture
def web_page_server():
    """A real web server on 127.0.0.1 that is not an API: POST gets the status the test sets, with an HTML page."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        status = 501

        def do_POST(self):  # noqa: N802 - http.server's name
            page = (f"<!DOCTYPE html>\n<html>\n<head><title>Site</title><style>p {{color: red}}</style></head>\n"
                    f"<body>\n<h1>Not here</h1>\n<p>No &amp; API at {self.path}</p>\n</body>\n</html>\n").encode()
            self.send_response(Handler.status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, Handler
    server.shutdown()
    server.server_close()


def test_a_base_url_that_is_a_web_site_stops_the_run_with_its_words(web_page_server, tmp_path):
    """A base URL that names a web site (501 or 405 to a POST, or a page with 200) made every sample an error record
    reading "</html>" (the last line of the page) and a table of zeros; an error a server gives one sample is one line
    of its words."""
    from arpo_algo.cli.eval import command as eval_command

    server, handler = web_page_server
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(3)))
    argv = ["--model", "m", "--backend", "openai", "--base_url", f"http://127.0.0.1:{server.server_port}",
            "--benchmarks", "gsm8k", "--data_dir", str(tmp_path / "data"), "--out", str(tmp_path / "eval")]
    samples = tmp_path / "eval" / "samples.jsonl"
    for status in (501, 405, 200):
        handler.status = status
        with pytest.raises(SystemExit) as info:
            eval_command.main(argv)
        message = str(info.value.code)
        assert f"answered {status}" in message and "Site Not here No & API at /v1/chat/completions" in message
        assert "\n" not in message and "<" not in message.split("answered")[1]
        assert not samples.exists() or samples.read_text() == ""
    handler.status = 422  # this request's fault, as far as anyone can tell: an error record each, and the run goes on
    eval_command.main(argv + ["--limit", "1"])
    error = json.loads(samples.read_text().splitlines()[0])["error"]
    assert error.startswith("ChatError: ") and error.endswith("answered 422: Site Not here No & API at "
                                                              "/v1/chat/completions")


@pytest.mark.slow
def test_a_judge_serving_another_model_at_the_same_url_is_another_setting(tmp_path, monkeypatch):
    """With --judge and no --judge_model, the model the endpoint serves was asked at the first judged sample and kept
    nowhere: a run resumed while another judge model served the same URL added its verdicts to the first one's. It is
    asked before any sample and kept in settings.json; a judge that is down then is no reason to refuse."""
    from chat_server import serve_replies

    from arpo_algo.cli.eval import command as eval_command
    from arpo_env.scoring import judge as judge_module

    (tmp_path / "data" / "webwalker").mkdir(parents=True)
    (tmp_path / "data" / "webwalker" / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"Which city is number {i}?", "answer": "Paris"}) + "\n" for i in range(2)))
    policy = serve_replies(["<answer>\\boxed{Paris}</answer>"] * 2, model="m")
    judge = serve_replies(["Correct"], model="judge-a")
    url, out = f"http://127.0.0.1:{judge.server_port}/v1", tmp_path / "eval"
    argv = ["--model", "m", "--backend", "openai", "--base_url", f"http://127.0.0.1:{policy.server_port}", "--mode",
            "direct", "--benchmarks", "webwalker", "--data_dir", str(tmp_path / "data"), "--judge", url, "--out",
            str(out)]
    try:
        monkeypatch.setattr(judge_module, "_JUDGES", {})
        eval_command.main(argv + ["--limit", "1"])
        assert json.loads((out / "settings.json").read_text())["judge_served"] == "judge-a"
        (sample,) = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        assert sample["judged"] is True and sample["score"] == 1.0
        judge.shutdown()
        judge.server_close()
        judge = serve_replies(["Correct"], model="judge-b", port=judge.server_port)  # another model, the same URL
        monkeypatch.setattr(judge_module, "_JUDGES", {})  # a new process's
        with pytest.raises(SystemExit, match=f"other settings \\(the judge at {url} serves 'judge-b', not "
                                             "'judge-a'\\)"):
            eval_command.main(argv)
        assert len((out / "samples.jsonl").read_text().splitlines()) == 1
    finally:
        for server in (policy, judge):
            server.shutdown()
            server.server_close()
    settings = json.loads((out / "settings.json").read_text())
    eval_command.same_settings(out, {**settings, "judge_served": None})  # the judge down at this run's start
    (out / "settings.json").write_text(json.dumps({**settings, "judge_served": None}))  # or at the first run's
    eval_command.same_settings(out, {**settings, "judge_served": "judge-b"})
    # kept from then on: a judge down at the first run's start left it null for good, so no later change was told
    assert json.loads((out / "settings.json").read_text())["judge_served"] == "judge-b"
    with pytest.raises(SystemExit, match="serves 'judge-c', not 'judge-b'"):
        eval_command.same_settings(out, {**settings, "judge_served": "judge-c"})
    with pytest.raises(SystemExit, match=r"other settings \(judge 'http[^,]*'\)"):  # another URL: said once
        eval_command.same_settings(out, {**settings, "judge": url + "/x", "judge_served": "judge-b"})


@pytest.mark.slow
def test_samples_scored_by_f1_while_the_judge_was_down_are_judged_when_a_run_resumes(tmp_path, monkeypatch):
    """A sample scored by F1 because the judge could not be reached stayed so when the same command ran again with
    the judge back: its F1 score was mixed into the judged column for good (only `--out` elsewhere judged it)."""
    from chat_server import serve_replies

    from arpo_algo.cli.eval import command as eval_command
    from arpo_env.scoring import judge as judge_module

    (tmp_path / "data" / "webwalker").mkdir(parents=True)
    (tmp_path / "data" / "webwalker" / "test.jsonl").write_text(
        "".join(json.dumps({"question": f"Which city is number {i}?", "answer": "Paris"}) + "\n" for i in range(2)))
    policy = serve_replies(["<answer>\\boxed{Paris}</answer>"] * 2, model="m")
    judge = serve_replies(["Incorrect"], model="judge-a")
    port = judge.server_port
    judge.shutdown()
    judge.server_close()  # down for the first run
    url, out = f"http://127.0.0.1:{port}/v1", tmp_path / "eval"
    argv = ["--model", "m", "--backend", "openai", "--base_url", f"http://127.0.0.1:{policy.server_port}", "--mode",
            "direct", "--benchmarks", "webwalker", "--data_dir", str(tmp_path / "data"), "--judge", url, "--out",
            str(out), "--limit", "2"]
    samples = out / "samples.jsonl"
    try:
        monkeypatch.setattr(judge_module, "_JUDGES", {})
        eval_command.main(argv)
        assert [(r["judged"], r["score"]) for r in map(json.loads, samples.read_text().splitlines())] == [
            (False, 1.0)] * 2
        monkeypatch.setattr(judge_module, "_JUDGES", {})  # a new process's
        eval_command.main(argv)  # still down: kept as they were
        assert len(samples.read_text().splitlines()) == 2
        judge = serve_replies(["Incorrect"] * 2, model="judge-a", port=port)
        monkeypatch.setattr(judge_module, "_JUDGES", {})
        eval_command.main(argv)
    finally:
        for server in (policy, judge):
            server.shutdown()
            server.server_close()
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(lines) == 4 and [(r["judged"], r["score"], r["correct"]) for r in lines[2:]] == [(True, 0.0, False)] * 2
    assert json.loads((out / "summary.json").read_text())["benchmarks"]["webwalker"]["pass@1"] == 0.0
    assert json.loads((out / "settings.json").read_text())["judge_served"] == "judge-a"


def test_closing_an_openai_runner_closes_its_connections_and_a_later_request_opens_new_ones(web_page_server):
    from arpo_algo.cli.eval import runner as eval_runner
    from arpo_env.scoring.chat_client import ChatError

    server, handler = web_page_server
    handler.status = 422  # an answer each time, no retry: the request reaches the server
    runner = eval_runner.OpenAIRunner(f"http://127.0.0.1:{server.server_port}", "m", retries=0)
    messages = [{"role": "user", "content": "What is 1 + 1?"}]
    for _ in range(2):
        with pytest.raises(ChatError, match="answered 422"):
            runner.complete(messages, Settings(), ["</python>"], seed=0)
        http = runner.client._http
        assert http is not None and not http.is_closed
        runner.close()
        assert http.is_closed and runner.client._http is None
    runner.close()  # twice is harmless


@pytest.mark.parametrize("transcript", ["continue", "messages"])
def test_an_openai_server_that_writes_past_a_call_or_answers_in_parts_is_read_as_the_other_backends_read(transcript):
    """A server that ignores ``stop`` wrote on past the call: the model's own "<result>" and an answer to it, which the
    env read as the answer, the call never run. Content as parts was its list's Python spelling in the transcript;
    choices that are an object a KeyError traceback, and an answer without a message "no answer: is it up?"."""
    from chat_server import serve_replies

    from arpo_algo.cli.eval.runner import OpenAIRunner, ServerRefused
    from arpo_env.datasets.task import Task

    past = "<python>print(6 * 7)</python>\n<result>\n99\n</result>\n<answer>\\boxed{99}</answer>"
    server = serve_replies([{"choices": [{"message": {"content": past}, "finish_reason": "length"}]},
                            {"choices": [{"message": {"content": [{"type": "text", "text": "<answer>\\boxed{"},
                                                                  {"type": "text", "text": "42}"}]},
                                          "finish_reason": "stop", "stop_reason": "</answer>"}]},
                            {"choices": {"0": "x"}}], model="m")
    try:
        runner = OpenAIRunner(f"http://127.0.0.1:{server.server_port}", "m", transcript=transcript, retries=0)
        def make_env():
            return gym.make("ARPO-Math-v0", tasks=[Task("What is 6 * 7?", "42")]).unwrapped
        _, trajectory = runner.episode(make_env, 0, Settings(max_new_tokens=64), seed=0)
        assert trajectory.completion_text == ("<python>print(6 * 7)</python>\n<result>\n42\n</result>\n"
                                              "<answer>\\boxed{42}</answer>")
        assert trajectory.reward_parts["correct"] and trajectory.tool_calls == 1
        with pytest.raises(ServerRefused, match="answered without a message: {'choices': {'0': 'x'}}$"):
            runner.episode(make_env, 0, Settings(max_new_tokens=64), seed=0)
        runner.close()
    finally:
        server.shutdown()


def test_reasoning_a_server_returns_apart_is_the_turns_think_or_stops_a_continued_run():
    """A server with a reasoning parser (vLLM's --reasoning-parser, DeepSeek's API) returns the model's <think> apart
    from its content, and a call written inside it stops the turn there with no content at all: the turn was "", a
    broken format, the call and the thoughts lost, silently. Now they are the turn's <think>, one across the call."""
    from chat_server import serve_replies

    from arpo_algo.cli.eval.runner import OpenAIRunner, ServerRefused
    from arpo_env.datasets.task import Task

    def reply(content, reasoning, stop=None):
        return {"choices": [{"message": {"content": content, "reasoning_content": reasoning},
                             "finish_reason": "stop", "stop_reason": stop}]}

    server = serve_replies([reply(None, "Multiply.\n<python>print(6 * 7)", "</python>"),
                            reply("\n<answer>\\boxed{42}</answer>", "It printed 42."),
                            reply(None, "Multiply.\n<python>print(6 * 7)", "</python>")], model="m")
    def make_env():
        return gym.make("ARPO-Math-v0", tasks=[Task("What is 6 * 7?", "42")]).unwrapped
    try:
        runner = OpenAIRunner(f"http://127.0.0.1:{server.server_port}", "m", transcript="messages", retries=0)
        _, trajectory = runner.episode(make_env, 0, Settings(max_new_tokens=64), seed=0)
        assert trajectory.completion_text == ("<think>Multiply.\n<python>print(6 * 7)</python>\n<result>\n42\n"
                                              "</result>\nIt printed 42.</think>\n<answer>\\boxed{42}</answer>")
        assert trajectory.reward_parts["correct"] and trajectory.tool_calls == 1
        runner = OpenAIRunner(f"http://127.0.0.1:{server.server_port}", "m", retries=0)  # continue: the text as written
        with pytest.raises(ServerRefused, match="reasoning apart from its text .* run with --transcript messages"):
            runner.episode(make_env, 0, Settings(max_new_tokens=64), seed=0)
    finally:
        server.shutdown()


@pytest.mark.parametrize("bench", ["gsm8k", "hotpotqa", "gaia"])
def test_the_direct_mode_has_no_tools_and_a_prompt_without_them(bench):
    """``--mode direct`` (``tools=()``) was no baseline on the knowledge and deep-search benchmarks: QA's envs read
    an empty tuple as their default tools, search and python. Where it had none (math), the prompt still told of
    tools, a budget of calls and their results, listing none."""
    import warnings

    kwargs = {**env_kwargs(BENCHMARKS[bench], None, Settings(mode="direct", search="recorded:nowhere.jsonl:local"),
                           Path("runs/eval")), "dataset": None}  # the shipped tasks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no options for tools it lacks (the sandbox's hidden output, the search's)
        env = gym.make(BENCHMARKS[bench].env_id, **kwargs).unwrapped
    _, info = env.reset(seed=0)
    assert env.tool_factories == {} and "tool" not in info["messages"][0]["content"]
    obs = env.step("<search>capital of France</search>")[0]
    assert "<result>" in obs and "Paris" not in obs  # no tool ran
    env.close()
    default = gym.make(BENCHMARKS[bench].env_id, tools=None,
                       **({"search_options": {"cache": False}} if bench != "gsm8k" else {}))
    assert default.unwrapped.tool_factories and "at most" in default.unwrapped.system_prompt  # None: the default
    default.close()


def test_the_output_folder_is_hidden_from_the_sandbox(tmp_path):
    # samples.jsonl holds every question's gold answer: a later benchmark, or a run started again, could read it.
    from conftest import assert_hidden_from_the_sandbox

    kwargs = env_kwargs(BENCHMARKS["aime24"], None, Settings(), out=tmp_path / "eval")
    assert kwargs["sandbox_options"] == {"hidden_paths": (str((tmp_path / "eval").resolve()),)}
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "samples.jsonl").write_text('{"answer": "204"}\n')
    assert_hidden_from_the_sandbox({"sandbox_options": kwargs["sandbox_options"]}, tmp_path / "eval" / "samples.jsonl")


def test_token_budget_and_default_output_folder():
    from arpo_algo.cli.eval.command import CPU_BUDGET, PAPER_BUDGET, default_out, make_parser, token_budget

    parse = make_parser().parse_args
    import torch

    hf = parse(["--model", "smollm2-135m"])  # transformers on a CPU gets the smaller budget
    assert token_budget(hf) == (PAPER_BUDGET if torch.cuda.is_available() else CPU_BUDGET)
    assert token_budget(parse(["--model", "m", "--backend", "vllm"])) == PAPER_BUDGET
    assert token_budget(parse(["--model", "m", "--max_new_tokens", "64", "--max_completion_tokens", "99"])) == (64, 99)
    assert default_out("smollm2-135m") == Path("runs/eval/smollm2-135m")
    assert default_out("Qwen/Qwen2.5-7B-Instruct/") == Path("runs/eval/Qwen2.5-7B-Instruct")
