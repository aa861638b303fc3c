"""ARPO-Math-v0 through Gymnasium: API conformance, vector envs, datasets, budgets and bad input."""

from __future__ import annotations

import copy
import json
import logging
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import arpo_env
from arpo_env.datasets.loaders import load_tasks
from arpo_env.datasets.task import DataNotFound, DataUnreadable
from arpo_env.scoring.qa_metrics import aliases

Q = {"question": "What is 12 * 34?", "answer": "408"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def env():
    e = gym.make("ARPO-Math-v0", sandbox_options={"timeout_s": 5})
    yield e
    e.close()


@pytest.mark.parametrize("env_id", list(arpo_env.ENV_IDS))
def test_check_env_passes(env_id):
    e = gym.make(env_id)
    check_env(e.unwrapped, skip_render_check=False)
    e.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.slow
def test_make_vec(mode):
    envs = gym.make_vec("ARPO-Math-v0", num_envs=2, vectorization_mode=mode)
    obs, info = envs.reset(seed=1)
    assert len(obs) == 2 and all(isinstance(o, str) and o for o in obs)
    obs, reward, terminated, truncated, info = envs.step(("<python>print(6*7)</python>", "<answer>\\boxed{0}</answer>"))
    assert "42" in obs[0] and not terminated[0] and terminated[1]
    envs.close()


def test_default_dataset_is_shipped_and_seeded(env):
    obs1, info1 = env.reset(seed=3)
    obs2, _ = env.reset(seed=3)
    assert obs1 == obs2 and info1["task"]["source"] == "default"
    assert [m["role"] for m in info1["messages"]] == ["system", "user"]
    assert "<python>" in info1["messages"][0]["content"]


def test_full_episode_reward_and_info(env):
    env.reset(options=Q)
    obs, reward, term, trunc, info = env.step("<think>multiply</think>\n<python>print(12 * 34)</python>")
    assert obs == "\n<result>\n408\n</result>\n" and reward == 0.0 and not (term or trunc)
    assert info["tool"] == "python" and info["tool_calls"] == 1 and info["tool_latency_s"] > 0
    assert not info["tool_failed"]
    obs, reward, term, trunc, info = env.step("\n<answer>\\boxed{408}</answer>")
    assert reward == 1.0 and term and not trunc and obs == ""
    assert info["reward_parts"]["correct"] and info["reward_parts"]["prediction"] == "408"
    assert env.unwrapped.completion.endswith("<answer>\\boxed{408}</answer>")
    with pytest.raises(gym.error.ResetNeeded):
        env.step("<python>1</python>")


def test_tool_failure_is_an_observation(env):
    env.reset(options=Q)
    obs, _, term, trunc, info = env.step("<python>1/0</python>")
    assert "ZeroDivisionError" in obs and info["tool_failed"] and not (term or trunc)


def test_tool_budget_truncates_with_a_reason():
    e = gym.make("ARPO-Math-v0", max_tool_calls=2, max_turns=10)
    e.reset(options=Q)
    assert "not" not in e.step("<python>1</python>")[0]
    obs = e.step("<python>2</python>")[0]
    assert "last tool call" in obs
    obs, reward, term, trunc, info = e.step("<python>3</python>")
    assert trunc and not term and "tool-call budget" in obs and reward == -1.0
    assert info["truncation"] and info["tool_calls"] == 2
    e.close()


def test_turn_and_length_budgets_truncate():
    e = gym.make("ARPO-Math-v0", max_turns=2)
    e.reset(options=Q)
    e.step("<python>print(1)")
    obs, _, term, trunc, _ = e.step("<python>print(1)")
    assert trunc and "turn budget" in obs
    e = gym.make("ARPO-Math-v0", max_chars=200)
    e.reset(options=Q)
    obs, _, term, trunc, _ = e.step("<python>print('y' * 500)</python>")
    assert trunc and "length budget" in obs
    e.close()
    for bad in ({"max_tool_calls": -1}, {"max_turns": 0}, {"max_chars": 0}):  # no episode could keep such a budget
        with pytest.raises(ValueError, match=f"budgets: {next(iter(bad))} must be a whole number of at least"):
            gym.make("ARPO-Math-v0", **bad)
    # 1.5 was read as 1 and True as 1, silently; text was int()'s message alone, without the budget's name
    for name, bad in (("max_tool_calls", 1.5), ("max_tool_calls", True), ("max_turns", 2.7), ("max_chars", "10")):
        with pytest.raises(ValueError, match=f"budgets: {name} must be a whole number of at least [01], not {bad!r}"):
            gym.make("ARPO-Math-v0", **{name: bad})
    whole = gym.make("ARPO-Math-v0", max_tool_calls=np.int64(3), max_turns=4.0).unwrapped  # whole numbers, any type
    assert (whole.max_tool_calls, whole.max_turns) == (3, 4) and type(whole.max_turns) is int
    whole.close()
    zero = gym.make("ARPO-Math-v0", max_tool_calls=0)  # no tool at all: the model answers directly
    zero.reset(options=Q)
    obs, _, term, trunc, _ = zero.step("<python>print(1)</python>")
    assert trunc and "0 of 0" in obs
    zero.close()


def test_a_closed_env_says_so_and_a_reset_opens_it_again():
    """Stepped after close(), the env answered a Python call with "there is no <python> tool here", counted it
    against the budget, and went on. Forked, snapshotted or pickled after close(), it says so too."""
    e = gym.make("ARPO-Math-v0").unwrapped
    e.reset(options=Q)
    e.close()
    with pytest.raises(gym.error.ClosedEnvironmentError, match="the environment is closed"):
        e.step("<python>print(1)</python>")
    # a fork of it was closed too (its first step said so); a snapshot held none of the interpreter's cells, so the
    # env it was restored into had lost their variables, silently
    for taken in (e.fork, e.snapshot, lambda: pickle.dumps(e)):
        with pytest.raises(gym.error.ClosedEnvironmentError, match="the environment is closed"):
            taken()
    e.reset(options=Q)
    assert e.step("<python>print(6 * 7)</python>")[0] == "\n<result>\n42\n</result>\n"
    e.close()
    bare = gym.make("ARPO-Math-v0", tools=()).unwrapped  # nothing to shut down: it answers as before
    bare.reset(options=Q)
    bare.close()
    assert bare.step("<answer>\\boxed{4}</answer>")[2]


@pytest.mark.parametrize("action, expect", [
    ("<python>print(1)", "<python> tag is not closed"),
    ("<answer>\\boxed{4}", "<answer> tag is not closed"),
    ("<think>hmm", "<think> tag is not closed"),
])
def test_malformed_tags_get_readable_errors(env, action, expect):
    env.reset(options=Q)
    obs, reward, term, trunc, info = env.step(action)
    assert expect in obs and not (term or trunc)
    assert "<search>" not in obs and "<browse>" not in obs  # it named tools this env does not have
    obs, reward, term, *_ = env.step("<answer>\\boxed{408}</answer>")
    assert term and reward == -1.0  # the transcript still has the broken tag: format gate


def test_plain_text_ends_the_episode(env):
    env.reset(options=Q)
    obs, reward, term, trunc, info = env.step("I believe the answer is 408.")
    assert term and reward == -1.0 and "no <answer>" in " ".join(info["reward_parts"]["errors"])


def test_huge_and_binary_actions(env):
    env.reset(options=Q)
    obs, *_ = env.step(b"<python>print('\xff\xfe ok')</python>")
    assert "ok" in obs
    obs, reward, term, trunc, info = env.step("<python>" + "1" * 2_000_000 + "</python>")
    assert trunc and "length budget" in obs
    env.reset(options=Q)
    with pytest.raises(TypeError, match="text the model generated"):
        env.step(12)
    obs, *_ = env.step("<python>print('\udcff'.encode('utf-8', 'replace'))</python>")
    assert "surrogates not allowed" in obs and "Traceback" not in obs


def test_observations_are_valid_unicode_whatever_a_cell_prints(env):
    # Lone surrogates (a cell that prints chr(0xd800), a traceback quoting one) have no UTF-8 encoding: a tokenizer
    # refuses them, and the rollout engine with it. The observation carries U+FFFD instead; a pair is its character.
    env.reset(options=Q)
    for code, shown in [("print(chr(0xd800))", "\ufffd"), ("print('\\ud83d\\ude00')", "\U0001F600"),
                        ("raise ValueError(chr(0xdcff))", "ValueError: \ufffd")]:
        obs, *_ = env.step(f"<python>{code}</python>")
        assert obs.encode("utf-8") and shown in obs, obs
    obs, *_ = env.step("<python>print('still here')</python>")
    assert "still here" in obs


def test_env_fork_keeps_interpreter_and_transcript(env):
    env.reset(options=Q)
    env.step("<python>x = 41</python>")
    child = env.unwrapped.fork()
    child.step("<python>x = 0</python>")
    assert env.unwrapped.step("<python>x + 1</python>")[0].strip() == "<result>\n42\n</result>"
    assert child.step("<python>x + 1</python>")[0].strip() == "<result>\n1\n</result>"
    assert child.completion != env.unwrapped.completion
    assert child.state.task == env.unwrapped.state.task
    child.close()


def test_env_snapshot_pickle_restore(env):
    env.reset(options=Q)
    env.step("<python>x = 41</python>")
    snap = pickle.loads(pickle.dumps(env.unwrapped.snapshot()))
    other = gym.make("ARPO-Math-v0")
    other.unwrapped.restore(snap)
    assert other.unwrapped.completion == env.unwrapped.completion
    obs, reward, term, trunc, info = other.unwrapped.step("<python>x + 1</python>")
    assert "42" in obs and info["tool_calls"] == 2
    for restore in (other.unwrapped.restore, lambda saved: arpo_env.restore(other, saved)):
        with pytest.raises(ValueError, match="a snapshot is the dict snapshot\\(\\) returns, not NoneType"):
            restore(None)  # an AttributeError and a TypeError
    other.close()


def test_a_snapshot_of_other_types_is_refused_and_the_env_left_as_it_was(env):
    """A snapshot edited or damaged: cells given as text were run letter by letter, a done of "no" was done, a task
    of null a TypeError; and what failed midway left the env half restored (its old interpreter shut down, its state
    the old one). Each is a ValueError now, checked before anything changes."""
    env.reset(options=Q)
    env.step("<python>x = 41</python>")
    snap = env.unwrapped.snapshot()
    other = gym.make("ARPO-Math-v0").unwrapped
    other.reset(options=Q)
    other.step("<python>y = 7</python>")
    before = other.snapshot()
    for change, words in [(lambda s: s["tools"]["python"].update(cells="x = 1"), "a Python snapshot is {'cells'"),
                          (lambda s: s["state"].update(done="no"), "not a snapshot as snapshot() takes it (its task"),
                          (lambda s: s["state"].update(task=None), "not a snapshot as snapshot() takes it (its task"),
                          (lambda s: s.update(tools=[1]), "(its tools are no object of tool snapshots)"),
                          (lambda s: s.pop("state"), "(no 'state' field)"),
                          (lambda s: s.update(np_random={"x": 1}), "not a snapshot as snapshot() takes it")]:
        bad = copy.deepcopy(snap)
        change(bad)
        with pytest.raises(ValueError, match=re.escape(words)):
            other.restore(bad)
        assert other.snapshot() == before  # as it was, its interpreter open
    assert other.step("<python>print(y)</python>")[0] == "\n<result>\n7\n</result>\n"
    other.restore(snap)
    assert other.step("<python>print(x + 1)</python>")[0] == "\n<result>\n42\n</result>\n"
    other.close()


def test_deepcopy_is_a_fork_and_an_env_pickles(tmp_path):
    """``copy.deepcopy(env)``, how tree-search code clones an environment, failed ("cannot pickle 'socket'"), and so
    did pickling an env ("Can't pickle local object …<lambda>"). deepcopy is now `fork()`; a pickled env is made again
    from its id and arguments and restored from its snapshot; an env made without gym.make says what to do instead."""
    import copy

    from arpo_env.envs.math import MathEnv

    env = gym.make("ARPO-Math-v0", max_tool_calls=3, dataset="arithmetic:10:3")
    clean = copy.deepcopy(env)  # before any reset: the same configuration, no episode
    assert clean.reset(seed=4)[0] == env.reset(seed=4)[0]
    env.step("<python>x = 41</python>")
    shallow = copy.copy(env.unwrapped)  # what fork starts from: the same tools, not an env made again and replayed
    assert shallow.tools is env.unwrapped.tools and shallow.state is env.unwrapped.state
    clone = copy.deepcopy(env)
    assert "<result>\n0\n</result>" in clone.step("<python>x = 0\nprint(x)</python>")[0]
    assert "<result>\n42\n</result>" in env.step("<python>print(x + 1)</python>")[0]
    again = pickle.loads(pickle.dumps(env))
    assert again.unwrapped.completion == env.unwrapped.completion and again.unwrapped.max_tool_calls == 3
    obs, _, _, _, info = again.step("<python>print(x + 2)</python>")
    assert "43" in obs and "last tool call" in obs and info["tool_calls"] == 3
    assert len(pickle.loads(pickle.dumps(clean)).unwrapped.tasks) == 10
    direct = MathEnv(dataset="arithmetic:4:3")
    with pytest.raises(TypeError, match="made without gym.make.*snapshot"):
        pickle.dumps(direct)
    for e in (env, clean, clone, again, direct):
        e.close()


def test_reset_options(env):
    obs, info = env.reset(options={"index": 5})
    assert info["task"] == env.unwrapped.tasks[5].as_dict()
    with pytest.raises(IndexError):
        env.reset(options={"index": 10_000})
    with pytest.raises(ValueError, match="answer"):
        env.reset(options={"question": "q"})
    # an answer alone drew a task of the dataset, its own gold scoring it; a question None was asked as "None"
    for options in ({"answer": "42"}, {"question": None, "answer": "42"}):
        with pytest.raises(ValueError, match=re.escape('a custom task needs both "question" (text) and "answer"')):
            env.reset(options=options)
    # a misspelt option drew a random task; an index of 1.5 was task 1, and "a" was int()'s error
    with pytest.raises(ValueError, match=re.escape("reset options ['idx'] are not known")):
        env.reset(options={"idx": 5})
    for index in (1.5, "a", True, None):
        with pytest.raises(ValueError, match=re.escape("options['index'] must be a whole number")):
            env.reset(options={"index": index})
    assert env.reset(options={"index": np.int64(5)})[1]["task"] == env.unwrapped.tasks[5].as_dict()
    assert env.reset(options={"index": -1})[1]["task"] == env.unwrapped.tasks[-1].as_dict()  # as a list counts
    # a string's letters were named as unknown options
    with pytest.raises(ValueError, match=re.escape("reset options are a dict ({'index': i} or")):
        env.reset(options="index")


def test_a_dataset_given_as_a_path_is_read_and_arguments_of_the_wrong_type_are_named(tmp_path):
    """``dataset=pathlib.Path(...)`` was an AttributeError ("'PosixPath' object has no attribute 'startswith'"), a
    number the same; options given as text "dictionary update sequence element #0 has length 1; 2 is required"."""
    from pathlib import Path

    (tmp_path / "mine.jsonl").write_text(json.dumps({"question": "What is 2 + 2?", "answer": "4"}) + "\n")
    for env_id in ("ARPO-Math-v0", "ARPO-QA-v0"):
        env = gym.make(env_id, dataset=Path(tmp_path / "mine.jsonl"),
                       **({"search_options": {"cache": False}} if env_id == "ARPO-QA-v0" else {}))
        assert [(t.question, t.answer) for t in env.unwrapped.tasks] == [("What is 2 + 2?", "4")]
        env.close()
    assert load_tasks(tmp_path / "mine.jsonl")[0].answer == "4"
    with pytest.raises(ValueError, match="dataset is a name .* or a file's path, not int '5'"):
        gym.make("ARPO-Math-v0", dataset=5)
    for options in ("sandbox_options", "search_options", "browse_options"):
        with pytest.raises(ValueError, match=f"{options} is a dict of options, not str 'x'"):
            gym.make("ARPO-DeepSearch-v0", **{options: "x"})


def test_tasks_given_as_records_are_read_as_a_files_and_bad_arguments_are_named():
    """``tasks=[{"question": …, "answer": …}]`` was an AttributeError ("'dict' object has no attribute 'question'"),
    a string's letters were tasks; ``search=None`` (the default, as gym's other arguments read None) an
    AttributeError; ``tool_bonus="x"`` failed at the first correct answer that used both tools, NaN made rewards NaN,
    ``strict_think="no"`` was strict; ``judge_url=5`` an AttributeError."""
    env = gym.make("ARPO-Math-v0", tasks=[{"problem": "What is 2 + 2?", "answer": 4.0}])
    assert [(t.question, t.answer, t.kind) for t in env.unwrapped.tasks] == [("What is 2 + 2?", "4", "math")]
    env.close()
    env = gym.make("ARPO-QA-v0", tasks=[{"question": "Capital of France?", "answer": ["Paris", "Lutetia"]}],
                   search=None, search_options={"cache": False})
    env.reset(seed=0)
    assert env.unwrapped.tasks[0].kind == "qa" and env.step("<answer>\\boxed{Lutetia}</answer>")[1] == 1.0
    env.close()
    for env_id, kwargs, words in [
            ("ARPO-Math-v0", {"tasks": "abc"}, "tasks is a list of tasks, not str 'abc'"),
            ("ARPO-Math-v0", {"tasks": [5]}, r"tasks\[0\] is a Task or a record with a question and an answer"),
            ("ARPO-Math-v0", {"tasks": [{"question": "q"}]}, "tasks: record 1 has no gold answer"),
            ("ARPO-Math-v0", {"tool_bonus": "x"}, r"tool_bonus must be a number \(0.1 in the paper\), not 'x'"),
            ("ARPO-Math-v0", {"tool_bonus": float("nan")}, "tool_bonus must be a number"),
            ("ARPO-Math-v0", {"strict_think": "no"}, "strict_think must be true or false, not 'no'"),
            ("ARPO-QA-v0", {"search": 5}, "search must be a backend's name"),
            ("ARPO-QA-v0", {"judge_url": 5}, r"the endpoint's base URL is text \(http://host:port/v1\), not 5")]:
        with pytest.raises(ValueError, match=words):
            gym.make(env_id, **kwargs)


@pytest.mark.parametrize("env_id", ["ARPO-Math-v0", "ARPO-QA-v0"])
def test_a_custom_tasks_gold_is_read_as_a_datasets_is(env_id):
    """A custom task's gold went in as given: 1990.0 scored "1990" 0 on QA (F1 against "1990.0"), None scored the
    answer "None" right, and an object's values were aliases ("1" right against {"a": 1})."""
    env = gym.make(env_id)
    for gold, said, correct in [(1990.0, "1990", True), ([1990.0, "MCMXC"], "1990", True), (None, "None", False),
                                (np.array(["Paris", "Lutetia"]), "Lutetia", True)]:
        env.reset(options={"question": "q", "answer": gold})
        assert env.step(f"<answer>\\boxed{{{said}}}</answer>")[4]["reward_parts"]["correct"] is correct, gold
    with pytest.raises(ValueError, match=r"the custom task's gold answer is an object of fields \(a\), not text"):
        env.reset(options={"question": "q", "answer": {"a": 1}})
    env.close()


@pytest.mark.parametrize("name, n", [("gsm8k", 1319), ("math500", 500), ("math", 5000), ("aime24", 30),
                                     ("aime25", 30)])
def test_benchmarks_load_from_a_data_dir(data_dir, name, n):
    tasks = load_tasks(name, data_dir / "eval")
    assert len(tasks) == n and all(t.question and t.answer not in ("", None) for t in tasks)
    if name == "gsm8k":
        assert tasks[0].answer == "18"
    e = gym.make("ARPO-Math-v0", dataset=name, data_dir=str(data_dir))
    obs, info = e.reset(seed=0)
    assert info["task"]["source"] == name
    e.close()


def test_training_parquet_math_rows(data_dir):
    tasks = load_tasks("train", data_dir, kind="math")
    assert len(tasks) == 4999 and all(t.kind == "math" for t in tasks)  # 5000, record 5275 left out (blank gold)
    text = "".join(t.question for t in tasks)
    assert "\x08" not in text and "\x0c" not in text and "in the form \\frac{m}{n}" in text  # \f of \frac: a form feed


def test_a_dataset_file_is_read_once_per_version_and_its_tasks_shared(data_dir, tmp_path, caplog):
    """`arpo eval` makes an env for each sample, and each env read its benchmark's whole file again (MATH's 5,000
    problems: 0.13 s an env, 11 minutes a run), warning again of each row left out. Envs of one file now share its
    tasks; an edited file is read anew."""
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i or "")}) + "\n" for i in range(4)))
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        envs = [gym.make("ARPO-Math-v0", dataset=str(path)) for _ in range(3)]
    try:
        first, *others = (e.unwrapped.tasks for e in envs)
        assert [t.question for t in first] == ["q1", "q2", "q3"]
        assert all(o is not first and all(a is b for a, b in zip(o, first)) for o in others)
        assert caplog.text.count("1 record with a blank gold answer left out (record 1)") == 1
    finally:
        for e in envs:
            e.close()
    path.write_text(json.dumps({"question": "q9", "answer": "9"}) + "\n")
    assert [t.question for t in load_tasks(str(path))] == ["q9"]


