"""TRL's multi-turn API on arpo environments: the adapter's tools and reward, and TRL's own GRPOTrainer training
with ``environment_factory`` on a tiny model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from arpo_env.integrations.trl_dataset import task_dataset
from arpo_env.integrations.trl_environment import environment_factory


def test_adapter_plays_an_episode_with_tools_and_reward():
    make = environment_factory("ARPO-Math-v0", max_tool_calls=3)
    env = make()
    intro = env.reset(question="What is 6 * 7?", answer="42", prompt=[{"role": "user", "content": "ignored"}])
    assert "`python`" in intro and "`answer`" in intro and env.env.state.task.question == "What is 6 * 7?"
    assert env.python(code="x = 6 * 7\nprint(x)") == "42"
    assert env.python(code="print(x + 1)") == "43"  # the interpreter keeps its state between calls
    assert env.python("print(x - 1)").startswith("41\n(That was your last tool call")  # positional; budget 3
    for wrong in ({"script": "print(1)"}, {"code": "print(1)", "extra": 1}, {}):
        try:  # TRL hands the model the message of what a tool raises
            env.python(**wrong)
            raise AssertionError(f"python(**{wrong}) was accepted")
        except TypeError as exc:
            assert "python() takes one argument, 'code'" in str(exc)
    assert env.get_reward() == -1.0  # nothing submitted yet: the format gate
    assert env.answer(final_answer="42") == "Answer received."
    assert env.get_reward() == 1.0
    assert "ended" in env.python(code="print(1)")
    env.reset(question="2+2?", answer="4")
    env.answer(final_answer="5")
    assert env.get_reward() == 0.0
    env.env.close()


def test_rows_are_read_as_dataset_files_are_and_rows_without_a_gold_are_refused():
    """`row_task` read only ``answer`` (or a MATH ``solution`` whole) and ``question`` (else ``prompt``'s last
    message): a row with its gold in ``ground_truth``, ``final_answer`` or ``reward_model.ground_truth`` (the verl
    layout) played against no gold at all, every answer scored 0, silently; a ``problem`` row was a KeyError, a
    worked solution was compared whole, a prompt ending in an assistant turn asked that turn."""
    env = environment_factory("ARPO-Math-v0")()
    solution = "Since $2+2=4$, the answer is $\\boxed{4}$."
    rows = [{"problem": "What is 2+2?", "solution": solution}, {"question": "What is 2+2?", "solution": solution},
            {"prompt": [{"role": "user", "content": "What is 2+2?"}], "reward_model": {"ground_truth": "4"}},
            {"question": "What is 2+2?", "ground_truth": "4"}, {"question": "What is 2+2?", "final_answer": 4.0},
            {"question": "What is 2+2?", "answer": "", "ground_truth": "4"},
            {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
                        {"role": "assistant", "content": "Let me see."}], "answer": "4"}]
    for row in rows:
        env.reset(**row)
        assert (env.env.state.task.question, env.env.state.task.answer) == ("What is 2+2?", "4"), row
        env.answer(final_answer="4")
        assert env.get_reward() == 1.0, row
    refused = [({"question": "What is 2+2?"}, "a dataset row needs a gold answer (answer, "),
               ({"question": "What is 2+2?", "answer": None}, "a dataset row's gold answer is blank (''): no answer"),
               ({"question": "What is 2+2?", "answer": " "}, "a dataset row's gold answer is blank (' ')"),
               ({"text": "What is 2+2?", "answer": "4"}, "a dataset row needs a question (a text field question, "),
               ({"question": "What is 2+2?", "answer": "4", "meta": "Level 5"}, "row's meta is a JSON object")]
    for row, words in refused:
        with pytest.raises(ValueError, match=re.escape(words)):
            env.reset(**row)
    env.env.close()


def test_arguments_that_would_break_the_text_protocol_are_refused_with_a_message():
    """A JSON tool call's code may hold '</python>' (HTML, XML written by the code): wrapped as <python>…</python>, it
    ended the call early, ran the rest as garbage, and broke the completion's format, so that the reward was −1
    whatever the answer. So did an answer whose braces end \\boxed{} early."""
    env = environment_factory("ARPO-Math-v0", max_tool_calls=3)()
    env.reset(question="What is 6 * 7?", answer="42")
    for call, words in [(lambda: env.python(code='print("</python>")'), "python(): the code cannot hold the text "
                                                                         "'</python>' here"),
                        (lambda: env.answer(final_answer="42}"), "braces { } in final_answer do not balance"),
                        (lambda: env.answer(final_answer="{42"), "do not balance"),
                        (lambda: env.answer(final_answer="42</answer>"), "cannot hold the text '</answer>'")]:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert env.python(code='print("<" + "/python>")') == "</python>"  # not counted: the budget is whole
    assert env.env.state.budget_used == 1 and not env.done
    assert env.answer(final_answer="\\frac{84}{2}") == "Answer received."
    assert env.get_reward() == 1.0 and not env.env.score().errors
    env.env.close()


def test_the_tools_are_the_envs_own_with_schemas():
    from transformers.utils import get_json_schema

    qa = environment_factory("ARPO-QA-v0")()
    names = {n for n in dir(type(qa)) if not n.startswith("_") and n not in ("reset", "get_reward")}
    assert names == {"python", "search", "answer"}
    schema = get_json_schema(type(qa).search)
    assert schema["function"]["name"] == "search" and "query" in schema["function"]["parameters"]["properties"]
    qa.reset(question="Capital of France?", answer=json.dumps(["Paris"]), kind="qa")
    found = qa.search(query="capital of France")  # a real BM25 search over the shipped corpus
    assert found.startswith("1.") and "France" in found and "<result>" not in found
    qa.answer(final_answer="Paris")
    assert qa.get_reward() == 1.0
    qa.env.close()


def test_task_dataset_takes_the_first_tasks_and_refuses_a_limit_of_no_task():
    """`limit=0` gave every task and `limit=-1` all but the last (``arpo train --train_limit``): a slice, unchecked."""
    assert task_dataset("ARPO-Math-v0", limit=2)["question"] == task_dataset("ARPO-Math-v0")["question"][:2]
    from arpo_env.datasets.loaders import load_tasks

    assert len(load_tasks("default", limit=3)) == 3 and len(load_tasks("arithmetic:10:0", limit=3)) == 3
    assert len(load_tasks("default", limit=np.int64(2))) == 2  # numpy's whole numbers too
    for limit in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="limit must be a whole number of tasks, at least 1"):
            task_dataset("ARPO-Math-v0", limit=limit)
        with pytest.raises(ValueError, match="limit must be a whole number of tasks, at least 1"):
            load_tasks("default", limit=limit)  # 0 gave one task from a file, none from a generated family


@pytest.mark.filterwarnings("ignore:You are using 'environment_factory', which is an experimental feature")
@pytest.mark.slow
def test_trl_grpo_trainer_trains_with_the_adapter(tokenizer, undecided, tmp_path):
    import copy

    import trl
    from tiny_agent import no_checkpointing
    from trl import GRPOConfig, GRPOTrainer

    tok = copy.deepcopy(tokenizer)  # SmolLM2's vocabulary has Qwen's <|im_start|> tokens: use Qwen3's tool template
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    data = task_dataset("ARPO-Math-v0", limit=4)
    args = GRPOConfig(str(tmp_path / "run"), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      max_completion_length=24, learning_rate=1e-3, report_to="none", use_cpu=True, bf16=False,
                      logging_steps=1, save_strategy="no", max_tool_calling_iterations=2, **no_checkpointing())
    trainer = GRPOTrainer(model=copy.deepcopy(undecided), args=args, train_dataset=data, processing_class=tok,
                          environment_factory=environment_factory("ARPO-Math-v0", max_tool_calls=2))
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "loss" in h]
    assert math.isfinite(log["loss"])
    assert any(k.startswith("rewards/ARPOEnvironment") for k in log)  # the env's reward came through get_reward
    questions = {row["question"] for row in data}
    pool = [e for envs in trainer._environment_pool.values() for e in envs]
    assert pool and all(e.env.state.task.question in questions for e in pool)  # the row reached reset
