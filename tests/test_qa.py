"""QA scoring on tricky cases and real records; the QA and deep-search environments and their data."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest

import arpo_env  # noqa: F401
from arpo_env import qa_metrics as qm
from arpo_env import rewards
from arpo_env.datasets import DataNotFound, load_tasks


@pytest.mark.parametrize("pred, gold, f1, em", [
    ("The Eiffel Tower", "eiffel tower", 1.0, 1.0),               # articles and case
    ("Eiffel Tower!", "the Eiffel tower.", 1.0, 1.0),             # punctuation
    ("the tower in Paris", "Eiffel Tower", 0.4, 0.0),             # tokens: tower / paris,in ; 1 common of 3 and 2
    ("yes", "no", 0.0, 0.0),
    ("New York City", "New York", 0.8, 0.0),
    ("北京大学", "北京", 2 / 3, 0.0),                               # character level for Chinese
    ("161.27元", "161.27元", 1.0, 1.0),
])
def test_f1_em_hand_computed(pred, gold, f1, em):
    assert qm.f1_score(pred, gold) == pytest.approx(f1)
    assert qm.exact_match(pred, gold) == em


def test_aliases_take_the_best():
    assert qm.best_f1("NYC", ["New York City", "NYC"]) == 1.0
    assert qm.best_em("new york", ["New York City", "New York"]) == 1.0
    assert qm.best_f1(None, ["x"]) == 0.0


@pytest.mark.parametrize("pred, score", [("D", 1.0), ("(D)", 1.0), ("D. Non-elitism", 1.0), ("Answer: d", 1.0),
                                         ("C", 0.0), ("Dominance", 0.0)])
def test_multiple_choice_compares_letters(pred, score):
    assert qm.qa_score(pred, "D", {"answer_type": "multipleChoice"}) == score


@pytest.mark.parametrize("name", ["hotpotqa", "2wiki", "musique", "bamboogle", "webwalker", "SimpleQA", "xbench",
                                  "gaia", "hle"])
def test_scoring_real_records(data_dir, name):
    tasks = load_tasks(name, data_dir / "eval", kind="qa")
    for task in tasks[:10]:
        gold = task.answer if isinstance(task.answer, str) else task.answer[0]
        meta = {**task.meta, "question": task.question}
        completion = f"<search>q</search><result>\nr\n</result><answer>\\boxed{{{gold}}}</answer>"
        reward = rewards.HierarchicalReward(qm.qa_score)(completion, task.answer, meta)
        assert reward.format_ok and reward.score == 1.0, (name, task.answer)
        assert rewards.qa_reward([""], [completion], answer=[task.answer],
                                 answer_type=[task.meta.get("answer_type")]) == [1.0]


def test_alias_lists_stored_as_text_are_parsed(data_dir):
    (task,) = load_tasks("SimpleQA", data_dir / "eval", limit=1)
    assert task.answer == ["Michio Sugeno"]


def test_mixed_reward_dispatches_on_ability():
    math_c = "<answer>\\boxed{\\frac{1}{2}}</answer>"
    qa_c = "<answer>\\boxed{Vienna, Austria}</answer>"
    assert rewards.arpo_reward(["", ""], [math_c, qa_c], ability=["math", "qa"], answer=["0.5", "Vienna"]) == \
        [1.0, pytest.approx(2 / 3)]


def test_judge_falls_back_to_f1_when_unreachable():
    judge = qm.LLMJudge("http://127.0.0.1:9", timeout_s=1)
    assert judge("Eiffel Tower", ["Eiffel Tower"], {"question": "q"}) == 1.0 and judge.fallbacks == 1


@pytest.mark.parametrize("name, kind, n", [("train", "qa", 5000), ("hard_search", "qa", 1071),
                                           ("valid", "qa", 80)])
def test_training_files(data_dir, name, kind, n):
    tasks = load_tasks(name, data_dir, kind=kind)
    assert len(tasks) == n and all(t.question for t in tasks)


def test_gaia_without_a_data_dir_says_where(monkeypatch):
    monkeypatch.delenv("ARPO_DATA_DIR", raising=False)
    with pytest.raises(DataNotFound, match="data_dir"):
        gym.make("ARPO-DeepSearch-v0", dataset="gaia")


@pytest.mark.parametrize("env_id", ["ARPO-QA-v0", "ARPO-DeepSearch-v0"])
def test_qa_envs_fork_and_snapshot(env_id):
    env = gym.make(env_id, search_options={"cache": False})
    env.reset(seed=0)
    env.step("<python>hops = 2</python>")
    env.step("<search>Ottoman Empire Vienna</search>")
    child = env.unwrapped.fork()
    child.step("<python>hops = 5</python>")
    assert "2" in env.unwrapped.step("<python>hops</python>")[0]
    other = gym.make(env_id, search_options={"cache": False})
    other.unwrapped.restore(pickle.loads(pickle.dumps(child.snapshot())))
    assert "5" in other.unwrapped.step("<python>hops</python>")[0]
    assert other.unwrapped.state.tool_calls == {"python": 3, "search": 1}
    for e in (env, child, other):
        e.close()


def test_deepsearch_default_budget():
    env = gym.make("ARPO-DeepSearch-v0")
    assert env.unwrapped.max_tool_calls == 10 and set(env.unwrapped.tool_factories) == {"search", "browse", "python"}
    env.close()