def test_a_task_whose_gold_is_blank_is_left_out_with_a_warning(data_dir, tmp_path, caplog):
    # train_10k's record 5275 (a compass construction) has the gold " ": no answer could be scored right, and a
    # run trained on it, an eval counted it wrong, without a word.
    train = tmp_path / "train_10k.parquet"  # a copy: a file's tasks are read (and warned of) once per process
    train.write_bytes((data_dir / "train" / "train_10k.parquet").read_bytes())
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        tasks = load_tasks("train", tmp_path)
    assert len(tasks) == 9999 and "5274" not in {t.id for t in tasks} and all(aliases(t.answer) for t in tasks)
    assert "1 record with a blank gold answer left out (record 5275)" in caplog.text
    path = tmp_path / "mine.jsonl"
    rows = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": ""}, {"question": "q3", "answer": [" "]},
            {"question": "q4", "answer": ["", "Paris"]}, {"question": "q5", "answer": "5"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        assert [t.question for t in load_tasks(str(path))] == ["q1", "q4", "q5"]
        assert [t.question for t in load_tasks(str(path), limit=2)] == ["q1", "q4"]  # the limit counts kept tasks
    assert "2 records with a blank gold answer left out (records 2, 3)" in caplog.text
    path.write_text(json.dumps(rows[1]) + "\n")
    with pytest.raises(DataNotFound, match="holds no tasks with a gold answer .1 have a blank one."):
        load_tasks(str(path))
    table = tmp_path / "mine.csv"  # an empty cell in the answer column refused the whole table
    table.write_text("question,answer,level\nq1,1,\nq2,,3\nq3,3,\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        assert [(t.question, t.meta) for t in load_tasks(str(table))] == [("q1", {}), ("q3", {})]
    assert "1 record with a blank gold answer left out (record 2)" in caplog.text
    path.write_text(json.dumps({"question": "q", "answer": "", "ground_truth": "5"}) + "\n")
    assert load_tasks(str(path))[0].answer == "5"  # a blank field does not hide a gold in the next


def test_a_question_with_an_image_or_a_file_is_left_out_with_a_warning(tmp_path, caplog):
    """HLE's own files hold its questions with their images (``image``, a data URI; a seventh of the 2,500), GAIA's
    metadata names the files its questions come with (``file_name``): a text model was asked about a picture or a
    spreadsheet it never saw, and scored as wrong on it. The paper takes the text-only ones."""
    rows = [{"id": "a", "question": "Which word?", "image": "", "answer": "D", "answer_type": "multipleChoice"},
            {"id": "b", "question": "What does the image show?", "image": "data:image/png;base64,iVBORw0KGgo=",
             "answer": "a cat", "answer_type": "exactMatch"},
            {"id": "c", "question": "How many?", "has_image": True, "answer": "3"},
            {"id": "d", "question": "How much?", "has_image": False, "answer": "4", "file_name": ""},
            {"task_id": "e", "Question": "What is the total in the attached spreadsheet?", "Final answer": "89706",
             "file_name": "7bd855d8-463d-4ed5-93ca-5fe35145f733.xlsx"}]
    path = tmp_path / "hle.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        assert [t.id for t in load_tasks(str(path), kind="qa")] == ["a", "d"]
    assert ("3 records whose question comes with an image or a file left out (records 2, 3, 5): a text model is not "
            "given it") in caplog.text
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[1:3]))
    with pytest.raises(DataNotFound, match=r"holds no qa tasks without an image or a file \(2 have one\)"):
        load_tasks(str(path), kind="qa")


def test_a_hub_dataset_is_read_as_a_file_is(monkeypatch, caplog):
    """A ``hub:`` dataset kept every row whatever its ability (``kind="math"`` gave the QA rows of a mixed set too),
    and an empty one was no error until the env refused it. It is read as a file is. (The hub is out of reach here:
    its rows are given to `load_tasks` as `datasets.load_dataset` would give them.)"""
    import datasets

    rows = [{"question": "1+1?", "answer": "2", "ability": "math"}, {"question": "Capital?", "answer": "Paris",
                                                                       "ability": "qa"},
            {"question": "What does the image show?", "answer": "3", "image": "data:image/png;base64,AAAA",
             "ability": "math"}, {"question": "2+2?", "answer": " ", "ability": "math"}]
    asked = []
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, split: asked.append((repo, split)) or rows)
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        assert [t.question for t in load_tasks("hub:someone/mixed", kind="math")] == ["1+1?"]
    assert asked == [("someone/mixed", "test")]
    assert "hub:someone/mixed: 1 record with a blank gold answer left out (record 4)" in caplog.text
    assert "hub:someone/mixed: 1 record whose question comes with an image or a file left out (record 3)" in caplog.text
    rows[:] = rows[2:]
    with pytest.raises(DataNotFound, match="hub:someone/mixed:train holds no math tasks with a gold answer"):
        load_tasks("hub:someone/mixed:train", kind="math")


def test_the_sandbox_cannot_read_the_tasks_answers(tmp_path):
    # The model is rewarded for the answer in the task's file: a cell that reads it (an agent exploring the file
    # system) would be rewarded for that. The env hides its data folder and the package's own datasets.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "test.jsonl").write_text('{"question": "What is 6 * 7?", "answer": "42"}\n')
    env = gym.make("ARPO-Math-v0", dataset="mine", data_dir=str(tmp_path))
    env.reset(seed=0)
    try:
        packaged = Path(arpo_env.__file__).parent / "data" / "math_default.jsonl"
        for path in (tmp_path / "mine" / "test.jsonl", packaged):
            obs, *_ = env.unwrapped.step(f"<python>print(open({str(path)!r}).read())</python>")
            assert "is hidden from the sandbox" in obs and '"answer"' not in obs, obs
        obs, *_ = env.unwrapped.step(f"<python>import os\nos.listdir({str(tmp_path)!r})</python>")
        assert "is hidden from the sandbox" in obs, obs
        obs, *_ = env.unwrapped.step("<python>print(6 * 7)</python>")  # computing is what it is for
        assert "42" in obs and "hidden" not in obs
    finally:
        env.close()


def test_missing_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("ARPO_DATA_DIR", raising=False)
    with pytest.raises(DataNotFound, match="data directory"):
        load_tasks("gsm8k")
    with pytest.raises(DataNotFound, match="looked for"):
        load_tasks("gsm8k", tmp_path)
    assert "hub:" not in str(pytest.raises(DataNotFound, load_tasks, "gsm8k").value)
    # a Hugging Face id, as TRL's dataset_name takes one, is named in its hub: form (offline, the hub itself fails)
    with pytest.raises(DataNotFound, match="a Hugging Face dataset is named hub:openai/gsm8k$"):
        load_tasks("openai/gsm8k")
    with pytest.raises(DataNotFound, match="looked for: .* a Hugging Face dataset is named hub:openai/gsm8k:main$"):
        load_tasks("openai/gsm8k:main", tmp_path)


def test_an_unreadable_data_file_is_a_clear_error_naming_the_file_and_line(tmp_path):
    good = '{"question": "1+1?", "answer": "2"}'
    cases = {
        "cut/test.jsonl": (good + "\n" + good[:20], "cut/test.jsonl line 2 is not JSON ("),
        "list.json": ("[" + good + ",\n" + good + ",\n{oops}]", "list.json line 3 is not JSON"),
        "number.jsonl": (good + "\n42", "number.jsonl: record 2 is a int, not an object of fields"),
        "latin1.jsonl": (b'{"question": "caf\xe9?", "answer": "2"}', "latin1.jsonl is not UTF-8 text"),
        "broken.parquet": (b"PAR1 not really", "broken.parquet is not a readable parquet file"),
        # a record without a question or a gold answer: its number counts from 1 like the others (it said "record
        # 1" of the second), and the fields it has are named
        "noanswer.jsonl": (good + '\n{"question": "q", "gold": "2"}', "noanswer.jsonl: record 2 has no gold answer ("),
        "noquestion.jsonl": (good + '\n{"text": "q", "answer": "2"}', "record 2 has no question (a text field "),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(DataUnreadable) as info:
            load_tasks(str(path) if "/" not in name else "cut", tmp_path)
        assert message in str(info.value), str(info.value)
    with pytest.raises(DataUnreadable, match="line 2 is not JSON"):  # the env says the same
        gym.make("ARPO-Math-v0", dataset="cut", data_dir=str(tmp_path))
    (tmp_path / "aime24").mkdir()
    (tmp_path / "aime24" / "test.jsonl").write_text(good[:20])
    result = subprocess.run([sys.executable, "-m", "arpo_algo.cli", "eval", "--model", "smollm2-135m", "--benchmarks",
                             "aime24", "--data_dir", str(tmp_path), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "arpo eval: aime24: " in result.stderr and "test.jsonl line 1 is not JSON" in result.stderr


def test_a_json_file_is_read_as_the_document_it_is(tmp_path):
    """A ``.json`` file holding one object was read as JSON lines: a pretty-printed ``{"version": …, "data": [...]}``
    was refused as "line 1 is not JSON" (it is JSON). An object holding its records as its one list of objects gives
    them; a file of one record is that record; JSON lines under ``.json`` (as `datasets`' ``to_json`` writes them)
    stay JSON lines, and a broken line is still named."""
    rows = [{"question": "1+1?", "answer": "2"}, {"question": "2+2?", "answer": "4"}]
    cases = {"wrapped.json": json.dumps({"version": "1.0", "data": rows}, indent=2),
             "one.json": json.dumps(rows[0], indent=2),
             "lines.json": "".join(json.dumps(r) + "\n" for r in rows),
             "chat.json": json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}, indent=1)}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        tasks = load_tasks(str(tmp_path / name))
        assert [(t.question, t.answer) for t in tasks] == [(r["question"], r["answer"]) for r in rows][:len(tasks)]
        assert len(tasks) == (1 if name in ("one.json", "chat.json") else 2), name
    (tmp_path / "broken.json").write_text('{\n "question": "q",\n "answer":\n}')
    with pytest.raises(DataUnreadable, match="broken.json line 4 is not JSON"):
        load_tasks(str(tmp_path / "broken.json"))
    (tmp_path / "cut.json").write_text(cases["lines.json"] + "{oops\n")
    with pytest.raises(DataUnreadable, match="cut.json line 3 is not JSON"):
        load_tasks(str(tmp_path / "cut.json"))


def test_hostile_json_values_are_read_or_refused_by_name(tmp_path):
    """A gold of 5,000 digits raised Python's ValueError on an int's digits, a record nested 100,000 deep a
    RecursionError, neither naming the file; a gold that is an object of fields became its keys as aliases."""
    path = tmp_path / "hostile.jsonl"
    path.write_text('{"question": "2**16610?", "answer": ' + "9" * 5000 + "}\n")
    assert load_tasks(str(path))[0].answer == "9" * 5000
    path.write_text('{"question": "q", "answer": "1"}\n{"question": "q", "answer": ' + "[" * 100_000 + "]" * 100_000
                    + "}\n")
    with pytest.raises(DataUnreadable, match="hostile.jsonl line 2: JSON nested too deeply to read"):
        load_tasks(str(path))
    path.write_text('{"question": "q", "answer": {"value": "5", "unit": "m"}}\n')
    with pytest.raises(DataUnreadable, match=r"record 1's gold answer is an object of fields \(value, unit\)"):
        load_tasks(str(path))


def test_null_and_float_golds_and_lone_surrogates(tmp_path, caplog):
    """A parquet table's null gold refused the whole table (its blank cells in a CSV are left out); a float column's
    NaN was the gold "nan", and its whole numbers (an integer column with a null, through pandas) "1990.0", which
    QA's F1 scores 0 against "1990". A lone surrogate in a question (an emoji cut in half) reached the prompt, which
    no tokenizer encodes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from arpo_env.scoring.qa_metrics import best_f1

    path = tmp_path / "years.parquet"
    pq.write_table(pa.table({"question": ["q1", "q2", "q3", "q4"], "answer": ["1990", None, "3", "4"],
                             "ground_truth": [None, None, 2.5, None]}), path)
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        assert [(t.question, t.answer) for t in load_tasks(str(path))] == [("q1", "1990"), ("q3", "3"), ("q4", "4")]
    assert "1 record with a blank gold answer left out (record 2)" in caplog.text
    pq.write_table(pa.table({"question": ["q1", "q2", "q3"], "answer": [1990.0, float("nan"), 2.5]}), path)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="arpo_env.datasets"):
        tasks = load_tasks(str(path), kind="qa")
    assert [(t.question, t.answer) for t in tasks] == [("q1", "1990"), ("q3", "2.5")]
    assert best_f1("1990", tasks[0].answer) == 1.0
    assert "1 record with a blank gold answer left out (record 2)" in caplog.text
    path = tmp_path / "torn.jsonl"
    path.write_text('{"question": "What does \\ud83d mean?", "answer": "x\\ud800"}\n')
    task = load_tasks(str(path))[0]
    assert (task.question, task.answer) == ("What does \ufffd mean?", "x\ufffd")
    env = gym.make("ARPO-Math-v0", dataset=str(path))
    for options in ({"index": 0}, {"question": "torn \ud83d", "answer": "1"}):
        obs, info = env.reset(options=options)
        obs.encode("utf-8")
        json.dumps(info["messages"], ensure_ascii=False).encode("utf-8")
    env.close()


def test_math_and_conversational_layouts_load(tmp_path):
    """MATH's own layout (``problem``, a worked ``solution`` ending in ``\\boxed{}``) and TRL's conversational rows
    (``prompt`` as chat messages, ``reward_model``) were refused for want of a question or an answer field."""
    rows = [{"problem": "What is $2+2$?", "solution": "Since $2+2=4$, the answer is $\\boxed{\\frac{8}{2}}$.",
             "level": "Level 1", "type": "Algebra"},
            {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"}],
             "reward_model": {"ground_truth": "6"}}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = gym.make("ARPO-Math-v0", dataset=str(path))
    assert [(t.question, t.answer) for t in env.unwrapped.tasks] == [("What is $2+2$?", "\\frac{8}{2}"), ("3+3?", "6")]
    env.reset(options=env.unwrapped.tasks[0].as_dict())
    assert env.step("<answer>\\boxed{4}</answer>")[1] == 1.0  # the boxed answer of the solution is the gold
    env.close()
    # a one-line solution without \boxed{} is the answer itself, as TRL's accuracy_reward reads it; a worked one is
    # no answer
    (tmp_path / "plain.jsonl").write_text(json.dumps({"question": "q", "solution": "four"}) + "\n")
    assert load_tasks(str(tmp_path / "plain.jsonl"))[0].answer == "four"
    worked = "Two and two make four.\nSo that is the number of legs."
    (tmp_path / "nobox.jsonl").write_text(json.dumps({"question": "q", "solution": worked}) + "\n")
    with pytest.raises(DataUnreadable, match=r"record 1 has no gold answer .*; its fields: question, solution$"):
        load_tasks(str(tmp_path / "nobox.jsonl"))


def test_the_benchmarks_own_layouts_give_their_golds(tmp_path):
    """GAIA's own metadata names its gold ``Final answer`` and Bamboogle's ``Answer``: both files were refused (no
    gold answer). MuSiQue keeps a gold's other forms in ``answer_aliases``, which were dropped, so an answer in one of
    those forms scored as a wrong one. HotpotQA's own file names its ids ``_id``."""
    rows = [{"task_id": "c61d22de", "Question": "How many studio albums?", "Level": 1, "Final answer": "3",
             "file_name": ""},
            {"Question": "Who was president when the Eiffel Tower was built?", "Answer": "Sadi Carnot"},
            {"id": "2hop__1", "question": "Where was the author of Vasa born?", "answer": "Stockholm",
             "answer_aliases": ["Stockholm, Sweden", "Sthlm", "Stockholm"], "answerable": True},
            {"_id": "5a8b57f2", "question": "Which magazine was started first?", "answer": "Arthur's Magazine",
             "type": "comparison", "level": "medium"}]
    path = tmp_path / "layouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(str(path), kind="qa")
    assert [(t.id, t.answer) for t in tasks] == [("c61d22de", "3"), ("1", "Sadi Carnot"),
                                                  ("2hop__1", ["Stockholm", "Stockholm, Sweden", "Sthlm"]),
                                                  ("5a8b57f2", "Arthur's Magazine")]
    env = gym.make("ARPO-QA-v0", dataset=str(path), search_options={"cache": False})
    env.reset(options={"index": 2})
    assert env.step("<answer>\\boxed{Sthlm}</answer>")[1] == 1.0
    env.close()


def test_a_data_file_with_a_byte_order_mark_crlf_and_line_separators_in_its_text_loads(tmp_path):
    """Files saved by Windows tools start with a byte-order mark and end lines with CRLF; JSON text may hold U+2028,
    U+2029 or U+0085 unescaped (scraped web text does). Each was "not JSON"."""
    rows = [{"question": "Who?\u2028Line two", "answer": "a\x85b"}, {"question": "What?\u2029", "answer": "2"}]
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows).encode() + b"\r\n")
    tasks = load_tasks(str(path))
    assert [(t.question, t.answer) for t in tasks] == [("Who?\u2028Line two", "a\x85b"), ("What?", "2")]
    listed = tmp_path / "windows.json"
    listed.write_bytes(b"\xef\xbb\xbf" + json.dumps(rows, ensure_ascii=False).encode())
    assert [t.question for t in load_tasks(str(listed))] == ["Who?\u2028Line two", "What?"]


def test_a_csv_or_tsv_table_loads_and_another_file_is_named_for_what_it_is(tmp_path):
    """A CSV file, the commonest table there is, was "needs a data directory … eval/<path>/test.jsonl"."""
    (tmp_path / "sums.csv").write_bytes(b'\xef\xbb\xbfquestion,answer,level\r\n"What is 1,000 + 1?",1001,\r\n'
                                        b'"Two\nlines?",2,easy\r\n')
    tasks = load_tasks(str(tmp_path / "sums.csv"))
    assert [(t.question, t.answer, t.source) for t in tasks] == [("What is 1,000 + 1?", "1001", "sums"),
                                                                 ("Two\nlines?", "2", "sums")]
    assert tasks[1].meta == {"level": "easy"} and tasks[0].meta == {}  # an empty cell is a missing field
    (tmp_path / "sums.tsv").write_text("problem\tsolution\nWhat is 2+2?\tIt is $\\boxed{4}$.\n")
    env = gym.make("ARPO-Math-v0", dataset=str(tmp_path / "sums.tsv"))
    assert [(t.question, t.answer) for t in env.unwrapped.tasks] == [("What is 2+2?", "4")]
    env.close()
    (tmp_path / "extra.csv").write_text("question,answer\nq,1\nq,2,3\n")
    with pytest.raises(DataUnreadable, match=r"extra.csv row 3 has more cells than the header row names"):
        load_tasks(str(tmp_path / "extra.csv"))
    (tmp_path / "notes.txt").write_text("question: 1+1?\n")
    with pytest.raises(DataUnreadable, match=r"notes.txt: a dataset file is .jsonl, .json, .parquet, .csv or .tsv, "
                                              r"not .txt"):
        load_tasks(str(tmp_path / "notes.txt"))


def test_a_tool_the_env_lacks_is_an_observation_that_costs_budget():
    env = gym.make("ARPO-Math-v0", max_tool_calls=2).unwrapped
    env.reset(options={"question": "q", "answer": "1"})
    obs, reward, terminated, truncated, info = env.step("<search>capital of France</search>")
    assert not (terminated or truncated) and "no <search> tool" in obs and "<python>" in obs
    assert info["unavailable_calls"] == 1 and info["tool_calls"] == 0
    obs, *_ = env.step("<python>print(1)</python>")
    assert "1" in obs and "last tool call" in obs  # the rejected call counted against the budget of 2
    obs, _, _, truncated, _ = env.step("<browse>http://x</browse>")
    assert truncated and "budget" in obs
    env.reset(options={"question": "q", "answer": "1"})
    env.step("<search>x</search>")
    _, reward, terminated, _, info = env.step("<answer>\\boxed{1}</answer>")
    assert terminated and reward == 1.0 and info["reward_parts"]["bonus"] == 0.0  # answered: well-formed, no bonus
    env.close()


def test_a_turn_with_several_tool_calls_runs_none_and_says_so():
    """Each call must be followed by its result. Running the last one alone answered `print(x)` with a NameError for
    an `x` the model had defined one call before, and the completion was then a format error whatever it did."""
    env = gym.make("ARPO-Math-v0", max_tool_calls=3).unwrapped
    env.reset(options={"question": "What is 12 * 34?", "answer": "408"})
    obs, reward, terminated, truncated, info = env.step("<python>x = 12</python> then <python>print(x * 34)</python>")
    assert not (terminated or truncated) and "2 tool calls in one turn" in obs and "none ran" in obs
    assert info["refused_calls"] == 1 and info["tool_calls"] == 0 and info["tool_failed"]
    obs, *_ = env.step("<python>x = 12\nprint(x * 34)</python>")
    assert "408" in obs and "NameError" not in obs and "last tool call" not in obs  # 2 of 3 used
    fork = env.fork()
    assert fork.state.refused_calls == 1 and type(env.state).from_dict(env.state.to_dict()).budget_used == 2
    fork.close()
    obs, *_ = env.step("<python>print(1)</python>")
    assert "last tool call" in obs
    obs, reward, terminated, truncated, info = env.step("<python>print(2)</python><python>print(3)</python>")
    assert truncated and "budget" in obs  # out of budget: the episode ends as for any call
    env.reset(options={"question": "q", "answer": "1"})  # many calls are counted, not listed: 10 KB for 1,000 before
    obs = env.step("<python>print(1)</python>" * 1000 + "<search>one</search>")[0]
    assert "1001 tool calls in one turn (<python> ×1000, <search> ×1); none ran" in obs and len(obs) < 300
    env.close()


def test_interval_gold_answers_keep_their_meaning(data_dir):
    """MATH's gold [-2,0] is an interval, not the aliases -2 and 0."""
    env = gym.make("ARPO-Math-v0", dataset="math", data_dir=str(data_dir / "eval"), tools=()).unwrapped
    index = next(i for i, t in enumerate(env.tasks) if t.answer == "[-2,0]")
    for written, expected in [("[-2,0]", 1.0), ("0", 0.0), ("-2", 0.0)]:
        env.reset(options={"index": index})
        assert env.step(f"<answer>\\boxed{{{written}}}</answer>")[1] == expected, written
    env.close()


def test_fork_of_a_wrapped_env_keeps_its_wrappers_and_counters():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make("ARPO-Math-v0", max_episode_steps=2))
    env.reset(seed=0, options={"question": "q", "answer": "2"})
    env.step("<python>x = 1</python>")
    branch = arpo_env.fork(env)
    assert isinstance(branch, gym.wrappers.RecordEpisodeStatistics) and branch.unwrapped is not env.unwrapped
    assert [type(w).__name__ for w in (branch, branch.env)] == ["RecordEpisodeStatistics", "TimeLimit"]
    obs, _, _, truncated, info = branch.step("<python>print(x + 1)</python>")  # the forked interpreter has x
    assert "2" in obs and truncated and info["episode"]["l"] == 2  # the time limit counted the step before the fork
    obs, _, terminated, truncated, _ = env.step("<python>print(x)</python>")  # the original is independent
    assert "1" in obs and truncated
    env.close()
    branch.close()


def test_restore_into_a_made_env_is_steppable_through_its_wrappers():
    import pickle

    env = gym.make("ARPO-Math-v0", max_episode_steps=3)
    env.reset(seed=0, options={"question": "q", "answer": "2"})
    env.step("<python>x = 41</python>")
    saved = pickle.loads(pickle.dumps(arpo_env.snapshot(env)))
    env.close()
    other = gym.make("ARPO-Math-v0", max_episode_steps=3)  # never reset: restore is enough
    arpo_env.restore(other, saved)
    obs, _, _, truncated, _ = other.step("<python>print(x + 1)</python>")
    assert "42" in obs and not truncated
    _, _, _, truncated, _ = other.step("<python>print(0)</python>")
    assert truncated  # step 3 of 3: the restored time limit went on counting
    bare = gym.make("ARPO-Math-v0")
    bare.reset(options={"question": "q", "answer": "2"})
    arpo_env.restore(bare, other.unwrapped.snapshot())  # a bare ToolEnv snapshot works too
    assert "42" in bare.step("<python>print(x + 1)</python>")[0]
    fresh = gym.make("ARPO-Math-v0")  # and into an env never reset, as an AsyncVectorEnv's call("snapshot") gives it:
    arpo_env.restore(fresh, other.unwrapped.snapshot())  # Gymnasium's env checker raised a TypeError at its step
    assert "42" in fresh.step("<python>print(x + 1)</python>")[0]
    other.close()
    bare.close()
    fresh.close()


def test_arithmetic_difficulty_is_the_number_of_terms():
    from arpo_env.datasets.procedural import arithmetic_tasks

    three = gym.make("ARPO-Math-v0", dataset="arithmetic:5:0").unwrapped.tasks
    four = gym.make("ARPO-Math-v0", dataset="arithmetic:5:0:4").unwrapped.tasks
    assert [t.question for t in three] == [t.question for t in arithmetic_tasks(5, 0)]
    assert all(len(t.meta["expression"].split()) == 5 for t in three)  # 3 numbers, 2 operators
    assert all(len(t.meta["expression"].split()) == 7 for t in four)
    assert all(str(eval(t.meta["expression"])) == t.answer for t in four)
    # Made once per name and process (every env of a rollout is made from the name: 1,000 tasks took 25 ms each time),
    # each env with a list of its own
    again = gym.make("ARPO-Math-v0", dataset="arithmetic:5:0:4").unwrapped.tasks
    assert again[0] is four[0] and again is not four


def test_chained_word_problems_need_one_call_per_step_and_read_each_result():
    """The chain family: seeded, its answers the operations applied in turn, and the teacher solves each task with
    one real interpreter call per step, each call carrying the number the previous one printed."""
    from arpo_env.datasets.procedural import chain_tasks, scripted_episode

    env = gym.make("ARPO-Math-v0", dataset="chain:6:4:2").unwrapped
    tasks = env.tasks
    assert [t.question for t in tasks] == [t.question for t in chain_tasks(6, 4, steps=2)]
    assert [t.question for t in tasks] != [t.question for t in chain_tasks(6, 5, steps=2)]
    for task in tasks:
        value = task.meta["start"]
        for op, k in task.meta["ops"]:
            value = {"+": value + k, "-": value - k, "*": value * k, "//": value // k}[op]
        assert len(task.meta["ops"]) == 2 and str(value) == task.answer and value >= 0
        assert str(task.meta["start"]) in task.question and "How many coins" in task.question
    episode = scripted_episode(env, tasks[0])
    actions = [text for kind, text in episode["segments"] if kind == "action"]
    results = [text for kind, text in episode["segments"] if kind == "observation"]
    assert episode["reward"] == 1.0 and len(results) == 2
    first = results[0].replace("<result>", "").replace("</result>", "").strip()
    assert f"print({first} " in actions[1]  # the second call starts from the first call's printed value
    env.close()


def test_noisy_chains_fault_some_results_the_same_way_every_time_and_the_teacher_retries():
    """The noisy family: chain tasks whose Python results fail at the task's seeded rate, as an interrupted cell
    (nothing ran) or a stale number (the value passed in). The same task meets the same faults in every episode, in
    a fork and after a restore; the teacher notices each fault, runs the cell again and answers right."""
    from arpo_env import faults
    from arpo_env.datasets.procedural import chain_tasks, procedural_tasks, scripted_episode

    tasks = procedural_tasks("noisy:40:3:2:30")
    assert [t.question for t in tasks] == [t.question for t in chain_tasks(40, 3, steps=2)]
    assert {t.meta["tool_faults"]["rate"] for t in tasks} == {0.3} and len({t.id for t in tasks}) == 40
    draws = [faults.scheduled(t.meta, "python", i) for t in tasks for i in range(10)]
    assert 0.2 < sum(d is not None for d in draws) / len(draws) < 0.4  # the rate, over 400 draws
    assert {"error", "stale"} <= set(draws) and faults.scheduled(tasks[0].meta, "search", 0) is None
    assert "tool_faults" not in procedural_tasks("noisy:5:3:2:0")[0].meta  # RATE 0: a plain chain
    assert procedural_tasks("arithmetic:5:3:3:20")[0].meta["tool_faults"]["rate"] == 0.2
    with pytest.raises(ValueError, match="RATE must be a whole number from 0 to 100"):
        procedural_tasks("noisy:5:3:2:101")

    env = gym.make("ARPO-Math-v0", dataset="noisy:40:3:2:30", max_tool_calls=8).unwrapped
    faulted = next(t for t in tasks if faults.scheduled(t.meta, "python", 0) == "stale")
    env.reset(options={"index": tasks.index(faulted)})
    obs, _, _, _, info = env.step("<python>print(1234 * 3)</python>")
    assert obs == "\n<result>\n1234\n</result>\n" and info["tool_fault"] == "stale"
    snapshot = env.snapshot()
    child = env.fork()
    later = [env.step("<python>print(1234 * 3)</python>")[0] for _ in range(3)]
    assert [child.step("<python>print(1234 * 3)</python>")[0] for _ in range(3)] == later  # the same draws
    env.restore(snapshot)
    assert [env.step("<python>print(1234 * 3)</python>")[0] for _ in range(3)] == later
    child.close()

    wins, retried = 0, 0
    for task in tasks[:12]:
        episode = scripted_episode(env, task)
        text = "".join(piece for _, piece in episode["segments"])
        assert "</answer>" in text or "budget" in text
        wins += episode["reward"] == 1.0
        retried += "I run the cell again" in text
    assert wins >= 10 and retried >= 3
    env.close()


def test_keyword_arguments_as_a_user_would_write_them():
    """tools="python" was read letter by letter ("unknown tool 'p'"), dataset=None (QAEnv's default) was an
    AttributeError traceback, and a sandbox limit no worker can run under (timeout_s=-1, "10") made an env whose every
    Python call failed."""
    env = gym.make("ARPO-Math-v0", tools="python, search", dataset=None)
    env.reset(seed=0)
    assert list(env.unwrapped.tools) == ["python", "search"] and len(env.unwrapped.tasks) == 100
    assert env.step("<python>print(6 * 7)</python>")[0] == "\n<result>\n42\n</result>\n"
    env.close()
    for options, words in [({"timeout_s": -1}, "timeout_s must be a number of seconds above 0 and at most "
                                               "100,000,000, not -1"),
                           ({"timeout_s": "10"}, "timeout_s must be a number of seconds above 0 and at most "
                                                 "100,000,000, not '10'"),
                           ({"memory_mb": 1.5, "kill_grace_s": -1}, "kill_grace_s must be a number of seconds of at "
                            "least 0 and at most 100,000,000, not -1; memory_mb must be a whole number of at least 0 "
                            "and at most 1,099,511,627,776, not 1.5"),
                           # past these, every cell failed (an OverflowError for the time, a dead worker)
                           ({"cpu_s": 1e10}, "cpu_s must be a number of seconds above 0 and at most 100,000,000, "
                                             "not 10000000000.0"),
                           ({"memory_mb": 2 ** 62}, "memory_mb must be a whole number of at least 0 and at most "
                                                    "1,099,511,627,776, not 4611686018427387904")]:
        with pytest.raises(ValueError, match=re.escape(f"sandbox_options: {words}")):
            gym.make("ARPO-Math-v0", sandbox_options=options)
    for tools in (5, [5], b"python", {"python": 1}):  # "'int' object is not iterable", an unknown tool 5 or 112
        with pytest.raises(ValueError, match=re.escape("tools are tool names (python, search, browse) as a list or "
                                                       "one string, and a tool of your own is a function or an "
                                                       f"MCPTools in the list, not {type(tools).__name__}")):
            gym.make("ARPO-Math-v0", tools=tools)
    with pytest.raises(ValueError, match=re.escape("sandbox_options: unknown timeout (did you mean timeout_s?), nope; "
                                                   "the options are timeout_s, cpu_s,")):
        gym.make("ARPO-Math-v0", sandbox_options={"timeout": 5, "nope": 1})  # was a TypeError naming every kwarg


def test_options_for_a_tool_the_env_lacks_are_a_warning_and_the_runs_own_are_not_given_to_such_envs(tmp_path):
    """search_options to ARPO-Math-v0 (python alone), sandbox_options to a QA env without python: passed over in
    silence, as if the tool were on. The commands' own (the output folder hidden from the sandbox) are not given
    where there is no sandbox, so that a run warns only of the user's."""
    import warnings

    import arpo_env.tools
    from arpo_algo.environments import hide_from_sandbox

    arpo_env.tools.registry._WARNED.clear()  # said once a process
    for env_id, kwargs, words in [
            ("ARPO-Math-v0", {"search_options": {"top_k": 3}}, "search_options given, but the env has no tool they "
                                                               "are for (its tools: python): not used"),
            ("ARPO-QA-v0", {"tools": "search", "sandbox": "e2b", "sandbox_options": {"timeout_s": 5}},
             "sandbox and sandbox_options given, but the env has no tool they are for (its tools: search)"),
            ("ARPO-Math-v0", {"tools": (), "browse_options": {"live": False}}, "(its tools: none)")]:
        with pytest.warns(UserWarning, match=re.escape(words)):
            gym.make(env_id, **kwargs).close()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gym.make(env_id, **kwargs).close()  # once
    for env_id, kwargs in [("ARPO-Math-v0", {"tools": "search", "search_options": {"top_k": 3}}),
                           ("ARPO-QA-v0", {"tools": ["search"]}), ("ARPO-Math-v0", {}),
                           ("ARPO-QA-v0", {"tools": None})]:
        given = hide_from_sandbox(env_id, kwargs, str(tmp_path / "run"))
        assert ("sandbox_options" in given) == (kwargs.get("tools") is None)  # the default tools have python
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            gym.make(env_id, **given).close()


def test_a_sandbox_path_or_module_given_as_one_string_is_one(tmp_path):
    """``hidden_paths: /srv/answers`` (a recipe's one path) was read letter by letter: the path was not hidden. A
    number there, or for preload, was a TypeError that gym wrapped with every keyword argument of the env."""
    secret = tmp_path / "answers"
    secret.mkdir()
    (secret / "gold.txt").write_text("the gold answer")  # words no temporary folder's name holds (pytest-42 did)
    env = gym.make("ARPO-Math-v0", dataset="arithmetic", sandbox_options={"hidden_paths": str(secret),
                                                                          "preload": "colorsys"})
    import arpo_env.tools.sandbox.host as sandbox

    try:
        env.reset(seed=0)
        observation = env.step(f"<python>print(open({str(secret / 'gold.txt')!r}).read())</python>")[0]
        assert "is hidden from the sandbox" in observation and "the gold answer" not in observation
        imported = env.step("<python>import sys\nprint('colorsys' in sys.modules)</python>")[0]
        assert imported.endswith("True\n</result>\n")
    finally:
        env.close()
        sandbox._templates.pop(("colorsys",)).shutdown()  # the sandbox's tests count one template, pass or fail
    for options, words in [({"hidden_paths": 5}, "hidden_paths must be a path or a list of paths, not int '5'"),
                           ({"preload": [1]}, "preload must be a module's name or a list of them, not list '[1]'")]:
        with pytest.raises(ValueError, match=re.escape(f"sandbox_options: {words}")):
            gym.make("ARPO-Math-v0", sandbox_options=options)


def test_e2b_options_are_checked_when_the_env_is_made():
    """An option E2B's sandbox does not take was its TypeError, which gym wrapped with every argument of the env; a
    timeout of text made an env whose every call failed (checked before the key and the package: none here)."""
    for options, words in [
            ({"api_key": "k", "timeout": 5}, "unknown timeout (did you mean timeout_s?); the options are api_key"),
            ({"timeout_s": "5", "sandbox_lifetime_s": 0}, "timeout_s must be a number of seconds above 0 and at most "
             "100,000,000, not '5'; sandbox_lifetime_s must be a whole number of at least 1")]:
        with pytest.raises(ValueError, match=re.escape(f"sandbox_options: {words}")):
            gym.make("ARPO-Math-v0", sandbox="e2b", sandbox_options=options)


def test_render_shows_control_characters_as_escapes_not_to_the_terminal(capsys):
    """What the model and its tools write reaches the terminal in "human" mode: an escape sequence cleared the screen,
    a carriage return wrote over a line, a bidirectional override reversed what followed."""
    env = gym.make("ARPO-Math-v0", render_mode="human", sandbox_options={"timeout_s": 5})
    env.reset(options=Q)
    env.step("<python>print('\\x1b[2J\\x1b]0;pwned\\x07' + 'a\\rb')</python>")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert "\\x1b[2J\\x1b]0;pwned\\x07a\\rb" in out  # the result, as escapes
    env.step("Let me think.\u202e <answer>\\boxed{408}</answer>")
    out = capsys.readouterr().out
    assert "\u202e" not in out and "think.\\u202e <answer>" in out and "\n[assistant]\n" in out
    env.close()
    ansi = gym.make("ARPO-Math-v0", render_mode="ansi")
    ansi.reset(options={"question": "Say \x1b[31mred", "answer": "1"})
    assert "Say \\x1b[31mred" in ansi.render() and "\x1b" not in ansi.render()
    ansi.close()
